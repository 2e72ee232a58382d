"""A 1-D signal classifier that standardises each trace inside its forward, by hand and
without an epsilon: ``(x - x.mean(-1)) / x.std(-1)``.

Vibration traces of 64 samples; a few machines were switched off for part of the recording and
their sensor reports a flat line at its idle level. The first such trace arrives in batch 23:
its standard deviation is exactly 0, the division makes 0/0 = NaN in the model's forward and
the loss is NaN. The data is finite (a flat line is a valid reading); ``x.std() + 1e-5`` or
``nn.LayerNorm`` (which has an eps) is the fix.
"""

import os

import torch
from torch import nn

CAUSE = "zero_division"
OP = "div"
MODULE = "TraceNet"


class TraceNet(nn.Module):
    def __init__(self, length=64, classes=3):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2), nn.ReLU(),
                                  nn.Conv1d(8, 8, 5, padding=2), nn.ReLU())
        self.head = nn.Linear(8 * length, classes)

    def forward(self, x):
        x = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)
        h = self.conv(x.unsqueeze(1))
        return self.head(h.flatten(1))


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
n, length = 1024, 64
t = torch.linspace(0, 1, length)
y = torch.randint(0, 3, (n,))
freq = torch.tensor([3.0, 7.0, 13.0])[y]
X = 2.5 + torch.sin(2 * torch.pi * freq[:, None] * t) + 0.3 * torch.randn(n, length)
X[[737, 901]] = 2.5  # switched off: the sensor reports its idle level
model = TraceNet()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for i in range(0, n, 32):
    xb, yb = X[i : i + 32], y[i : i + 32]
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
