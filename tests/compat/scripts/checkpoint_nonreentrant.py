"""Activation checkpointing, non-reentrant (what large-model trainers use), dropout inside."""
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1),
                                nn.Linear(32, 16))

    def forward(self, x):
        return x + self.ff(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.tail = nn.Sequential(Block(), Block())
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        x = checkpoint_sequential(self.tail, 2, x, use_reentrant=False)
        return self.head(x)


torch.manual_seed(0)
X, y = torch.randn(32, 16), torch.randn(32, 1)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
for _ in range(8):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.6f}")
