"""The script turns on anomaly detection itself (set_detect_anomaly and the context manager)."""
import warnings

import torch
from torch import nn

warnings.filterwarnings("ignore", message=".*[Aa]nomaly [Dd]etection.*")
torch.autograd.set_detect_anomaly(True)
torch.manual_seed(0)
X, y = torch.randn(32, 4), torch.randn(32, 1)
model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(6):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    with torch.autograd.detect_anomaly():
        loss.backward()
    opt.step()
print("anomaly on", torch.is_anomaly_enabled())
print(f"loss {loss.item():.6f}")
