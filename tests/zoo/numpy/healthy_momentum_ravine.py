"""Heavy-ball momentum (beta=0.95) down an ill-conditioned ravine: the loss oscillates, converges.

A quadratic with condition number ~1e3 (features with scales from 0.03 to 1), fit by full-batch
heavy-ball at lr = 1/L. Momentum this high is underdamped: the loss rises for a few updates at a
time as the iterate swings through the valley, and the weights can change sign, but every swing
is smaller than the one before and the loss falls by orders of magnitude overall. Oscillation is
not divergence.
"""

from __future__ import annotations

import numpy as np

CAUSE = "healthy"
DESCRIPTION = "least squares, condition ~1e3, heavy-ball beta=0.95 at lr=1/L: underdamped, fine"


def fit(monitor, beta: float = 0.95, updates: int = 600) -> None:
    rng = np.random.default_rng(24)
    n, d = 400, 6
    scales = np.array([1.0, 0.5, 0.2, 0.1, 0.05, 0.03])
    X = rng.standard_normal((n, d)) * scales
    y = X @ rng.normal(0, 3, d) + 0.01 * rng.standard_normal(n)
    lr = 1.0 / float(np.linalg.eigvalsh(X.T @ X / n).max())
    w = np.zeros(d)
    vel = np.zeros(d)
    index = np.arange(n)
    for _ in range(updates):
        r = X @ w - y
        loss = 0.5 * float(np.mean(r * r))
        g = X.T @ r / n
        monitor.update(
            loss, params={"w": w}, grads={"w": g}, lr=lr, inputs=X, targets=y, index=index
        )
        vel = beta * vel + g
        w = w - lr * vel


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
