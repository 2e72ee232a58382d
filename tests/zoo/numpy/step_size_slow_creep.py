"""Least squares just past the stability limit: lr = 1.05 x 2/L, full-batch GD.

Every mode but the stiffest converges; along the stiffest eigenvector each update multiplies the
error by |1 - lr * L| = 1.1, so the loss first falls, then climbs by a steady ~1.2x per update,
never accelerating. Left alone it reaches inf after ~7,000 updates; the slow divergence fingerprint
(many rises by a steady factor, the gradient reversing every update) stops it long before.
"""

from __future__ import annotations

import numpy as np

CAUSE = "step_size_too_large"
DESCRIPTION = "least squares at 1.05 x the 2/L limit: a slow, steady geometric climb"


def fit(monitor, updates: int = 8000) -> None:
    rng = np.random.default_rng(11)
    n, d = 300, 5
    X = rng.standard_normal((n, d))
    y = X @ rng.standard_normal(d) + 0.05 * rng.standard_normal(n)
    curvature = np.linalg.eigvalsh(2.0 * X.T @ X / n).max()
    lr = 2.1 / curvature
    w = np.zeros(d)
    for _ in range(updates):
        with np.errstate(all="ignore"):
            r = X @ w - y
            loss = float(np.mean(r * r))
            g = 2.0 * X.T @ r / n
        monitor.update(loss, params={"w": w}, grads={"w": g}, lr=lr, inputs=X, targets=y)
        w = w - lr * g


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
