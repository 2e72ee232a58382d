"""The resumed least squares of ``step_size_resumed_sgd_creep`` at half the stability limit: the
loss stays at its noise floor (~0.09) for 600 updates, minibatch noise and all. Healthy."""

from _resumed import train

CAUSE = "healthy"

train(0.5)
