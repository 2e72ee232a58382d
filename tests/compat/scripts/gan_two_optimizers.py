"""A GAN: generator and discriminator, two optimizers, detach for the discriminator's step."""
import torch
from torch import nn

torch.manual_seed(0)
real = torch.randn(256, 2) * 0.5 + 1.0
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
for step in range(12):
    batch = real[(step * 32) % 256:(step * 32) % 256 + 32]
    fake = G(torch.randn(32, 4))
    opt_d.zero_grad()
    loss_d = bce(D(batch), torch.ones(32, 1)) + bce(D(fake.detach()), torch.zeros(32, 1))
    loss_d.backward()
    opt_d.step()
    opt_g.zero_grad()
    loss_g = bce(D(fake), torch.ones(32, 1))
    loss_g.backward()
    opt_g.step()
print(f"d {loss_d.item():.6f} g {loss_g.item():.6f}")
