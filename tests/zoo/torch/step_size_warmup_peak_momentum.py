"""The MLP classifier of ``healthy_warmup_spiky`` (SGD, momentum 0.9, warm-up then cosine decay)
with a peak learning rate of 0.8 instead of 0.4.

As the warm-up passes ~0.5 the spikes stop recovering: the loss leaves its range (best ~0.02,
start 0.69) and settles on a plateau 10-300x above where it started, with no NaN and no steady
geometric growth. nanscope stops it on that plateau: the peak learning rate is the one to cut.
"""

import math
import os

import torch
from torch import nn

CAUSE = "step_size_too_large"

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
