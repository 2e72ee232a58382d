"""Minibatch SGD (batch 8) on linear regression with very noisy targets: a jagged, healthy loss.

The target noise (sd 1.5) is larger than the signal in any single feature, so each batch's loss
jumps up and down by a factor of several from update to update; on average it falls to the noise
floor and stays there. Nothing is wrong; the detectors must not fire on the noise.
"""

from __future__ import annotations

import numpy as np

CAUSE = "healthy"
DESCRIPTION = "linear regression, minibatch SGD (8), target noise sd 1.5, 400 updates"


def fit(monitor, lr: float = 0.05, updates: int = 400, batch: int = 8) -> None:
    rng = np.random.default_rng(20)
    n, d = 2000, 6
    X = rng.standard_normal((n, d))
    y = X @ rng.normal(0, 1, d) - 1.0 + 1.5 * rng.standard_normal(n)
    w = np.zeros(d)
    b = np.zeros(1)
    order = np.concatenate([rng.permutation(n) for _ in range(2)])
    for step in range(updates):
        idx = order[step * batch : (step + 1) * batch]
        Xb, yb = X[idx], y[idx]
        r = Xb @ w + b - yb
        loss = 0.5 * float(np.mean(r * r))
        gw = Xb.T @ r / batch
        gb = np.array([r.mean()])
        monitor.update(
            loss,
            params={"w": w, "b": b},
            grads={"w": gw, "b": gb},
            lr=lr,
            inputs=Xb,
            targets=yb,
            index=idx,
        )
        w = w - lr * gw
        b = b - lr * gb


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
