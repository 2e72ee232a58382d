"""A WGAN-GP style gradient penalty: autograd.grad with create_graph, then a double backward."""
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(64, 3)
critic = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
for step in range(8):
    x = X[(step * 16) % 64:(step * 16) % 64 + 16].clone().requires_grad_(True)
    out = critic(x)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    penalty = ((g.norm(dim=1) - 1) ** 2).mean()
    loss = out.mean() + 10.0 * penalty
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss {loss.item():.6f} penalty {penalty.item():.6f}")
