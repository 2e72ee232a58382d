"""A three-layer linear network from a tiny initialisation: a long plateau, then a sharp drop.

``y = W3 W2 W1 x`` fit to a linear teacher with full-batch GD, all weights initialised at scale
1e-2. Near the origin the loss surface is a saddle: the gradient is ~1e-4 of its later size and
the loss sits flat for hundreds of updates while the weights grow exponentially slowly; then the
weights align with the teacher and the loss falls by orders of magnitude in a few dozen updates.
Plateau-then-drop is normal learning dynamics, not a failure.
"""

from __future__ import annotations

import numpy as np

CAUSE = "healthy"
DESCRIPTION = "deep linear net 8-8-8-1 from 1e-2 init, full-batch GD: saddle plateau then drop"


def fit(monitor, lr: float = 0.05, updates: int = 600) -> None:
    rng = np.random.default_rng(21)
    n, d, h = 400, 8, 8
    X = rng.standard_normal((n, d))
    y = X @ rng.normal(0, 1, d) + 0.05 * rng.standard_normal(n)
    W1 = 1e-2 * rng.standard_normal((d, h))
    W2 = 1e-2 * rng.standard_normal((h, h))
    w3 = 1e-2 * rng.standard_normal(h)
    index = np.arange(n)
    for _ in range(updates):
        A1 = X @ W1
        A2 = A1 @ W2
        r = A2 @ w3 - y
        loss = 0.5 * float(np.mean(r * r))
        g3 = A2.T @ r / n
        dA2 = np.outer(r, w3) / n
        g2 = A1.T @ dA2
        dA1 = dA2 @ W2.T
        g1 = X.T @ dA1
        monitor.update(
            loss,
            params={"W1": W1, "W2": W2, "w3": w3},
            grads={"W1": g1, "W2": g2, "w3": g3},
            lr=lr,
            inputs=X,
            targets=y,
            index=index,
        )
        W1 = W1 - lr * g1
        W2 = W2 - lr * g2
        w3 = w3 - lr * g3


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
