"""Real fits the diagnose tests run under a Monitor (numpy only, a second or less each)."""

from __future__ import annotations

from typing import Any

import numpy as np


def adam_mlp(
    monitor: Any, lr: float, updates: int = 150, seed: int = 0, new_task_at: int | None = None
) -> None:
    """A tanh MLP classifier (8 -> 16 -> 4) on minibatches of 32, trained with Adam at ``lr``.

    Healthy at lr 1e-2; at lr 3 each update moves every weight by ~lr, the logits blow up and the
    loss jumps from ~1.5 to a plateau many times higher: divergence as Adam shows it. With
    ``new_task_at``, the labels are drawn from another teacher from that update on (a new task,
    as in continual learning): the loss goes back up to where it started and learns again.
    """
    rng = np.random.default_rng(seed)
    n, d, k, h = 512, 8, 4, 16
    X = rng.standard_normal((n, d))
    y = np.argmax(X @ rng.standard_normal((d, k)), axis=1)
    y_new = np.argmax(X @ rng.standard_normal((d, k)), axis=1)
    P = {"W1": rng.standard_normal((d, h)) / np.sqrt(d),
         "W2": rng.standard_normal((h, k)) / np.sqrt(h)}  # fmt: skip
    m = {name: np.zeros_like(p) for name, p in P.items()}
    v = {name: np.zeros_like(p) for name, p in P.items()}
    rows = np.arange(32)
    for t in range(1, updates + 1):
        if new_task_at is not None and t == new_task_at:
            y = y_new
        idx = rng.choice(n, 32, replace=False)
        a = np.tanh(X[idx] @ P["W1"])
        z = a @ P["W2"]
        z = z - z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        loss = float(-np.mean(np.log(p[rows, y[idx]] + 1e-300)))
        dz = p.copy()
        dz[rows, y[idx]] -= 1
        dz /= 32
        g = {"W2": a.T @ dz, "W1": X[idx].T @ (dz @ P["W2"].T * (1 - a * a))}
        monitor.update(loss, params=P, grads=g, lr=lr, inputs=X[idx], targets=y[idx])
        for name in P:
            m[name] = 0.9 * m[name] + 0.1 * g[name]
            v[name] = 0.999 * v[name] + 0.001 * g[name] ** 2
            step = (m[name] / (1 - 0.9**t)) / (np.sqrt(v[name] / (1 - 0.999**t)) + 1e-8)
            P[name] = P[name] - lr * step


