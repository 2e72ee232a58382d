"""Logistic regression on separable data with p clipped into [eps, 1 - eps]: long and big, fine.

The same thin-gap separable data that breaks the unclipped log loss (see
``log_of_zero_logreg_separable``), fit for 600 full-batch updates at lr=2. The weights grow
without bound (as they must on separable data) and the scores of the furthest examples reach ~80,
far past the ~37 where float64 rounds p to exactly 1, but the probabilities are clipped before
the log, so the loss stays finite and keeps falling to its floor.
"""

from __future__ import annotations

import numpy as np

CAUSE = "healthy"
DESCRIPTION = "logistic regression, separable data, log loss on p clipped to [1e-7, 1-1e-7]"

EPS = 1e-7


def fit(monitor, lr: float = 2.0, updates: int = 600) -> None:
    rng = np.random.default_rng(12)
    n = 200
    y = (rng.random(n) < 0.5).astype(float)
    sign = 2 * y - 1
    along = sign * (0.3 + rng.exponential(2.0, n))
    X = np.column_stack([along, rng.standard_normal(n)])
    w = np.zeros(2)
    b = np.zeros(1)
    index = np.arange(n)
    for _ in range(updates):
        z = X @ w + b
        p = 1.0 / (1.0 + np.exp(-z))
        q = np.clip(p, EPS, 1 - EPS)
        loss = -float(np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))
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
