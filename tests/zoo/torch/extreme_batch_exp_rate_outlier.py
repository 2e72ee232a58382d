"""A Poisson regression of daily orders on store features (``nn.PoissonNLLLoss`` on the rate),
with the rate computed inside the model as ``torch.exp(score)``. The features are standardised,
except that store 1834's floor area was typed in square metres times 1000 (a unit error): 850
where the others are of order one.

The model fits for many updates; the batch holding that row gives it a score of several hundred
and ``exp`` overflows float32 (past 88.7) inside the model's forward: the rate is inf and the loss
NaN. Every other row is fine: leaving that one out, the same update is finite.
"""

import os

from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "extreme_batch"
OP = "exp"
MODULE = "OrdersModel"
BAD_ROWS = [1834]


class OrdersModel(nn.Module):
    def __init__(self, features=6):
        super().__init__()
        self.score = nn.Sequential(nn.Linear(features, 16), nn.Tanh(), nn.Linear(16, 1))
        self.floor = nn.Linear(features, 1, bias=False)  # a direct linear term

    def forward(self, x):
        return torch.exp(self.score(x) + self.floor(x)).squeeze(-1)


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(2400, 6)
orders = torch.poisson(torch.exp(2.0 + 0.4 * X[:, 0] - 0.3 * X[:, 2] + 0.8 * X[:, 3]))
X[1834, 3] = 850.0  # floor area in the wrong unit
loader = DataLoader(TensorDataset(X, orders), batch_size=40, shuffle=False)
model = OrdersModel()
loss_fn = nn.PoissonNLLLoss(log_input=False, full=True)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for xb, yb in loader:
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
