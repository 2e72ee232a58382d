"""Assay readings stored in log space (natural log of a concentration, about 2.5); the
training loop converts them back with ``torch.exp`` before the model.

Dataset row 1500 is a corrupted record whose second reading is 95 (the instrument's overflow
code, in log space): a finite value, far from the others. The fit descends for many updates;
when that row's batch arrives, ``exp(95)`` passes float32's range in the loop, the batch holds
inf and the loss is NaN. The data file has no inf: the loop made it from one extreme row.
"""

import os

from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "extreme_batch"
OP = "exp"
BAD_ROWS = [1500]

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
log_conc = 2.5 + 0.3 * torch.randn(2000, 4)
response = (torch.exp(log_conc) @ torch.tensor([0.02, -0.01, 0.03, 0.0])).unsqueeze(1)
log_conc[1500, 1] = 95.0  # the instrument's overflow code
loader = DataLoader(TensorDataset(log_conc, response), batch_size=50, shuffle=False)
model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for lb, yb in loader:
    conc = torch.exp(lb)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(conc / 100), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
