"""A float32 ``nn.Linear`` fit to targets it can represent exactly (no noise), minibatch SGD.

The loss falls from ~5 to the float32 noise floor in a couple of hundred updates and then bounces
between exact zeros, 3e-17 and 9e-15 from batch to batch: rounding, not growth (3e-17 -> 2e-15 is
a "60x rise" of nothing, and the zeros are not a broken loss). A converged fit: it must be
reported healthy, never stopped as a divergence.
"""

import os

import torch
from torch import nn

CAUSE = "healthy"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(256, 4)
y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.25
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(400):
    idx = torch.randint(0, 256, (8,))
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    loss.backward()
    opt.step()
    if step % 100 == 0:
        print(step, loss.item())
print("done", loss.item())
