"""A 16-layer MLP whose author multiplied every initial weight by 100 ("to break symmetry").

Each layer scales the activations by ~40; on the very first batch they overflow float32 and the
first loss is inf, with clean inputs.
"""

import os

import torch
from torch import nn

CAUSE = "bad_initialization"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
layers = []
for _ in range(16):
    layers += [nn.Linear(64, 64), nn.ReLU()]
model = nn.Sequential(*layers, nn.Linear(64, 1))
with torch.no_grad():
    for p in model.parameters():
        p.mul_(100)
X = torch.randn(128, 64)
y = torch.randn(128, 1)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _step in range(20):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
print("done", loss.item())
