"""A hand-written optimizer (an ``Optimizer`` subclass) that adds the gradient instead of
subtracting it: ``p.add_(grad, alpha=lr)``.

The loss of a logistic-regression model rises smoothly from the first update, no oscillation.
"""

import os

import torch
from torch import nn


class MySGD(torch.optim.Optimizer):
    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=group["lr"])  # the bug: should be -lr


CAUSE = "update_sign_error"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(400, 5)
y = (X[:, :1] - X[:, 1:2] > 0).float()
model = nn.Linear(5, 1)
opt = MySGD(model.parameters(), lr=0.1)
loss_fn = nn.BCEWithLogitsLoss()
for _step in range(60):
    opt.zero_grad()
    loss = loss_fn(model(X), y)
    loss.backward()
    opt.step()
print("done", loss.item())
