"""Linear regression by full-batch GD with the update written ``w += lr * grad``.

The step is small (lr=0.02, well inside 2/L), so nothing oscillates: every update moves the
weights a little further up the bowl along the gradient, and the loss rises smoothly from update
one. cosine(update, gradient) is +1 at every update.
"""

from __future__ import annotations

import numpy as np

CAUSE = "update_sign_error"
DESCRIPTION = "linear regression, full-batch GD, w += lr * grad (ascent), lr=0.02"


def fit(monitor, lr: float = 0.02, updates: int = 300) -> None:
    rng = np.random.default_rng(9)
    n, d = 200, 5
    X = rng.standard_normal((n, d))
    y = X @ rng.standard_normal(d) + 0.5 + 0.1 * rng.standard_normal(n)
    w = np.zeros(d)
    b = np.zeros(1)
    index = np.arange(n)
    for _ in range(updates):
        r = X @ w + b - y
        loss = 0.5 * float(np.mean(r * r))
        gw = X.T @ r / n
        gb = np.array([r.mean()])
        monitor.update(
            loss,
            params={"w": w, "b": b},
            grads={"w": gw, "b": gb},
            lr=lr,
            inputs=X,
            targets=y,
            index=index,
        )
        w += lr * gw  # the bug: this climbs the loss
        b += lr * gb


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
