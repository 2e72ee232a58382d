"""Minibatch SGD on clean regression data, except dataset row 700 whose feature 1 is 3e19
(a sensor's error code stored as a reading).

The loss descends for many updates; the batch with row 700 overflows the squared error at once.
"""

import os

from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "extreme_batch"
BAD_ROWS = [700]

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(800, 5)
y = X @ torch.tensor([[1.0], [-2.0], [0.5], [0.0], [1.5]]) + 0.1 * torch.randn(800, 1)
X[700, 1] = 3e19  # a sensor wrote its error code
loader = DataLoader(TensorDataset(X, y), batch_size=10, shuffle=False)
model = nn.Linear(5, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for xb, yb in loader:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
