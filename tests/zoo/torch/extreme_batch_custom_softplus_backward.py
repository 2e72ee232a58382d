"""A demand model whose positive output is a softplus written as a custom
``torch.autograd.Function``: the forward is the stable ``F.softplus``, the backward the textbook
derivative ``grad * exp(x) / (1 + exp(x))``. The loss is an expression in the training loop.

Store 1234's floor area was typed in the wrong unit (850 where the others are standardised): at
the batch holding it the score is several hundred. The forward stays finite (softplus of a large
score is the score), but the hand-written backward computes exp of it, inf / inf is NaN, and every
gradient is NaN. Leaving that row out, the same update is finite.
"""

import os

from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "extreme_batch"
OP = "SmoothReluBackward"
PHASE = "backward"
SOURCE_MARK = "SmoothRelu.apply"
MODULE = "DemandModel"
BAD_ROWS = [1234]


class SmoothRelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return nn.functional.softplus(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.exp(x) / (1 + torch.exp(x))  # the sigmoid, written out


class DemandModel(nn.Module):
    def __init__(self, features=6):
        super().__init__()
        self.linear = nn.Linear(features, 1)

    def forward(self, x):
        return SmoothRelu.apply(self.linear(x)).squeeze(-1)


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(2000, 6)
score = 1.0 + 0.5 * X[:, 0] - 0.3 * X[:, 2] + 0.8 * X[:, 3]
demand = nn.functional.softplus(score) + 0.1 * torch.randn(2000)
X[1234, 3] = 850.0  # floor area in the wrong unit
loader = DataLoader(TensorDataset(X, demand), batch_size=32, shuffle=False)
model = DemandModel()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for xb, yb in loader:
    opt.zero_grad()
    loss = ((model(xb) - yb) ** 2).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
