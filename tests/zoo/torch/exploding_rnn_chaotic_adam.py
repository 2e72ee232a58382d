"""A tanh ``nn.RNN`` in the chaotic regime (recurrent gain 3), trained with Adam on a length
curriculum, no gradient clipping.

tanh keeps every hidden state in [-1, 1], so the loss of the linear readout barely moves; but the
product of step Jacobians that back-propagation through time multiplies grows exponentially with
the sequence length. Adam's normalised step keeps the weights in place while the curriculum adds
25 steps per update, so the recurrent gradient climbs by orders of magnitude until it overflows
float32 — while the loss is still finite.
"""

import os

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.rnn = nn.RNN(2, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)
        with torch.no_grad():
            self.rnn.weight_hh_l0.normal_(0, 3.0 / hidden**0.5)
            self.rnn.weight_ih_l0.normal_(0, 0.5)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.head(h[:, -1])


CAUSE = "exploding_gradients"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "3")))
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(1, 200):
    length = 10 + 25 * step
    x = torch.randn(16, length, 2)
    y = x[:, -5:, 0].mean(1, keepdim=True)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print("done", loss.item())
