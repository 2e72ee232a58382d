"""Activation checkpointing, reentrant (the old default)."""
from torch.utils.checkpoint import checkpoint

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return self.head(x)


torch.manual_seed(0)
X = torch.randn(32, 8, requires_grad=True)
y = torch.randn(32, 1)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for _ in range(8):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.6f}")
