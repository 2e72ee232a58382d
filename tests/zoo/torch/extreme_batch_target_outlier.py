"""A DataLoader over sales data; dataset row 333 has a target of 3e19 (a missing-value
sentinel; the rest are of order one). The MLP descends for many updates, then that batch
blows it up.
"""

import os

from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "extreme_batch"
BAD_ROWS = [333]

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "5")))
X = torch.randn(480, 3)
y = (X[:, :1] * 2 - X[:, 2:3]).clone()
y[333, 0] = 3e19  # the sentinel for a missing reading
loader = DataLoader(TensorDataset(X, y), batch_size=8, shuffle=False)
model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1))
loss_fn = nn.MSELoss()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
print("done", loss.item())
