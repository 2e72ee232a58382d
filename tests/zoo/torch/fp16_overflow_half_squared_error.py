"""A model and its squared-error loss run entirely in float16 (``.half()``), on targets in the
hundreds (prices in dollars): the prediction error is a few hundred, its square passes 65504 and is
inf in float16; in float32 it is about 1e5, finite. No GradScaler anywhere.
"""

import torch
from torch import nn

CAUSE = "fp16_overflow"
OP = "pow"

torch.set_num_threads(1)
torch.manual_seed(0)
X = torch.randn(256, 8).half()
y = (300 + 40 * torch.randn(256, 1)).half()
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).half()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
for _step in range(10):
    opt.zero_grad()
    pred = model(X)
    loss = ((pred - y) ** 2).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
