"""A float32 tanh RNN trained with Adam on a length curriculum: BPTT gradients explode.

The recurrent weights have gain 3 (a chaotic regime: nearby hidden trajectories separate at a
positive rate per time step). The hidden states stay in [-1, 1], so the loss of the linear
readout barely moves, but the product of step Jacobians that back-propagation multiplies grows
exponentially with the sequence length. The curriculum lengthens the sequences by 15 steps per
update; the recurrent gradient grows by orders of magnitude over a few dozen updates (Adam's
normalised step keeps the weights in place) until it overflows float32 while the loss is finite.
"""

from __future__ import annotations

import numpy as np

CAUSE = "exploding_gradients"
DESCRIPTION = "tanh RNN (32 units, gain 3) float32 + Adam, sequence length +15 per update"


def loss_and_grads(P: dict, X: np.ndarray, y: np.ndarray) -> tuple[float, dict]:
    """Loss of the readout of the last hidden state, and its gradient by BPTT (float32)."""
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


def fit(monitor, lr: float = 1e-3, updates: int = 120, batch: int = 16) -> None:
    rng = np.random.default_rng(17)
    H, D = 32, 2
    P = {
        "W_in": (0.5 * rng.standard_normal((D, H))).astype(np.float32),
        "W_rec": (3.0 * rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32),
        "b": np.zeros(H, np.float32),
        "W_out": (rng.standard_normal(H) / np.sqrt(H)).astype(np.float32),
        "b_out": np.zeros(1, np.float32),
    }
    m = {k: np.zeros_like(v) for k, v in P.items()}
    v = {k: np.zeros_like(p) for k, p in P.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    for t in range(1, updates + 1):
        T = 10 + 15 * t  # the curriculum
        X = rng.standard_normal((T, batch, D)).astype(np.float32)
        y = X[-5:, :, 0].mean(axis=0)  # the mean of the last five inputs
        loss, g = loss_and_grads(P, X, y)
        monitor.update(loss, params=P, grads=g, lr=lr, inputs=X, targets=y)  # time-major
        with np.errstate(over="ignore", invalid="ignore"):
            for k in P:
                m[k] = beta1 * m[k] + (1 - beta1) * g[k]
                v[k] = beta2 * v[k] + (1 - beta2) * g[k] * g[k]
                step = lr * (m[k] / (1 - beta1**t)) / (np.sqrt(v[k] / (1 - beta2**t)) + eps)
                P[k] = (P[k] - step).astype(np.float32)


if __name__ == "__main__":
    import nanscope

    fit(nanscope.Monitor())
