"""An MLP classifier, SGD with momentum 0.9, linear learning-rate warm-up to a high peak (0.4),
then cosine decay.

Around the peak the loss spikes (dozens of updates jump 3x and more above the one before, up to
~2x the starting loss) and recovers each time; the run ends at ~0.06. Nothing is wrong; the
spike and departure detectors must not stop it. (At a peak of 0.8 this fit is not healthy: the
loss climbs from 0.69 to a plateau in the hundreds for 150 updates and ends near 10.)
"""

import math
import os

import torch
from torch import nn

CAUSE = "healthy"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(1024, 16)
y = (X[:, :4].sum(1) + 0.5 * torch.randn(1024) > 0).long()
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
total, warm, peak = 300, 60, 0.4
for step in range(total):
    lr = peak * step / warm if step < warm else peak * 0.5 * (1 + math.cos(
        math.pi * (step - warm) / (total - warm)))
    for g in opt.param_groups:
        g["lr"] = lr
    idx = torch.randint(0, 1024, (32,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
    loss.backward()
    opt.step()
print("done", loss.item())
