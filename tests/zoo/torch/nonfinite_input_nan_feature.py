"""A CSV-like regression table with one missing value (NaN) in dataset row 137, column 2.

An MLP trained with Adam through a shuffled DataLoader: the loss descends until the batch that
holds row 137; that update's loss is NaN. nanscope must name the row of the dataset, not only of
the batch.
"""

import os

from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "nonfinite_input"
BAD_ROWS = [137]

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(512, 6)
y = X @ torch.randn(6, 1) + 0.1 * torch.randn(512, 1)
X[137, 2] = float("nan")
loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True,
                    generator=torch.Generator().manual_seed(1))
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.MSELoss()
for epoch in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
