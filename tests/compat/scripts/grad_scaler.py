"""torch.amp.GradScaler with unscale_ and clip_grad_norm_ (on CPU the scaler still scales)."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 4), torch.randn(64, 1)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for _ in range(10):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
print(f"loss {loss.item():.6f} scale {scaler.get_scale():.1f}")
