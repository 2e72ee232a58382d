"""torch.jit.trace of the trained model (its check_trace compares against eager), then saved."""
import warnings

import torch
from torch import nn

warnings.filterwarnings("ignore", category=DeprecationWarning)
torch.manual_seed(0)
X, y = torch.randn(32, 4), torch.randn(32, 1)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(10):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
model.eval()
traced = torch.jit.trace(model, X[:4])
traced.save("traced.pt")
loaded = torch.jit.load("traced.pt")
print("same", torch.allclose(loaded(X), model(X)))
print(f"loss {loss.item():.6f}")
