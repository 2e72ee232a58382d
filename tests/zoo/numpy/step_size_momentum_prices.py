"""Heavy-ball momentum on house prices in thousands of dollars: a loss of ~1e5 that only grows.

Features are standardised but the target is not (prices ~ 300 +- 80, in $k), so the loss starts
near 5e4. Heavy-ball with beta=0.9 is stable only while lr * L < 2 (1 + beta) = 3.8; here
lr * L ~ 4.0 (L ~ 1.8 from the correlated pair), so the top mode of the iteration has a real
negative eigenvalue ~ -1.45: the error alternates in sign and the loss grows ~2x per update, a
too-large step at a different loss scale and a slower growth than plain GD.
"""

from __future__ import annotations

import numpy as np

CAUSE = "step_size_too_large"
DESCRIPTION = "linear regression, heavy-ball momentum 0.9, lr*L ~ 4.0 > 3.8, loss scale 1e5"


def fit(monitor, lr: float = 2.2, beta: float = 0.9, updates: int = 800) -> None:
    rng = np.random.default_rng(3)
    n, d = 300, 6
    Z = rng.standard_normal((n, d))
    Z[:, 1] = 0.8 * Z[:, 0] + 0.6 * Z[:, 1]  # rooms and area are correlated
    X = (Z - Z.mean(axis=0)) / Z.std(axis=0)
    price = 300.0 + X @ np.array([60.0, 25.0, -10.0, 5.0, 0.0, 15.0]) + 20 * rng.standard_normal(n)
    w = np.zeros(d)
    b = np.zeros(1)
    vw = np.zeros(d)
    vb = np.zeros(1)
    index = np.arange(n)
    for _ in range(updates):
        with np.errstate(all="ignore"):
            r = X @ w + b - price
            loss = 0.5 * float(np.mean(r * r))
            gw = X.T @ r / n
            gb = np.array([r.mean()])
        monitor.update(
            loss,
            params={"w": w, "b": b},
            grads={"w": gw, "b": gb},
            lr=lr,
            inputs=X,
            targets=price,
            index=index,
        )
        vw = beta * vw + gw
        vb = beta * vb + gb
        w = w - lr * vw
        b = b - lr * vb


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
