"""Minibatch SGD on least squares at a step size that is large but stable on average.

At lr = 1.2/L the full-batch dynamics converge, but single minibatches have a larger curvature, so
now and then a few updates overshoot and the loss rises a few-fold before the next batches pull it
back. None of those excursions leaves the range the run has already visited: noisy, not
diverging.
"""

from __future__ import annotations

import numpy as np

CAUSE = "healthy"
DESCRIPTION = "minibatch SGD at a large but stable lr: rises that stay within the run's range"


def fit(monitor, updates: int = 600) -> None:
    rng = np.random.default_rng(12)
    n, d, batch = 400, 6, 16
    X = rng.standard_normal((n, d))
    y = X @ rng.standard_normal(d) + 0.3 * rng.standard_normal(n)
    curvature = np.linalg.eigvalsh(2.0 * X.T @ X / n).max()
    lr = 1.2 / curvature
    w = np.zeros(d)
    for _ in range(updates):
        idx = rng.choice(n, batch, replace=False)
        r = X[idx] @ w - y[idx]
        loss = float(np.mean(r * r))
        g = 2.0 * X[idx].T @ r / batch
        monitor.update(loss, params={"w": w}, grads={"w": g}, lr=lr, inputs=X[idx],
                       targets=y[idx], index=idx)  # fmt: skip
        w = w - lr * g


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
