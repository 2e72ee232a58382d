"""An MLP regression with SGD at lr 0.12 on targets of scale 10: the loss grows geometrically.

Every update overshoots the minimum further than the last; within a few dozen updates the loss
overflows. A tenfold smaller learning rate trains fine.
"""

import os

import torch
from torch import nn

CAUSE = "step_size_too_large"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(256, 8)
y = 10 * (X @ torch.randn(8, 1))
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.12)
for step in range(300):
    idx = torch.arange(step * 32, step * 32 + 32) % 256
    opt.zero_grad()
    loss = ((model(X[idx]) - y[idx]) ** 2).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
