"""Softmax regression with a hand-written Adam and a long linear warm-up: a slow start.

The learning rate ramps up as (t / 300)^3 to 2e-2 over the first 300 updates, so for the first
hundred or so the loss barely moves from log(5) (it wanders with minibatch noise); then it falls
steadily. A slow start is not a failure.
"""

from __future__ import annotations

import numpy as np

CAUSE = "healthy"
DESCRIPTION = "softmax regression, 5 classes, Adam with a 300-update cubic warm-up, minibatch 32"


def fit(
    monitor, peak_lr: float = 2e-2, warmup: int = 300, updates: int = 500, batch: int = 32
) -> None:
    rng = np.random.default_rng(22)
    n, d, k = 3000, 10, 5
    centers = rng.normal(0, 1.0, (k, d))
    labels = rng.integers(0, k, n)
    X = centers[labels] + rng.standard_normal((n, d))
    Y = np.eye(k)[labels]
    params = {"W": np.zeros((d, k)), "b": np.zeros(k)}
    m = {key: np.zeros_like(p) for key, p in params.items()}
    v = {key: np.zeros_like(p) for key, p in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    order = np.concatenate([rng.permutation(n) for _ in range(6)])
    for t in range(1, updates + 1):
        lr = peak_lr * min(1.0, t / warmup) ** 3
        idx = order[(t - 1) * batch : t * batch]
        Xb, Yb = X[idx], Y[idx]
        z = Xb @ params["W"] + params["b"]
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = -float(np.mean(np.sum(Yb * logp, axis=1)))
        G = (np.exp(logp) - Yb) / batch
        grads = {"W": Xb.T @ G, "b": G.sum(axis=0)}
        monitor.update(
            loss, params=params, grads=grads, lr=lr, inputs=Xb, targets=labels[idx], index=idx
        )
        for key in params:
            m[key] = beta1 * m[key] + (1 - beta1) * grads[key]
            v[key] = beta2 * v[key] + (1 - beta2) * grads[key] ** 2
            mhat = m[key] / (1 - beta1**t)
            vhat = v[key] / (1 - beta2**t)
            params[key] = params[key] - lr * mhat / (np.sqrt(vhat) + eps)


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
