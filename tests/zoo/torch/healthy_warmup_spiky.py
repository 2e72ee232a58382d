"""An MLP classifier with linear learning-rate warm-up to a high peak, then cosine decay.

Around the peak the loss spikes (up to a few times its recent value) and recovers each time; the
run ends well. Nothing is wrong; the spike detector must not stop it.
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
total, warm, peak = 300, 60, 0.8
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
