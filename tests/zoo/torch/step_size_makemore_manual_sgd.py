"""The makemore character MLP with its hand-written update, ``p.data += -lr * p.grad`` (no
torch.optim), at lr 30: 300x the lecture's 0.1 (``healthy_makemore_manual_sgd``).

No optimizer ever steps, so nanscope sees the updates as the parameters changing between
backward calls, and reads the lr off the update and the gradient. Each step overshoots: the
cross-entropy grows geometrically from ~3.3 to hundreds in a few updates, the weights flipping
sign.
"""

from _makemore import train

CAUSE = "step_size_too_large"

train(lr=30.0, update="data")
