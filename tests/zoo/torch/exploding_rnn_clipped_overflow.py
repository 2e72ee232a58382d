"""A tanh RNN at recurrent gain 2.5 on a length curriculum, with ``clip_grad_norm_(..., 1.0)``
before every SGD step (lr 1e-2).

Clipping keeps the exploding gradient from throwing the weights, so the recurrence stays chaotic
and the pre-clip gradient norm keeps climbing with the sequence length: 26 -> 1e4 -> 1e9 -> 3e18
in 16 updates. Then the float32 norm overflows to inf while every gradient element is still
finite (clip_grad_norm_ then scales the gradient by max_norm / inf = 0), and some updates later
the gradient elements themselves overflow: NaN. The script already clips, so the advice must not
be to clip; the evidence must tell the overflowed norm from a non-finite gradient element.
"""

import os

import torch
from torch import nn

CAUSE = "exploding_gradients"
ADVICE_NOT = "clip the gradient norm before"
EVIDENCE = "overflowed float32"


class Net(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.rnn = nn.RNN(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)
        with torch.no_grad():
            self.rnn.weight_hh_l0.normal_(0, 2.5 / hidden**0.5)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.head(h[:, -1])


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(60):
    length = 10 + 12 * step
    x = 0.5 * torch.randn(8, length, 1)
    y = x[:, :5, 0].sum(1, keepdim=True)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
print("done", loss.item())
