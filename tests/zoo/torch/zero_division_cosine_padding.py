"""Seed 000: an LSTM predicts target embeddings; the loss is a cosine distance written by hand,
``1 - (o * t).sum(-1) / (o.norm(dim=-1) * t.norm(dim=-1))``, averaged over every position.

Sequences are zero-padded to the batch's longest one, and the padding embedding is the zero
vector. The first three batches happen to hold sequences of one length; the first batch with padding
divides 0 by 0 at every padded position, and the loss is NaN.
"""

import os

import torch
from torch import nn

CAUSE = "zero_division"
OP = "div"


class Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 8)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.head(h)


def cosine_distance(o, t):
    return 1 - (o * t).sum(-1) / (o.norm(dim=-1) * t.norm(dim=-1))


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
emb = torch.randn(50, 8)
emb[0] = 0.0  # the padding token's target embedding
pad_in = torch.randn(8)  # the input side has a learned-looking PAD vector
model = Seq()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    lengths = [12] * 8 if step < 3 else [12, 9, 12, 7, 12, 12, 10, 12]
    ids = torch.zeros(8, 12, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, 50, (n,))
    x = torch.where((ids > 0).unsqueeze(-1), emb[ids], pad_in)
    t = emb[ids.roll(-1, 1)] * (ids > 0).unsqueeze(-1)
    opt.zero_grad()
    loss = cosine_distance(model(x), t).mean()
    loss.backward()
    opt.step()
print("done", loss.item())
