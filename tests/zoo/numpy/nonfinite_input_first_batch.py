"""Softmax regression, full-batch GD, on a table where one sensor reading is missing (NaN).

The readings come in as Python floats with ``float("nan")`` for the dropout, so the very first
full batch carries the NaN: the loss is NaN on update 1, before any weight has moved, with no
growth phase -- the seed's tell for bad inputs.
"""

from __future__ import annotations

import numpy as np

CAUSE = "nonfinite_input"
BAD_ROW = 42
BAD_ROWS = [BAD_ROW]
DESCRIPTION = "softmax regression, 3 classes, full-batch GD; one NaN sensor reading in row 42"


def make_data(seed: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n, d, k = 240, 4, 3
    centers = rng.normal(0, 2, (k, d))
    labels = rng.integers(0, k, n)
    readings = [list(centers[c] + rng.standard_normal(d)) for c in labels]
    readings[BAD_ROW][2] = float("nan")  # the sensor dropped out
    return np.array(readings), labels


def fit(monitor, lr: float = 0.5, updates: int = 100) -> None:
    X, labels = make_data()
    n, d = X.shape
    k = int(labels.max()) + 1
    Y = np.eye(k)[labels]
    W = np.zeros((d, k))
    b = np.zeros(k)
    index = np.arange(n)
    for _ in range(updates):
        z = X @ W + b
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = -float(np.mean(logp[index, labels]))
        P = np.exp(logp)
        gW = X.T @ (P - Y) / n
        gb = (P - Y).mean(axis=0)
        monitor.update(
            loss,
            params={"W": W, "b": b},
            grads={"W": gW, "b": gb},
            lr=lr,
            inputs=X,
            targets=labels,
            index=index,
        )
        W = W - lr * gW
        b = b - lr * gb


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
