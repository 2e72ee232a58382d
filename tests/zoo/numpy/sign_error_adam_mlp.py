"""A hand-written Adam on a small tanh MLP whose parameter step has the wrong sign.

``p += lr * m_hat / (sqrt(v_hat) + eps)``: Adam's step is close to ``lr * sign(grad)``, so the
update points along the gradient (cosine ~ 0.6-0.9, not exactly 1) and the loss climbs steadily
from update one, without oscillation.
"""

from __future__ import annotations

import numpy as np

CAUSE = "update_sign_error"
DESCRIPTION = "tanh MLP 3-24-1 + hand-written Adam with a flipped step, full batch"


def fit(monitor, lr: float = 0.003, updates: int = 300) -> None:
    rng = np.random.default_rng(11)
    n, d, h = 300, 3, 24
    X = rng.uniform(-2, 2, (n, d))
    y = np.cos(X[:, 0]) * X[:, 1] + 0.2 * X[:, 2] + 0.05 * rng.standard_normal(n)
    params = {
        "W1": rng.standard_normal((d, h)) / np.sqrt(d),
        "b1": np.zeros(h),
        "W2": rng.standard_normal(h) / np.sqrt(h),
        "b2": np.zeros(1),
    }
    m = {k: np.zeros_like(p) for k, p in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    index = np.arange(n)
    for t in range(1, updates + 1):
        A = np.tanh(X @ params["W1"] + params["b1"])
        r = A @ params["W2"] + params["b2"] - y
        loss = 0.5 * float(np.mean(r * r))
        dA = np.outer(r, params["W2"]) * (1 - A * A) / n
        grads = {
            "W1": X.T @ dA,
            "b1": dA.sum(axis=0),
            "W2": A.T @ r / n,
            "b2": np.array([r.mean()]),
        }
        monitor.update(loss, params=params, grads=grads, lr=lr, inputs=X, targets=y, index=index)
        for k in params:
            m[k] = beta1 * m[k] + (1 - beta1) * grads[k]
            v[k] = beta2 * v[k] + (1 - beta2) * grads[k] ** 2
            step = lr * (m[k] / (1 - beta1**t)) / (np.sqrt(v[k] / (1 - beta2**t)) + eps)
            params[k] = params[k] + step  # the bug: + instead of -


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
