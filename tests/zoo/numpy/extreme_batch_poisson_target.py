"""Poisson regression (log link) on visit counts, where one count was typed as 2,400,000.

Counts are ~3; one record's count carries a data-entry error a million times larger. Minibatch SGD
on the Poisson deviance descends for 60 updates; the batch holding that row has a residual
``mu - y ~ -2.4e6``, so its gradient moves the weights by ~1e3; on the next batch ``exp(X @ w)``
overflows to inf and the loss goes inf. One finite extreme target, one spike.
"""

from __future__ import annotations

import numpy as np

CAUSE = "extreme_batch"
BAD_ROW = 1234
BAD_ROWS = [BAD_ROW]
DESCRIPTION = "Poisson regression (exp link), minibatch SGD (32); one target 1e6x, seen at 61"

BATCH = 32


def fit(monitor, lr: float = 0.02, updates: int = 120) -> None:
    rng = np.random.default_rng(16)
    n, d = 3200, 5
    X = rng.standard_normal((n, d)) * 0.5
    eta = 1.1 + X @ np.array([0.4, -0.3, 0.2, 0.0, 0.1])
    y = rng.poisson(np.exp(eta)).astype(float)
    y[BAD_ROW] = 2.4e6  # the typo
    order = rng.permutation(n)
    pos = int(np.flatnonzero(order == BAD_ROW)[0])
    order[[pos, 60 * BATCH + 17]] = order[[60 * BATCH + 17, pos]]
    w = np.zeros(d)
    b = np.zeros(1)
    for step in range(updates):
        idx = order[step * BATCH : (step + 1) * BATCH]
        Xb, yb = X[idx], y[idx]
        with np.errstate(all="ignore"):
            z = Xb @ w + b
            mu = np.exp(z)
            ylogy = np.where(yb > 0, yb * np.log(np.where(yb > 0, yb, 1.0)), 0.0)
            loss = float(np.mean(mu - yb - yb * z + ylogy))  # half the Poisson deviance
            r = mu - yb
            gw = Xb.T @ r / len(yb)
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
