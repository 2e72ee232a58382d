"""The makemore character MLP trained with ``torch.optim.Adam`` at lr 1.0, 100x the 1e-2 it
trains well at.

Adam's step is ~lr per weight whatever the gradient, so the first update already throws the
logits far out: the loss jumps from ~3.3 to ~17 in one update and then plateaus 10-40x above its
best, never coming back -- no geometric growth, no NaN. nanscope stops it on that plateau.
"""

from _makemore import train

CAUSE = "step_size_too_large"

train(lr=1.0, update="adam")
