"""A framework-free least-squares fit: takes the sweep's factor, reports every update to a Monitor.

argv: [steps] [sign]; sign -1 flips the update (a sign error: the loss rises at every step size).
"""

import sys

import numpy as np

import nanscope
from nanscope.experiment import lr_factor

assert "torch" not in sys.modules, "a numpy-only fit must never import torch"
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
sign = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 3)) * np.array([1.0, 1.5, 2.0])
y = x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=64)
w = np.zeros(3)
lr = 1.0 * lr_factor()
mon = nanscope.Monitor(write=False)
with np.errstate(all="ignore"):
    for _ in range(steps):
        r = x @ w - y
        g = 2 * x.T @ r / len(y)
        mon.update(float(np.mean(r**2)), params={"w": w}, grads={"w": g}, lr=lr)
        w = w - sign * lr * g
