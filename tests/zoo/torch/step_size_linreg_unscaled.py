"""Linear regression on house data with an unscaled feature (square metres, ~100 times the others).

Full-batch SGD at lr 1e-3 would suit standardised features; the big column makes the curvature
10^4 times larger, so every update overshoots and the loss grows geometrically to inf.
"""

import os

import torch
from torch import nn

CAUSE = "step_size_too_large"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "1")))
n = 200
rooms = torch.randint(1, 6, (n, 1)).float()
area = 40 + 160 * torch.rand(n, 1)
age = 50 * torch.rand(n, 1)
X = torch.cat([rooms, area, age], 1)
y = 0.5 * rooms + 0.02 * area - 0.01 * age + 0.1 * torch.randn(n, 1)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _step in range(500):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
print("done", loss.item())
