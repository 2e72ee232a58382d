"""A Poisson-style rate model ``exp(linear(x))`` whose linear layer was initialised with
``normal_(std=30)``: the first forward's scores are in the hundreds and ``exp`` overflows to inf
from finite inputs at update 1. The log in the loss only propagates the inf. The producer is
``exp``, at the first update, from the initial weights.
"""

import torch
from torch import nn

CAUSE = "bad_initialization"
OP = "exp"
MODULE = "Rate"


class Rate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 1)
        nn.init.normal_(self.lin.weight, std=30.0)

    def forward(self, x):
        return torch.exp(self.lin(x))


torch.set_num_threads(1)
torch.manual_seed(0)
X = torch.randn(64, 16)
counts = torch.poisson(torch.full((64, 1), 3.0))
model = Rate()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _step in range(10):
    opt.zero_grad()
    rate = model(X)
    loss = (rate - counts * torch.log(rate)).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
