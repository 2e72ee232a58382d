"""The word-level LSTM language model of PyTorch's examples at its default lr of 20 with
``clip_grad_norm_(..., 0.25)`` and the hand-written SGD step: the loss falls slowly from ~4.7
(minibatch noise on top). Watched as a hand-made update loop; nothing to report.
"""

from _wordlm import train

CAUSE = "healthy"

train(lr=20.0)
