"""A siamese encoder trained on pairs with a contrastive loss whose distance is written as
``torch.sqrt(((a - b) ** 2).sum(-1))`` inside the model.

Some pairs are the same image twice (a data-augmentation bug with probability 0): their distance
is exactly 0. The forward is finite, but the gradient of sqrt at 0 is infinite, 0 * inf is NaN,
and every weight's gradient is NaN.
"""

import os

import torch
from torch import nn

CAUSE = "zero_division"
OP = "SqrtBackward0"
MODULE = "Siamese"


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, a, b):
        return torch.sqrt(((self.enc(a) - self.enc(b)) ** 2).sum(-1))


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
model = Siamese()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(50):
    a = torch.randn(16, 12)
    b = a + 0.3 * torch.randn(16, 12)
    same = torch.rand(16) < 0.5
    if step >= 12:
        b[0] = a[0]  # the augmentation returned the same view
    target = (~same).float() * 2.0
    opt.zero_grad()
    d = model(a, b)
    loss = ((d - target) ** 2).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
