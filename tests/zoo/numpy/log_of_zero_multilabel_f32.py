"""A float32 multi-label tagger (relu MLP, one sigmoid per tag) with an unclipped log loss.

Three tags, each a clean function of the inputs, fit with minibatch SGD + momentum. The loss is
the per-tag binary cross-entropy written out as ``-(Y log P + (1 - Y) log(1 - P))``. In float32
``sigmoid(z)`` rounds to exactly 1.0 once ``z`` passes ~17: as the tags are learned the scores
grow, the first tagged example whose score crosses that line makes ``log(1 - P) = -inf`` and
``0 * -inf = NaN``. The weights, the inputs and the analytic gradient ``(P - Y)`` stay finite.
"""

from __future__ import annotations

import numpy as np

CAUSE = "log_of_zero"
DESCRIPTION = "float32 relu MLP, 3 sigmoid tags, momentum SGD; unclipped BCE hits 0*log(0)"


def fit(monitor, lr: float = 0.5, beta: float = 0.9, epochs: int = 40, batch: int = 50) -> None:
    rng = np.random.default_rng(14)
    n, d, h, k = 500, 8, 16, 3
    X = rng.standard_normal((n, d)).astype(np.float32)
    Y = np.column_stack([X[:, 0] > 0, X[:, 1] + X[:, 2] > 0, X[:, 3] - X[:, 4] > 0.5])
    Y = Y.astype(np.float32)
    params = {
        "W1": (rng.standard_normal((d, h)) * np.sqrt(2.0 / d)).astype(np.float32),
        "b1": np.zeros(h, np.float32),
        "W2": (rng.standard_normal((h, k)) / np.sqrt(h)).astype(np.float32),
        "b2": np.zeros(k, np.float32),
    }
    vel = {key: np.zeros_like(p) for key, p in params.items()}
    one = np.float32(1.0)
    for _epoch in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch):
            idx = order[start : start + batch]
            Xb, Yb = X[idx], Y[idx]
            H = np.maximum(Xb @ params["W1"] + params["b1"], 0)
            Z = H @ params["W2"] + params["b2"]
            P = one / (one + np.exp(-Z))
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                loss = -float(np.mean(Yb * np.log(P) + (one - Yb) * np.log(one - P)))
            G = (P - Yb) / np.float32(Yb.size)
            dH = (G @ params["W2"].T) * (H > 0)
            grads = {"W1": Xb.T @ dH, "b1": dH.sum(axis=0), "W2": H.T @ G, "b2": G.sum(axis=0)}
            monitor.update(
                loss, params=params, grads=grads, lr=lr, inputs=Xb, targets=Yb, index=idx
            )
            for key in params:
                vel[key] = (beta * vel[key] + grads[key]).astype(np.float32)
                params[key] = (params[key] - lr * vel[key]).astype(np.float32)


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
