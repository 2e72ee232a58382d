"""bf16 autocast on CPU for the forward and the loss; float32 weights."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for _ in range(10):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(X)
        loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    opt.step()
print("dtype", logits.dtype)
print(f"loss {loss.item():.4f}")
