"""A model cast to half precision with ``.half()`` on raw (unstandardised) sensor readings of a
few hundred. The activations are in the thousands; the first backward multiplies them by
the output error and the weight gradient of the last layer passes 65504: inf in float16, fine in
float32.
"""

import os

import torch
from torch import nn

CAUSE = "fp16_overflow"
MODULE = "4"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = (300 + 100 * torch.randn(128, 32)).half()
y = torch.randn(128, 1).half()
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 1)).half()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
for _step in range(20):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
print("done", loss.item())
