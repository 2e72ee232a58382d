"""Minibatch SGD on a linear regression, clean standardised data except one row whose feature
is 1e6 times the rest (a sensor that logged microvolts once), first drawn in minibatch 55.

For 54 updates the loss descends; that batch's squared residual is ~1e12 times the usual, its
gradient throws the weights ~1e9 away, and the next updates swing them back and forth while the
loss stays ~1e18: a spike the fit does not survive, not a step size that was too large (the
other rows train well at this lr). The update cosines are sampled on a climb only, so the
first rises of the swing have no measured direction: they must not count as oscillation.

The data are this one draw (the numpy twin's, ``extreme_batch_linreg_feature``), not
``ZOO_SEED``'s: with some other draws (seed 7) the swing after the spike grows for two more
updates and both the numpy and the torch paths call it a step size, a limit of the divergence
detector that this case does not hide.
"""

import os

import numpy as np
from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "extreme_batch"
BAD_ROWS = [913]
BATCH = 16

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
rng = np.random.default_rng(15)
n, d = 1600, 4
X = rng.standard_normal((n, d))
y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3 + 0.1 * rng.standard_normal(n)
X[913, 2] = 1.3e6  # the unit mix-up
order = rng.permutation(n)  # an epoch order in which row 913 is first drawn in minibatch 55
pos = int(np.flatnonzero(order == 913)[0])
order[[pos, 54 * BATCH + 9]] = order[[54 * BATCH + 9, pos]]
data = TensorDataset(torch.tensor(X), torch.tensor(y).reshape(-1, 1))
loader = DataLoader(data, batch_size=BATCH, sampler=order.tolist())
model = nn.Linear(d, 1).double()
nn.init.zeros_(model.weight)
nn.init.zeros_(model.bias)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step, (xb, yb) in enumerate(loader):
    if step == 80:
        break
    opt.zero_grad()
    loss = 0.5 * nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
