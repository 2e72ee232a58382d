"""Adam with ``eps=0`` (set "to be exact") on a model whose input column 4 is always 0 (a one-hot
slot no row uses). That column's weights get a gradient of exactly 0, so Adam's first step divides
``m / sqrt(v) = 0 / 0``: NaN weights, born in the optimizer's own arithmetic from finite gradients.
The forward, the loss and the backward of update 1 are clean; update 2 finds the weights NaN.
"""

import torch
from torch import nn

CAUSE = "zero_division"
OP = "addcdiv"

torch.set_num_threads(1)
torch.manual_seed(0)
X = torch.randn(64, 6)
X[:, 4] = 0.0  # an unused one-hot slot
y = X[:, :2].sum(1, keepdim=True)
model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=0.0)
for _step in range(10):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
print("done", loss.item())
