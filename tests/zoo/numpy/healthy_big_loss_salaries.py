"""Salaries in dollars from standardised features: the loss starts near 1e10 and falls steadily.

The target is not rescaled (mean ~8e4, sd ~2e4), so half the squared error starts at ~3e9 and the
gradient norm at ~1e5. Full-batch GD at lr=0.1 is well inside the stable range of the
standardised features; the loss falls geometrically to the noise floor (~1e6). Big numbers are
not a failure: every threshold must be relative to the run's own history.
"""

from __future__ import annotations

import numpy as np

CAUSE = "healthy"
DESCRIPTION = "linear regression on raw-dollar targets (loss ~3e9 -> 1e6), full-batch GD"


def fit(monitor, lr: float = 0.1, updates: int = 200) -> None:
    rng = np.random.default_rng(23)
    n, d = 500, 5
    Z = rng.standard_normal((n, d))
    X = (Z - Z.mean(axis=0)) / Z.std(axis=0)
    coef = np.array([15_000, 8_000, -3_000, 2_000, 500])
    salary = 80_000 + X @ coef + 1_500 * rng.standard_normal(n)
    w = np.zeros(d)
    b = np.zeros(1)
    index = np.arange(n)
    for _ in range(updates):
        r = X @ w + b - salary
        loss = 0.5 * float(np.mean(r * r))
        gw = X.T @ r / n
        gb = np.array([r.mean()])
        monitor.update(
            loss,
            params={"w": w, "b": b},
            grads={"w": gw, "b": gb},
            lr=lr,
            inputs=X,
            targets=salary,
            index=index,
        )
        w = w - lr * gw
        b = b - lr * gb


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
