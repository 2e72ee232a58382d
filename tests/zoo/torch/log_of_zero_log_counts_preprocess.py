"""Click-count features log-transformed in the training loop, ``torch.log(counts)``, to tame their
skew. The counts are whole numbers and one product has 0 clicks in the second feature: its log is
-inf, the first layer turns it into inf/NaN and the loss is NaN at the first update. The
data file is clean; the -inf is computed by the log (``log1p`` is the fix), not read.
"""

import torch
from torch import nn

CAUSE = "log_of_zero"
OP = "log"
LINT = False  # torch.log of counts is fine until a count is 0: the zero is in the data

torch.set_num_threads(1)
torch.manual_seed(0)
counts = torch.poisson(torch.full((256, 4), 40.0)) + 1.0
counts[7, 1] = 0.0  # a product nobody clicked yet, in the first batch
y = torch.randn(256, 1)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(8):
    xb, yb = counts[32 * step : 32 * (step + 1)], y[32 * step : 32 * (step + 1)]
    xb = torch.log(xb)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
