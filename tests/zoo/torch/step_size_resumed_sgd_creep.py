"""Least squares resumed from its fitted weights (a checkpoint) and trained on with
``torch.optim.SGD`` at 1.003x the stability limit 2/L of its stiffest direction (one feature 4x
the others), batches of 1024 of 2048 rows.

Every direction but the stiffest stays converged; along it each update multiplies the error by
~1.003, under minibatch noise: the loss creeps up from ~0.09, no NaN, no jump, no run of rises
long enough for the geometric-growth fingerprint, until it is several times its best and still
climbing. The updates point downhill (cosine(update, gradient) < 0): the step is too long, not
the wrong way round. At 0.5x the limit the same run stays at ~0.09.
"""

from _resumed import train

CAUSE = "step_size_too_large"
EVIDENCE = "kept climbing"

train(1.003)
