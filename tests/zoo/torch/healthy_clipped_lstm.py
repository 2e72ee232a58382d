"""A 2-layer LSTM on a noisy sine-prediction task with gradient clipping at norm 1.0 and Adam.

Clipping keeps the occasional large gradient bounded; the loss falls and stays down.
"""

import os

import torch
from torch import nn

CAUSE = "healthy"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(1, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.head(h[:, -1])


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for _step in range(120):
    t0 = torch.rand(16, 1) * 6.28
    t = t0 + torch.linspace(0, 3, 21)
    seq = torch.sin(t) + 0.05 * torch.randn_like(t)
    x, y = seq[:, :20].unsqueeze(-1), seq[:, 20:]
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
print("done", loss.item())
