"""Basket amounts log-transformed in the training loop (``torch.log(amounts)``) before a
spend model, read through a DataLoader. The first 60 batches hold only paid baskets; dataset row
3111 is a basket paid entirely with a voucher: amount 0.00, a valid record. The log of it is
-inf at update 63, the loss is NaN. The data is finite: the loop's log made the -inf (``log1p``
is the fix), and nanscope sees it only by re-evaluating the loop's lines of that update.
"""

import os

from torch.utils.data import DataLoader, TensorDataset

import torch
from torch import nn

CAUSE = "log_of_zero"
OP = "log"
LINT = False  # torch.log of amounts is fine until an amount is 0: the zero is in the data

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
amounts = torch.exp(3.0 + 0.7 * torch.randn(4000, 3))
repeat = (0.4 * torch.log(amounts[:, :1]) + 0.1 * torch.randn(4000, 1) > 1.2).float()
amounts[3111, 2] = 0.0  # paid with a voucher
loader = DataLoader(TensorDataset(amounts, repeat), batch_size=50, shuffle=False)
model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1))
loss_fn = nn.BCEWithLogitsLoss()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for basket, label in loader:
    features = torch.log(basket)
    opt.zero_grad()
    loss = loss_fn(model(features), label)
    loss.backward()
    opt.step()
print("done", loss.item())
