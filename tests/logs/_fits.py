"""The real fit the log tests print in each framework's format."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def least_squares_losses(
    steps: int, lr: float, scales: Sequence[float], seed: int = 0
) -> list[float]:
    """Per-update losses of least squares by gradient descent on features of the given scales.

    Unscaled features make a too-large lr diverge: the loss grows, then reaches inf/NaN.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, 3)) * np.asarray(scales, dtype=float)
    y = x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=64)
    w = np.zeros(3)
    losses = []
    with np.errstate(all="ignore"):
        for _ in range(steps):
            residual = x @ w - y
            losses.append(float(np.mean(residual**2)))
            w = w - lr * 2 * x.T @ residual / len(y)
    return losses
