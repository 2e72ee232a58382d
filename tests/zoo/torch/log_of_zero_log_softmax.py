"""A linear classifier on raw pixel intensities (0..255, not scaled to 0..1) whose loss is
``-torch.log(torch.softmax(logits, 1))[target]`` instead of ``cross_entropy(logits, target)``.

The unscaled inputs make logits of several hundred from the first update; softmax rounds the
true class's probability of some rows to exactly 0 and the log is -inf.
"""

import os

import torch
from torch import nn

CAUSE = "log_of_zero"
OP = "log"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randint(0, 256, (128, 64)).float()
y = torch.randint(0, 10, (128,))
model = nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
for _step in range(30):
    opt.zero_grad()
    p = torch.softmax(model(X), dim=1)
    loss = -torch.log(p[torch.arange(len(y)), y]).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
