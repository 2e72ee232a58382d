"""Targets read from a sensor log where one reading overflowed to inf (dataset row 41).

A small classifier-regressor trained with SGD and an L1 loss, sequential batches: the batch that
holds row 41 has an infinite target, and its loss is inf at once, with no growth before it.
"""

import os

from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "nonfinite_input"
BAD_ROWS = [41]

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "3")))
X = torch.randn(256, 4)
y = (X.sum(1, keepdim=True) > 0).float() * 3.0
y[41, 0] = float("inf")
loader = DataLoader(TensorDataset(X, y), batch_size=16, shuffle=False)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
loss_fn = nn.L1Loss()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for xb, yb in loader:
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
