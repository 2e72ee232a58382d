"""Mixed precision on CPU: ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward of
an MLP regressor, float32 master weights, AdamW. bfloat16 has float32's range, so nothing
overflows; the loss falls.
"""

import os

import torch
from torch import nn

CAUSE = "healthy"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(512, 20)
y = X[:, :5].sum(1, keepdim=True) + 0.1 * torch.randn(512, 1)
model = nn.Sequential(nn.Linear(20, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                      nn.Linear(128, 1))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for _step in range(150):
    idx = torch.randint(0, 512, (64,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(X[idx])
    loss = nn.functional.mse_loss(out.float(), y[idx])
    loss.backward()
    opt.step()
print("done", loss.item())
