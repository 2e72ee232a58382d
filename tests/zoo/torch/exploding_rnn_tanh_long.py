"""A tanh RNN (``nn.RNN``) with a large recurrent gain (weights ~ N(0, 2.5^2 / hidden)), trained
with SGD on sequences that get longer every update (a length curriculum), no gradient clipping.

tanh keeps the hidden state, and so the loss, bounded; but the recurrent Jacobian's product over
the sequence is chaotic at this gain: within the first few updates the gradient norm climbs by
four to six orders of magnitude (26 -> 1.8e6 with seed 0; 1.3e4x to 1.6e6x its start over seeds
0, 1, 3, 7, 11) while the loss barely moves. That huge step saturates the recurrence, the
gradient falls back, and the run finishes with finite numbers: nanscope lets it finish and
diagnoses it as suspect. The numbers after the explosion depend on rounding (chaos); the climb
at the start does not, and it sits 10x and more above the rule's 1e3 threshold on every seed
tried (with sequences growing by 12 instead of 24 per update it was 740x on seed 7: healthy).
"""

import os

import torch
from torch import nn


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


CAUSE = "exploding_gradients"
STOPS = False  # the gradient saturates near 1e9 without overflowing: a "suspect" verdict

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
for step in range(40):
    length = 10 + 24 * step
    x = 0.5 * torch.randn(8, length, 1)
    y = x[:, :5, 0].sum(1, keepdim=True)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print("done", loss.item())
