"""A heteroscedastic regression with GaussianNLLLoss: the loss goes negative as it learns."""
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(128, 2)
y = X[:, :1] * 2.0 + 0.05 * torch.randn(128, 1)
model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.02)
nll = nn.GaussianNLLLoss()
for _ in range(60):
    opt.zero_grad()
    out = model(X)
    loss = nll(out[:, :1], y, nn.functional.softplus(out[:, 1:]) + 1e-4)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f} negative {loss.item() < 0}")
