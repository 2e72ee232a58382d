"""The makemore character MLP updated by hand inside ``torch.no_grad()`` (``p -= lr * p.grad``,
then ``p.grad.zero_()``), no torch.optim, at the lecture's lr 0.1.

Watched as a hand-made loop (parameters that change between backward calls); the loss falls from
~3.3 to ~2 with minibatch noise. Nothing to report.
"""

from _makemore import train

CAUSE = "healthy"

train(lr=0.1, update="no_grad")
