"""Whole-model torch.save after each epoch, then torch.load of it (weights_only, safe_globals)."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 4), torch.randn(64, 1)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for i in range(0, 64, 16):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X[i:i + 16]), y[i:i + 16])
        loss.backward()
        opt.step()
    with open("model.pt", "wb") as f:
        torch.save(model, f)
    print(f"epoch {epoch} loss {loss.item():.6f}")
with open("model.pt", "rb") as f, torch.serialization.safe_globals([nn.Sequential, nn.Linear,
                                                                   nn.Tanh]):
    loaded = torch.load(f)
print("hooks", len(loaded._forward_hooks), len(loaded._forward_pre_hooks))
print("same", torch.equal(loaded(X), model(X)))
