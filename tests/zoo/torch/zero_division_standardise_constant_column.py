"""Per-feature standardisation written in the training loop, ``(xb - xb.mean(0)) / xb.std(0)``, on
sensor data whose column 3 is a constant (a sensor that reports a fixed calibration value). Its
std is exactly 0 and its centred values are exactly 0: 0/0 fills column 3 with NaN in every row of
every batch. The data file is clean; the NaN is computed by the division, not read.
"""

import torch
from torch import nn

CAUSE = "zero_division"
OP = "div"

torch.set_num_threads(1)
torch.manual_seed(0)
X = torch.randn(320, 6)
X[:, 3] = 4.2
y = X[:, :2].sum(1, keepdim=True)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(10):
    xb, yb = X[32 * step : 32 * (step + 1)], y[32 * step : 32 * (step + 1)]
    xb = (xb - xb.mean(0)) / xb.std(0)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
