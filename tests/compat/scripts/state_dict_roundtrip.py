"""state_dict and load_state_dict round trip of model and optimizer through a file, mid-training."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 5), torch.randn(64, 1)
model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)


def train(n):
    for _ in range(n):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
    return loss.item()


print(f"first {train(6):.6f}")
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ckpt.pt")
print("keys", sorted(model.state_dict()))
ckpt = torch.load("ckpt.pt", weights_only=True)
model.load_state_dict(ckpt["model"])
opt.load_state_dict(ckpt["opt"])
print(f"resumed {train(6):.6f}")
