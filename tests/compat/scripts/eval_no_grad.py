"""Validation every epoch under no_grad and under inference_mode, train/eval switches."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(96, 6), torch.randint(0, 3, (96,))
Xv, yv = torch.randn(32, 6), torch.randint(0, 3, (32,))
model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(3):
    model.train()
    for i in range(0, 96, 32):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 32]), y[i:i + 32])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val = nn.functional.cross_entropy(model(Xv), yv).item()
    with torch.inference_mode():
        acc = (model(Xv).argmax(1) == yv).float().mean().item()
    print(f"epoch {epoch} val {val:.6f} acc {acc:.4f}")
