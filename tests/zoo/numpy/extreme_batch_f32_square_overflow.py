"""A float32 linear regression of house prices (in thousands) with one mis-keyed target: row 611
holds a listing ID, 2.7e19, typed into the price column. Minibatch SGD descends for 40 updates;
the first batch that holds row 611 squares a residual of 2.7e19 in float32 (max 3.4e38): numpy
reports "overflow encountered in square" at the loss line, and the loss is inf. There is no log
anywhere: the producer is the square, the cause the one extreme row.
"""

from __future__ import annotations

import numpy as np

CAUSE = "extreme_batch"
BAD_ROW = 611
BAD_ROWS = [BAD_ROW]
DESCRIPTION = "float32 linreg, one mis-keyed target 2.7e19: (pred - y) ** 2 overflows at update 41"

BATCH = 20


def fit(monitor, lr: float = 0.05, updates: int = 60) -> None:
    rng = np.random.default_rng(7)
    n, d = 1200, 5
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = (X @ np.array([3.0, -1.0, 2.0, 0.5, 0.0]) + 4.0).astype(np.float32)
    y[BAD_ROW] = np.float32(2.7e19)  # a listing ID in the price column
    order = rng.permutation(n)
    pos = int(np.flatnonzero(order == BAD_ROW)[0])
    order[[pos, 40 * BATCH + 3]] = order[[40 * BATCH + 3, pos]]
    w = np.zeros(d, np.float32)
    b = np.float32(0.0)
    for step in range(updates):
        idx = order[step * BATCH : (step + 1) * BATCH]
        Xb, yb = X[idx], y[idx]
        r = Xb @ w + b - yb
        loss = float(np.mean(r ** 2))
        gw = (Xb.T @ r / np.float32(len(yb))).astype(np.float32)
        gb = np.float32(r.mean())
        monitor.update(
            loss, params={"w": w, "b": np.array([b])}, grads={"w": gw, "b": np.array([gb])},
            lr=lr, inputs=Xb, targets=yb, index=idx,
        )
        w = (w - np.float32(lr) * gw).astype(np.float32)
        b = np.float32(b - np.float32(lr) * gb)


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
