"""Logistic regression by minibatch SGD that maximises the log loss instead of minimising it.

The author derived the gradient of the log-likelihood and then also flipped the update, so the
step follows the gradient of the loss. The log loss is ~linear in the score for badly classified
points, so the loss rises steadily, roughly linearly, with minibatch noise, and no NaN (the loss
is computed in the stable form) within the run.
"""

from __future__ import annotations

import numpy as np

CAUSE = "update_sign_error"
DESCRIPTION = "logistic regression, minibatch SGD (64), gradient ascent on the log loss"


def fit(monitor, lr: float = 0.1, epochs: int = 4, batch: int = 64) -> None:
    rng = np.random.default_rng(10)
    n, d = 1024, 8
    X = rng.standard_normal((n, d))
    true_w = rng.standard_normal(d)
    y = (X @ true_w + 0.5 * rng.standard_normal(n) > 0).astype(float)
    w = np.zeros(d)
    b = np.zeros(1)
    for _epoch in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch):
            idx = order[start : start + batch]
            Xb, yb = X[idx], y[idx]
            z = Xb @ w + b
            # stable log loss: log(1 + e^z) - y z
            loss = float(np.mean(np.logaddexp(0.0, z) - yb * z))
            p = 1.0 / (1.0 + np.exp(-z))
            gw = Xb.T @ (p - yb) / len(yb)
            gb = np.array([np.mean(p - yb)])
            monitor.update(
                loss,
                params={"w": w, "b": b},
                grads={"w": gw, "b": gb},
                lr=lr,
                inputs=Xb,
                targets=yb,
                index=idx,
            )
            w = w + lr * gw  # the bug: ascent
            b = b + lr * gb


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
