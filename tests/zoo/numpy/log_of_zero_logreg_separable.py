"""Logistic regression on separable data with the textbook, unclipped log loss.

``-(y log p + (1 - y) log(1 - p))`` with ``p = 1 / (1 + exp(-z))``. The classes are separable
(a thin gap, long tails away from it), so full-batch GD keeps growing the weights; the score of
the example furthest out passes ~37, ``p`` rounds to exactly 1.0 in float64, ``log(1 - p)`` is
``-inf`` and ``0 * -inf`` makes the loss NaN. The analytic gradient ``X.T @ (p - y) / n`` stays
finite, and so do the weights and the data.
"""

from __future__ import annotations

import numpy as np

CAUSE = "log_of_zero"
DESCRIPTION = "logistic regression, separable data, unclipped log(sigmoid), full-batch GD lr=2"


def fit(monitor, lr: float = 2.0, updates: int = 3000) -> None:
    rng = np.random.default_rng(12)
    n, d = 200, 2
    y = (rng.random(n) < 0.5).astype(float)
    sign = 2 * y - 1
    # a thin gap between the classes (0.3) and long tails away from it (a skewed score)
    along = sign * (0.3 + rng.exponential(2.0, n))
    X = np.column_stack([along, rng.standard_normal(n)])
    w = np.zeros(d)
    b = np.zeros(1)
    index = np.arange(n)
    for _ in range(updates):
        z = X @ w + b
        p = 1.0 / (1.0 + np.exp(-z))
        with np.errstate(divide="ignore", invalid="ignore"):
            loss = -float(np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
        gw = X.T @ (p - y) / n
        gb = np.array([np.mean(p - y)])
        monitor.update(
            loss,
            params={"w": w, "b": b},
            grads={"w": gw, "b": gb},
            lr=lr,
            inputs=X,
            targets=y,
            index=index,
        )
        w = w - lr * gw
        b = b - lr * gb


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
