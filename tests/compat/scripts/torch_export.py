"""torch.export of the model after training, the exported program run and compared."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(32, 4), torch.randn(32, 1)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for _ in range(10):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
exported = torch.export.export(model.eval(), (X,))
with torch.no_grad():
    print("same", torch.allclose(exported.module()(X), model(X)))
print(f"loss {loss.item():.6f}")
