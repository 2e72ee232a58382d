"""A makemore-style character MLP (Bengio et al. 2003): embed the last 3 characters, a tanh hidden
layer, logits over the next character. Parameters are plain tensors, as in the makemore lectures.

``train(lr, update=...)`` runs the lecture's loop on words taken from the zoo corpus:

* ``"data"``: ``p.data += -lr * p.grad`` after ``p.grad = None; loss.backward()`` (no torch.optim);
* ``"no_grad"``: ``with torch.no_grad(): p -= lr * p.grad`` then ``p.grad.zero_()``;
* ``"adam"``: ``torch.optim.Adam(parameters, lr)`` instead of the hand-written step.
"""

import os

import torch.nn.functional as F
from _corpus import text

import torch


def dataset(block_size: int = 3) -> tuple[torch.Tensor, torch.Tensor, int]:
    words = [w.strip(".,:;") for w in text().split()]
    words = [w for w in words if w.isalpha()]
    chars = sorted(set("".join(words)))
    stoi = {s: i + 1 for i, s in enumerate(chars)}
    stoi["."] = 0
    xs, ys = [], []
    for w in words:
        context = [0] * block_size
        for ch in w + ".":
            xs.append(context)
            ys.append(stoi[ch])
            context = [*context[1:], stoi[ch]]
    return torch.tensor(xs), torch.tensor(ys), len(stoi)


def train(lr: float, update: str = "data", steps: int = 200, n_embd: int = 10, n_hidden: int = 100):
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    seed = int(os.environ.get("ZOO_SEED", "2147483647"))
    X, Y, vocab_size = dataset()
    g = torch.Generator().manual_seed(seed)
    C = torch.randn((vocab_size, n_embd), generator=g)
    W1 = torch.randn((3 * n_embd, n_hidden), generator=g) * (5 / 3) / (3 * n_embd) ** 0.5
    b1 = torch.randn(n_hidden, generator=g) * 0.01
    W2 = torch.randn((n_hidden, vocab_size), generator=g) * 0.01
    b2 = torch.zeros(vocab_size)
    parameters = [C, W1, b1, W2, b2]
    for p in parameters:
        p.requires_grad = True
    optimizer = torch.optim.Adam(parameters, lr=lr) if update == "adam" else None
    for i in range(steps):
        ix = torch.randint(0, X.shape[0], (32,), generator=g)
        emb = C[X[ix]]
        h = torch.tanh(emb.view(-1, 3 * n_embd) @ W1 + b1)
        logits = h @ W2 + b2
        loss = F.cross_entropy(logits, Y[ix])
        if optimizer is not None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        elif update == "data":
            for p in parameters:
                p.grad = None
            loss.backward()
            for p in parameters:
                p.data += -lr * p.grad
        else:
            loss.backward()
            with torch.no_grad():
                for p in parameters:
                    p -= lr * p.grad
                    p.grad.zero_()
        if i % 50 == 0:
            print(f"{i:7d}/{steps:7d}: {loss.item():.4f}")
    return loss.item()
