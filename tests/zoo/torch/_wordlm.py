"""A word-level LSTM language model and its loop, in the style of PyTorch's
``examples/word_language_model``: batchified corpus, truncated back-propagation through time
(``repackage_hidden``), ``model.zero_grad()``, ``clip_grad_norm_(model.parameters(), clip)`` and a
hand-written SGD step ``p.data.add_(p.grad, alpha=-lr)`` (no torch.optim).
"""

import math
import os

from _corpus import text

import torch
from torch import nn


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int = 32, nhid: int = 32, nlayers: int = 2) -> None:
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz: int):
        shape = (self.nlayers, bsz, self.nhid)
        return (torch.zeros(shape), torch.zeros(shape))


def repackage_hidden(h):
    return tuple(v.detach() for v in h)


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def train(lr: float = 20.0, clip: float = 0.25, epochs: int = 3, bptt: int = 16, bsz: int = 8):
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(int(os.environ.get("ZOO_SEED", "1111")))
    words = text().replace("\n", " <eos> ").split()
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    train_data = batchify(torch.tensor([vocab[w] for w in words]), bsz)
    model = RNNModel(len(vocab))
    criterion = nn.CrossEntropyLoss()
    for epoch in range(1, epochs + 1):
        hidden = model.init_hidden(bsz)
        total_loss = 0.0
        for i in range(0, train_data.size(0) - 1, bptt):
            seq_len = min(bptt, train_data.size(0) - 1 - i)
            data = train_data[i : i + seq_len]
            targets = train_data[i + 1 : i + 1 + seq_len].reshape(-1)
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            total_loss += loss.item()
        cur = total_loss / max(1, (train_data.size(0) - 1) // bptt)
        ppl = math.exp(min(cur, 50))
        print(f"| epoch {epoch:3d} | lr {lr:02.2f} | loss {cur:5.2f} | ppl {ppl:8.2f}")
