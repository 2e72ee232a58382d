"""Minibatch SGD on clean standardised data, except one row whose feature is 1e6 times the rest.

A unit mix-up in one record (a sensor that logged microvolts once) leaves a single finite value of
~1e6 in a column whose other values are ~1. The epoch order is fixed so that row is first drawn in
minibatch 55: for 54 updates the loss descends normally; then that batch's squared residual is
~1e12 times the usual, its gradient throws the weights ~1e9 away, and the loss spikes by many
orders of magnitude in one update. Nothing about the step size is wrong for the other rows.
"""

from __future__ import annotations

import numpy as np

CAUSE = "extreme_batch"
BAD_ROW = 913
BAD_ROWS = [BAD_ROW]
DESCRIPTION = "linear regression, minibatch SGD (16); one feature 1e6x the rest, first seen at 55"

BATCH = 16


def fit(monitor, lr: float = 0.05, updates: int = 80) -> None:
    rng = np.random.default_rng(15)
    n, d = 1600, 4
    X = rng.standard_normal((n, d))
    y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3 + 0.1 * rng.standard_normal(n)
    X[BAD_ROW, 2] = 1.3e6  # the unit mix-up
    order = rng.permutation(n)
    pos = int(np.flatnonzero(order == BAD_ROW)[0])
    order[[pos, 54 * BATCH + 9]] = order[[54 * BATCH + 9, pos]]
    w = np.zeros(d)
    b = np.zeros(1)
    for step in range(updates):
        idx = order[step * BATCH : (step + 1) * BATCH]
        Xb, yb = X[idx], y[idx]
        with np.errstate(all="ignore"):
            r = Xb @ w + b - yb
            loss = 0.5 * float(np.mean(r * r))
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
