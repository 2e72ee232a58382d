"""torch.compile of the model (aot_eager: traces as the default backend does, no C compiler)."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(32, 4), torch.randn(32, 1)
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
compiled = torch.compile(model, backend="aot_eager")
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for _ in range(10):
    opt.zero_grad()
    loss = nn.functional.mse_loss(compiled(X), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.6f}")