def converged_float32(monitor: Any, updates: int = 3000, seed: int = 0) -> None:
    """Minibatch SGD on an exactly solvable float32 least squares: the loss falls from ~14 to the
    float noise floor (~1e-13), where rounding makes it bounce by 10x and more between batches."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((64, 4)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)).astype(np.float32)
    w = np.zeros(4, np.float32)
    lr = np.float32(0.05)
    for _ in range(updates):
        idx = rng.choice(64, 8, replace=False)
        r = X[idx] @ w - y[idx]
        loss = float(np.mean(r * r))
        g = (2 * X[idx].T @ r / 8).astype(np.float32)
        monitor.update(loss, params={"w": w}, grads={"w": g}, lr=float(lr))
        w = (w - lr * g).astype(np.float32)


def run(fit: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """(diagnosis, monitor) of ``fit`` under a Monitor that does not write files."""
    import nanscope

    monitor = nanscope.Monitor(write=False)
    try:
        fit(monitor, *args, **kwargs)
    except nanscope.DivergenceError as exc:
        monitor.close()
        return exc.diagnosis, monitor
    return monitor.close(), monitor


def masked_regression(monitor: Any, updates: int = 60, seed: int = 0) -> None:
    """Least squares whose loss is averaged over the rows a ``valid`` mask keeps; the mask comes
    from a column the second half of the (sorted) data file lacks, filled with 0: from update 31
    on no row is kept, the loss is exactly 0.0 and the gradient exactly 0 -- nothing is learned."""
    rng = np.random.default_rng(seed)
    n, d, batch = 960, 4, 16
    X = rng.standard_normal((n, d))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.standard_normal(n)
    valid = np.ones(n)
    valid[n // 2 :] = 0.0  # the second file had no 'valid' column: filled with 0
    w = np.zeros(d)
    for t in range(updates):
        idx = np.arange(t * batch, (t + 1) * batch) % n
        r = (X[idx] @ w - y[idx]) * valid[idx]
        loss = float(np.sum(r * r) / batch)
        g = 2 * X[idx].T @ r / batch
        monitor.update(loss, params={"w": w}, grads={"w": g}, lr=0.1)
        w = w - 0.1 * g


def resumed_sgd(monitor: Any, factor: float, updates: int = 300, seed: int = 0) -> float:
    """Least squares resumed from its fitted weights and trained on by SGD (batches of 1024 of
    2048 rows) at ``factor`` times the stability limit 2/L of the stiffest direction (one feature
    4x the others). Below 1 it stays converged; at 1.003 the error along the stiffest direction
    grows by ~0.6% per update under minibatch noise: the loss creeps up from 0.09 to ~0.4 over
    300 updates without a NaN, a jump or a run of rises. Returns the learning rate."""
    rng = np.random.default_rng(seed)
    n, d, batch = 2048, 6, 1024
    X = rng.standard_normal((n, d)) * np.array([1.0, 1.0, 1.0, 1.0, 1.0, 4.0])
    y = X @ np.array([1.0, -0.5, 0.8, 0.3, -1.2, 0.02]) + 0.3 * rng.standard_normal(n)
    lr = factor * 2.0 / float(np.linalg.eigvalsh(2 * X.T @ X / n).max())
    w = np.linalg.lstsq(X, y, rcond=None)[0] + 0.003 * rng.standard_normal(d)  # the checkpoint
    for _ in range(updates):
        idx = rng.choice(n, batch, replace=False)
        r = X[idx] @ w - y[idx]
        g = 2 * X[idx].T @ r / batch
        monitor.update(float(np.mean(r * r)), params={"w": w}, grads={"w": g}, lr=lr)
        w = w - lr * g
    return lr


def logreg_ascent(monitor: Any, lr: float = 0.05, updates: int = 100, batch: int = 64,
                  sign: float = 1.0, seed: int = 0) -> None:  # fmt: skip
    """Logistic regression from w = 0 (loss log 2 = 0.69) by minibatch SGD whose update adds the
    gradient of the log loss (``sign`` 1: the bug; -1: descent). The log loss is about linear in
    the weights for misclassified rows, so ascent makes it climb steadily, roughly linearly, with
    minibatch noise, and no NaN: 0.69 -> ~2 in 100 updates at lr 0.05."""
    rng = np.random.default_rng(seed)
    n, d = 2048, 8
    X = rng.standard_normal((n, d))
    y = (X @ rng.standard_normal(d) + 0.5 * rng.standard_normal(n) > 0).astype(float)
    w = np.zeros(d)
    for _ in range(updates):
        idx = rng.choice(n, batch, replace=False)
        z = X[idx] @ w
        loss = float(np.mean(np.logaddexp(0.0, z) - y[idx] * z))
        g = X[idx].T @ (1.0 / (1.0 + np.exp(-z)) - y[idx]) / batch
        monitor.update(loss, params={"w": w}, grads={"w": g}, lr=lr)
        w = w + sign * lr * g


def noisier_targets(monitor: Any, updates: int = 400, seed: int = 0) -> None:
    """Least squares by minibatch SGD on a curriculum whose targets get noisier: after the fit
    converges (update 100), the label noise grows steadily until the loss is back at about
    where the run started (~5). The loss climbs steadily, 100x above its best, and is healthy:
    it has lost nothing it knew at the start (the data got harder, not the fit worse)."""
    rng = np.random.default_rng(seed)
    d, batch = 5, 32
    w_true = np.array([1.0, -1.0, 1.0, 1.0, -1.0])
    w = np.zeros(d)
    for t in range(updates):
        sigma = 0.1 + 1.6 * max(0, t - 100) / (updates - 100)
        X = rng.standard_normal((batch, d))
        y = X @ w_true + sigma * rng.standard_normal(batch)
        r = X @ w - y
        g = 2 * X.T @ r / batch
        monitor.update(float(np.mean(r * r)), params={"w": w}, grads={"w": g}, lr=0.05)
        w = w - 0.05 * g
