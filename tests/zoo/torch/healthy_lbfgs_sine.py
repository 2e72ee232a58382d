"""PyTorch's ``time_sequence_prediction`` example, small: two ``LSTMCell`` layers learn sine waves
with ``torch.optim.LBFGS(lr=0.8)`` and a closure (``optimizer.step(closure)``).

Each LBFGS step evaluates the closure up to 20 times at moving weights; the update's loss is the
first evaluation (the loss at the weights the step started from) and the others are kept apart
as ``closure_losses``. The loss falls from ~0.5 by orders of magnitude. Nothing to report.
"""

import os

import numpy as np

import torch
from torch import nn

CAUSE = "healthy"


class Sequence(nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, x):
        outputs = []
        h_t = torch.zeros(x.size(0), self.hidden, dtype=torch.double)
        c_t = torch.zeros(x.size(0), self.hidden, dtype=torch.double)
        h_t2 = torch.zeros(x.size(0), self.hidden, dtype=torch.double)
        c_t2 = torch.zeros(x.size(0), self.hidden, dtype=torch.double)
        for input_t in x.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            outputs.append(self.linear(h_t2))
        return torch.cat(outputs, dim=1)


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
seed = int(os.environ.get("ZOO_SEED", "0"))
np.random.seed(seed)
torch.manual_seed(seed)
T, L, N = 20, 60, 12
x = np.empty((N, L), "int64")
x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
data = np.sin(x / 1.0 / T).astype("float64")
inp = torch.from_numpy(data[3:, :-1])
target = torch.from_numpy(data[3:, 1:])
seq = Sequence().double()
criterion = nn.MSELoss()
optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)
for i in range(6):

    def closure():
        optimizer.zero_grad()
        out = seq(inp)
        loss = criterion(out, target)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    print("STEP:", i, "loss:", loss.item())
