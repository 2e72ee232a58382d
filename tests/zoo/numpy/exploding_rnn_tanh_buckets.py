"""A float32 tanh RNN trained by SGD on length-bucketed batches: the long bucket explodes.

Sequences are bucketed by length, short ones first (a common way to save padding), and the loader
yields batch-major ``(batch, length, features)`` arrays. The recurrent weights start at gain 3, a
chaotic regime: states stay bounded, but the BPTT Jacobian product grows exponentially with the
length. On the 24-step bucket the gradient norm is ~1e2 and the loss descends; the first 300-step
batch multiplies the recurrent gradient by ~1e19 while its loss is ordinary. That one SGD step
throws the recurrent weights ~1e19 away, every tanh saturates to exactly +-1, and for the rest
of the epoch the recurrent gradient is exactly 0: no NaN, a silently dead network.
"""

from __future__ import annotations

import numpy as np

CAUSE = "exploding_gradients"
DESCRIPTION = "tanh RNN (24 units, gain 3) float32 + SGD; buckets of length 24 then 300"


def loss_and_grads(P: dict, X: np.ndarray, y: np.ndarray) -> tuple[float, dict]:
    """Mean squared error of a readout of the last state, gradient by BPTT, per parameter."""
    T, B, _ = X.shape
    hs = [np.zeros((B, P["W_rec"].shape[0]), np.float32)]
    for t in range(T):
        hs.append(np.tanh(hs[-1] @ P["W_rec"] + X[t] @ P["W_in"] + P["b"]))
    r = hs[-1] @ P["W_out"] + P["b_out"] - y
    loss = 0.5 * float(np.mean(r * r))
    g = {k: np.zeros_like(v) for k, v in P.items()}
    dout = (r / B).astype(np.float32)
    g["W_out"] = hs[-1].T @ dout
    g["b_out"] = np.array([dout.sum()], np.float32)
    dh = np.outer(dout, P["W_out"]).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(T, 0, -1):
            da = dh * (1 - hs[t] * hs[t])
            g["W_rec"] += hs[t - 1].T @ da
            g["W_in"] += X[t - 1].T @ da
            g["b"] += da.sum(axis=0)
            dh = da @ P["W_rec"].T
    return loss, g


def fit(monitor, lr: float = 0.005, batch: int = 8) -> None:
    rng = np.random.default_rng(18)
    H, D = 24, 3
    P = {
        "W_in": (0.4 * rng.standard_normal((D, H))).astype(np.float32),
        "W_rec": (3.0 * rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32),
        "b": np.zeros(H, np.float32),
        "W_out": (rng.standard_normal(H) / np.sqrt(H)).astype(np.float32),
        "b_out": np.zeros(1, np.float32),
    }
    buckets = [24] * 40 + [300] * 10
    for T in buckets:
        # the loader yields batch-major arrays (batch, length, features)
        X = rng.standard_normal((T, batch, D)).astype(np.float32)
        y = np.tanh(X[-3:, :, 0].sum(axis=0))  # depends on the last three inputs
        loss, g = loss_and_grads(P, X, y)
        monitor.update(loss, params=P, grads=g, lr=lr, inputs=X.transpose(1, 0, 2), targets=y)
        for k in P:
            P[k] = (P[k] - lr * g[k]).astype(np.float32)


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
