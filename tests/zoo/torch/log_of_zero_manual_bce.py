"""Binary classification with a hand-written log loss on ``torch.sigmoid`` probabilities:
``-(y * log(p) + (1 - y) * log(1 - p))``.

The large learning rate makes the scores grow; one mislabelled example's sigmoid saturates to
exactly 1.0 in float32, ``log(1 - p)`` is -inf and the loss inf.
"""

import os

import torch
from torch import nn

CAUSE = "log_of_zero"
OP = "log"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "1")))
X = torch.randn(300, 6)
y = (X @ torch.randn(6, 1) > 0).float()
y[:3] = 1 - y[:3]
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.1)
for _step in range(500):
    opt.zero_grad()
    p = torch.sigmoid(model(X))
    loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
