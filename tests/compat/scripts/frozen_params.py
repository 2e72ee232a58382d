"""Fine-tuning: a frozen backbone (requires_grad False, and left out of the optimizer), a head."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 6), torch.randint(0, 2, (64,))
backbone = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
head = nn.Linear(16, 2)
model = nn.Sequential(backbone, head)
backbone.requires_grad_(False)
opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
frozen = backbone[0].weight.clone()
for _ in range(10):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X), y)
    loss.backward()
    opt.step()
print("backbone unchanged", torch.equal(frozen, backbone[0].weight))
print(f"loss {loss.item():.6f}")
