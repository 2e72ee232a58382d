"""A CSV with one empty cell: ``np.genfromtxt`` reads it as NaN, and minibatch 8 holds that row.

The data file is written in memory as text, then parsed the way a user would; one cell of the
``tenure`` column is empty. Minibatch SGD on linear regression descends normally for seven updates;
the eighth batch contains the row, its residual is NaN, and so are the mean loss and the averaged
gradient at once: no growth phase.
"""

from __future__ import annotations

import io

import numpy as np

CAUSE = "nonfinite_input"
BAD_ROW = 137
BAD_ROWS = [BAD_ROW]
DESCRIPTION = "linear regression, minibatch SGD; an empty CSV cell parsed as NaN hit at update 8"

BATCH = 25


def make_csv(seed: int = 4) -> str:
    rng = np.random.default_rng(seed)
    n = 400
    age = rng.normal(40, 10, n)
    tenure = rng.exponential(3.0, n)
    visits = rng.poisson(5, n).astype(float)
    churn_score = 0.02 * age - 0.3 * tenure + 0.1 * visits + 0.2 * rng.standard_normal(n)
    lines = ["age,tenure,visits,score"]
    for i in range(n):
        cell = "" if i == BAD_ROW else f"{tenure[i]:.3f}"
        lines.append(f"{age[i]:.2f},{cell},{visits[i]:.0f},{churn_score[i]:.4f}")
    return "\n".join(lines) + "\n"


def fit(monitor, lr: float = 0.05, epochs: int = 2) -> None:
    table = np.genfromtxt(io.StringIO(make_csv()), delimiter=",", skip_header=1)
    X, y = table[:, :3], table[:, 3]
    # standardise with nan-aware statistics, as a careful pipeline would (the NaN survives)
    X = (X - np.nanmean(X, axis=0)) / np.nanstd(X, axis=0)
    rng = np.random.default_rng(5)
    order = rng.permutation(len(y))
    # the epoch order is fixed: the bad row sits in the eighth minibatch
    pos = int(np.flatnonzero(order == BAD_ROW)[0])
    order[[pos, 7 * BATCH + 11]] = order[[7 * BATCH + 11, pos]]
    w = np.zeros(X.shape[1])
    b = np.zeros(1)
    for _epoch in range(epochs):
        for start in range(0, len(y), BATCH):
            idx = order[start : start + BATCH]
            Xb, yb = X[idx], y[idx]
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
