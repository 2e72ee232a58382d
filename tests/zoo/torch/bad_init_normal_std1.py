"""A 20-layer tanh-free (leaky ReLU) network initialised with ``nn.init.normal_(w, std=1.0)`` on
256-wide layers: 16 times the 1/sqrt(fan_in) scale. The activations grow 16x per layer and the
first loss is already non-finite.
"""

import os

import torch
from torch import nn

CAUSE = "bad_initialization"


class Deep(nn.Module):
    def __init__(self, depth=20, width=256):
        super().__init__()
        self.inp = nn.Linear(10, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.out = nn.Linear(width, 3)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=1.0)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = nn.functional.leaky_relu(block(h))
        return self.out(h)


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(64, 10)
y = torch.randint(0, 3, (64,))
model = Deep()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(10):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X), y)
    loss.backward()
    opt.step()
print("done", loss.item())
