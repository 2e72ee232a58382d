"""A target computed as revenue / visits, with one customer who has zero visits: y = inf.

A tanh MLP trained with a hand-written Adam on minibatches of 32. The ratio is computed with
numpy's division (which warns and returns inf instead of raising); the minibatch that holds that
customer gives an infinite residual, an infinite loss and a non-finite gradient at that update,
after a normal descent.
"""

from __future__ import annotations

import numpy as np

CAUSE = "nonfinite_input"
BAD_ROW = 611
BAD_ROWS = [BAD_ROW]
DESCRIPTION = "MLP + Adam, minibatch 32; target revenue/visits is inf for a zero-visit row"

BATCH = 32


def make_data(seed: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 800
    X = rng.standard_normal((n, 5))
    visits = rng.poisson(6, n) + 1
    visits[BAD_ROW] = 0
    revenue = visits * np.exp(0.3 * X[:, 0] - 0.2 * X[:, 1] + 0.1 * rng.standard_normal(n))
    with np.errstate(divide="ignore", invalid="ignore"):
        per_visit = revenue / visits
    return X, per_visit


def fit(monitor, lr: float = 0.01, epochs: int = 2) -> None:
    X, y = make_data()
    rng = np.random.default_rng(7)
    d, h = X.shape[1], 16
    params = {
        "W1": rng.standard_normal((d, h)) / np.sqrt(d),
        "b1": np.zeros(h),
        "W2": rng.standard_normal(h) / np.sqrt(h),
        "b2": np.zeros(1),
    }
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    b1m, b2m, eps = 0.9, 0.999, 1e-8
    order = rng.permutation(len(y))
    pos = int(np.flatnonzero(order == BAD_ROW)[0])
    order[[pos, 19 * BATCH + 4]] = order[[19 * BATCH + 4, pos]]  # seen at update 20
    t = 0
    for _epoch in range(epochs):
        for start in range(0, len(y), BATCH):
            idx = order[start : start + BATCH]
            Xb, yb = X[idx], y[idx]
            A = np.tanh(Xb @ params["W1"] + params["b1"])
            r = A @ params["W2"] + params["b2"] - yb
            loss = 0.5 * float(np.mean(r * r))
            dA = np.outer(r, params["W2"]) * (1 - A * A) / len(yb)
            grads = {
                "W1": Xb.T @ dA,
                "b1": dA.sum(axis=0),
                "W2": A.T @ r / len(yb),
                "b2": np.array([r.mean()]),
            }
            monitor.update(
                loss, params=params, grads=grads, lr=lr, inputs=Xb, targets=yb, index=idx
            )
            t += 1
            for k in params:
                m[k] = b1m * m[k] + (1 - b1m) * grads[k]
                v[k] = b2m * v[k] + (1 - b2m) * grads[k] ** 2
                mhat = m[k] / (1 - b1m**t)
                vhat = v[k] / (1 - b2m**t)
                params[k] = params[k] - lr * mhat / (np.sqrt(vhat) + eps)


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
