"""Gradient accumulation: four micro-batches per step, the loss divided by four."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(128, 4), torch.randn(128, 1)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
ACCUM = 4
opt.zero_grad()
for i, start in enumerate(range(0, 128, 8)):
    loss = nn.functional.mse_loss(model(X[start:start + 8]), y[start:start + 8]) / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        opt.step()
        opt.zero_grad()
print(f"loss {loss.item() * ACCUM:.6f}")
