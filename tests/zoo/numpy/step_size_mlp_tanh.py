"""A one-hidden-layer tanh MLP on a smooth regression task, full-batch GD above the 2/L limit.

The output layer is linear in its weights, so along it the loss is a quadratic whose curvature is
the largest eigenvalue of H^T H / n (H the hidden activations, ~10 here). At lr=0.6 the product
lr * L is well above 2: every update overshoots, the output weights alternate in sign with growing
magnitude and the loss grows geometrically until it overflows.
"""

from __future__ import annotations

import numpy as np

CAUSE = "step_size_too_large"
DESCRIPTION = "tanh MLP 4-32-1, full-batch GD, lr far above 2/L"


def fit(monitor, lr: float = 0.6, updates: int = 400) -> None:
    rng = np.random.default_rng(2)
    n, d, h = 256, 4, 32
    X = rng.standard_normal((n, d))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(n)
    W1 = rng.standard_normal((d, h)) / np.sqrt(d)
    b1 = np.zeros(h)
    W2 = rng.standard_normal(h) / np.sqrt(h)
    b2 = np.zeros(1)
    index = np.arange(n)
    for _ in range(updates):
        with np.errstate(all="ignore"):
            A = np.tanh(X @ W1 + b1)
            r = A @ W2 + b2 - y
            loss = 0.5 * float(np.mean(r * r))
            gW2 = A.T @ r / n
            gb2 = np.array([r.mean()])
            dA = np.outer(r, W2) * (1.0 - A * A) / n
            gW1 = X.T @ dA
            gb1 = dA.sum(axis=0)
        params = {"W1": W1, "b1": b1, "W2": W2, "b2": b2}
        grads = {"W1": gW1, "b1": gb1, "W2": gW2, "b2": gb2}
        monitor.update(loss, params=params, grads=grads, lr=lr, inputs=X, targets=y, index=index)
        W1 = W1 - lr * gW1
        b1 = b1 - lr * gb1
        W2 = W2 - lr * gW2
        b2 = b2 - lr * gb2


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
