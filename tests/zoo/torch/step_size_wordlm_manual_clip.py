"""The word-level LSTM language model of PyTorch's examples (manual SGD step after
``clip_grad_norm_(..., 0.25)``, no torch.optim) at lr 1000, 50x the example's default of 20
(``healthy_wordlm_manual_clip``).

Clipping bounds each step's length at lr x 0.25 = 250, which is still far too long: the first
update throws the loss from ~4.7 to ~125 and it stays there. nanscope watches the hand-made
update, sees that the script already clips (the recorded norm is the pre-clip one) and must not
advise clipping: the learning rate is what to cut.
"""

from _wordlm import train

CAUSE = "step_size_too_large"
ADVICE_NOT = "clip the gradient norm"

train(lr=1000.0)
