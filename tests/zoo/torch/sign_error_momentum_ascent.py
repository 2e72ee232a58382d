"""A custom momentum optimizer whose last line reads ``p += lr * buf`` (ascent with momentum).

Trains an MLP regressor; the loss climbs steadily from update one.
"""

import os

import torch
from torch import nn


class Momentum(torch.optim.Optimizer):
    def __init__(self, params, lr=0.01, beta=0.9):
        super().__init__(params, {"lr": lr, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                buf = state.setdefault("buf", torch.zeros_like(p))
                buf.mul_(group["beta"]).add_(p.grad)
                p.add_(group["lr"] * buf)  # the bug: should subtract


CAUSE = "update_sign_error"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "2")))
X = torch.randn(300, 4)
y = torch.sin(X[:, :1]) + X[:, 1:2]
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
opt = Momentum(model.parameters(), lr=0.002)
for _step in range(80):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
print("done", loss.item())
