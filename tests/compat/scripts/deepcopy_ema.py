"""An EMA teacher made with copy.deepcopy after a warm-up, updated by hand after every step; a
shallow copy.copy of the model evaluated too."""
import copy

import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 4), torch.randn(64, 1)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ema = None
for step in range(12):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
    if ema is None and step == 4:
        ema = copy.deepcopy(model)
        ema.requires_grad_(False)
    if ema is None:
        continue
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
print("ema hooks", len(ema._forward_hooks), len(ema._forward_pre_hooks))
shallow = copy.copy(model)
print("shallow hooks", len(shallow._forward_hooks), len(shallow._forward_pre_hooks))
with torch.no_grad():
    print(f"ema loss {nn.functional.mse_loss(ema(X), y).item():.6f}")
print(f"loss {loss.item():.6f}")
