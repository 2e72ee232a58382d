"""Mixed precision on CPU with ``torch.autocast(dtype=torch.float16)``: a model whose head
computes a rate with ``torch.exp`` (a Poisson regression). As the rates grow, exp of the score
passes 11.1 (rate 65504) for the busiest rows and overflows float16; float32 would be fine
up to 88.
"""

import os

import torch
from torch import nn

CAUSE = "fp16_overflow"


class Rate(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return torch.exp(self.body(x).to(torch.float16))


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(256, 6)
counts = torch.poisson(torch.exp(9.0 + X[:, :1]))
model = Rate()
opt = torch.optim.Adam(model.parameters(), lr=0.05)
for _step in range(300):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        rate = model(X)
    loss = (rate.float() - counts * torch.log(rate.float())).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
