"""Least squares on an ad-click value model with a raw money-valued feature, fit at lr=1.0.

The seed story: the spend column is in dollars (1e3..1e4) while the other columns are standardised.
The curvature along the spend direction is ~mean(spend^2) ~ 3e7, so lr=1.0 overshoots the minimum
by a factor of ~3e7 per update: the weights flip sign and grow, the loss multiplies each update and
overflows within three epochs. lr=0.01 on standardised features converges on the same rows.
"""

from __future__ import annotations

import numpy as np

CAUSE = "step_size_too_large"
DESCRIPTION = "linear regression, raw money feature (1e3..1e4), minibatch SGD at lr=1.0"


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 600
    spend = rng.uniform(1_000.0, 10_000.0, n)  # raw dollars
    clicks = rng.standard_normal(n)
    mobile = (rng.random(n) < 0.4).astype(float)
    X = np.column_stack([spend, clicks, mobile])
    y = 0.002 * spend + 1.5 * clicks - 0.7 * mobile + 0.3 * rng.standard_normal(n)
    return X, y


def fit(monitor, lr: float = 1.0, epochs: int = 3, batch: int = 100) -> None:
    X, y = make_data()
    rng = np.random.default_rng(1)
    w = np.zeros(X.shape[1])
    b = np.zeros(1)
    for _epoch in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch):
            idx = order[start : start + batch]
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
