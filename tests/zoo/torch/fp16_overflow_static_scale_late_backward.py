"""A regressor whose body runs in float16 (``.half()``) and returns its output cast to float32 for
the loss, trained with a hand-rolled *static* loss scale of 2**14 and no GradScaler; the loss is
an expression in the training loop.

For 18 updates the scaled gradient at the output stays below the float16 limit. The batch of
update 19 holds one large order (40 units where most are within a few of 0, a legitimate value):
its residual times the scale sends a float32 gradient of about 8e4 into the output, and the cast
back to float16 in the backward (the ``.float()`` of the forward) makes it inf. Nothing in the
forward or the loss is non-finite; in float32 the same update is finite.
"""

import os

import torch
from torch import nn

CAUSE = "fp16_overflow"
OP = "ToCopyBackward0"
PHASE = "backward"
SOURCE_MARK = ".float()"
MODULE = "Regressor"

LOSS_SCALE = 2.0**14


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).half()

    def forward(self, x):
        return self.body(x.half()).float().squeeze(-1)  # float16 body, float32 output


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
X = torch.randn(512, 8)
y = X[:, 0] - 0.5 * X[:, 1] + 0.1 * torch.randn(512)
y[300] = 40.0  # a large order
model = Regressor()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(32):
    xb, yb = X[16 * step : 16 * step + 16], y[16 * step : 16 * step + 16]
    opt.zero_grad()
    loss = ((model(xb) - yb) ** 2).mean()
    (loss * LOSS_SCALE).backward()
    for p in model.parameters():
        p.grad.div_(LOSS_SCALE)
    opt.step()
print("done", loss.item())
