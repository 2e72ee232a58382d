"""A policy for a grid game trained on logged games (advantage-weighted: the logged move's
log-probability weighted by its advantage) with an entropy bonus. The model computes its own loss
(``loss = policy(obs, legal, actions, returns)``, as Hugging Face models do). Illegal moves are
masked with ``masked_fill(~legal, -1e9)`` and the entropy is written with ``torch.special.entr``
because ``p * log(p)`` is NaN at p = 0.

``entr`` is finite at 0, but its gradient, ``-(log p + 1)``, is not. The first levels have no
walls, every move is legal and the fit runs; from level 2 (update 13) some moves are illegal,
their probability is exactly 0, and the backward of the entropy makes every weight's gradient
NaN while the loss is finite.
"""

import os

import torch
from torch import nn

CAUSE = "log_of_zero"
OP = "EntrBackward"
MODULE = "Policy"


class Policy(nn.Module):
    def __init__(self, obs=16, moves=6, beta=0.01):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs, 64), nn.Tanh(), nn.Linear(64, moves))
        self.beta = beta

    def forward(self, obs, legal, actions, returns):
        logits = self.net(obs).masked_fill(~legal, -1e9)
        logp = torch.log_softmax(logits, dim=-1)
        probs = torch.softmax(logits, dim=-1)
        entropy = torch.special.entr(probs).sum(-1)
        chosen = logp.gather(1, actions[:, None]).squeeze(1)
        return -(returns * chosen).mean() - self.beta * entropy.mean()


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
target = torch.randn(16, 6)
policy = Policy()
opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
for update in range(1, 41):
    obs = torch.randn(128, 16)
    legal = torch.ones(128, 6, dtype=torch.bool)
    if update >= 13:  # level 2: walls make some moves illegal
        legal[torch.rand(128, 6) < 0.2] = False
        legal[:, 0] = True  # "stay" is always legal
    actions = torch.multinomial(legal.float(), 1).squeeze(1)  # the logged bot's moves
    returns = (obs @ target).gather(1, actions[:, None]).squeeze(1)
    opt.zero_grad()
    loss = policy(obs, legal, actions, returns - returns.mean())
    loss.backward()
    opt.step()
print("done", loss.item())
