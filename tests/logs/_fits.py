"""The real fits the log tests print in each framework's format."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


def least_squares_losses(
    steps: int, lr: float, scales: Sequence[float], seed: int = 0
) -> list[float]:
    """Per-update losses of least squares by gradient descent on features of the given scales.

    Unscaled features make a too-large lr diverge: the loss grows, then reaches inf/NaN.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, 3)) * np.asarray(scales, dtype=float)
    y = x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=64)
    w = np.zeros(3)
    losses = []
    with np.errstate(all="ignore"):
        for _ in range(steps):
            residual = x @ w - y
            losses.append(float(np.mean(residual**2)))
            w = w - lr * 2 * x.T @ residual / len(y)
    return losses


@dataclass
class Fit:
    """One fit, update by update: the loss, the gradient norm, the lr the update used, and for
    a mixed-precision fit the loss scale after the update and whether the scaler skipped it."""

    loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.loss)


def classifier(steps: int, lr: float = 0.5, seed: int = 0, bad_batch: int | None = None,
               warmup: int = 0, decay: bool = True) -> Fit:  # fmt: skip
    """Minibatch softmax regression on 10 classes (the loss starts near ln 10 = 2.3 and falls).

    ``bad_batch``: that update's batch holds a NaN feature (a failed join): its loss and
    gradient are NaN, and so are the weights from then on. ``warmup`` / ``decay``: a linear
    warm-up then a linear decay of the lr, updated every step (a scheduler).
    """
    rng = np.random.default_rng(seed)
    d, k, batch = 20, 10, 32
    centers = rng.normal(size=(k, d)) * 1.5
    labels = rng.integers(0, k, size=steps * batch)
    X = centers[labels] + rng.normal(size=(steps * batch, d))
    if bad_batch is not None:
        X[bad_batch * batch + 3, 5] = np.nan
    W = np.zeros((d, k))
    fit = Fit()
    with np.errstate(all="ignore"):
        for t in range(steps):
            xb = X[t * batch : (t + 1) * batch]
            yb = labels[t * batch : (t + 1) * batch]
            z = xb @ W
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
            loss = float(-np.mean(np.log(p[np.arange(batch), yb])))
            p[np.arange(batch), yb] -= 1
            g = xb.T @ p / batch
            rate = lr
            if warmup and t < warmup:
                rate = lr * (t + 1) / warmup
            elif decay:
                rate = lr * (1 - (t - warmup) / (steps - warmup + 1))
            fit.loss.append(loss)
            fit.grad_norm.append(float(np.linalg.norm(g)))
            fit.lr.append(rate)
            W = W - rate * g
    return fit


def scaled_fp16(steps: int, lr: float, seed: int = 0, scale: float = 2.0**16,
                growth_interval: int = 2000, min_scale: float = 0.0,
                feature_scale: float = 1.0) -> Fit:  # fmt: skip
    """Least squares whose gradients are computed in float16 from a scaled loss, with a dynamic
    loss scaler (as torch.amp.GradScaler, apex and DeepSpeed do): when the scaled gradient holds
    an inf, the step is skipped and the scale halved; after ``growth_interval`` good steps it is
    doubled. Features ``feature_scale`` times larger make the true gradients larger: past 65504
    they overflow float16 at any scale and the scaler halves its scale to the floor.
    The lr is a linear decay stepped only when the optimizer stepped (as the Hugging Face
    Trainer steps its scheduler)."""
    rng = np.random.default_rng(seed)
    n, d = 256, 8
    X = rng.normal(size=(n, d)) * feature_scale
    y = X @ rng.normal(size=d) + 0.1 * rng.normal(size=n)
    w = np.zeros(d)
    fit = Fit()
    good = 0
    stepped = 0
    with np.errstate(all="ignore"):
        for _ in range(steps):
            r = X @ w - y
            loss = float(np.mean(r * r))
            if abs(loss) > 65504:
                loss = float(np.float16(loss))  # the forward pass in half precision: inf
            g = 2 * X.T @ r / n
            scaled = (g * scale).astype(np.float16)  # the backward pass in half precision
            if not np.isfinite(loss):
                scaled[:] = np.nan  # the gradient of an inf loss is NaN
            rate = lr * (1 - stepped / (steps + 1))
            fit.loss.append(loss)
            fit.lr.append(rate)
            if not np.all(np.isfinite(scaled)):
                fit.skipped.append(True)
                fit.grad_norm.append(float("nan"))
                scale = max(scale / 2, min_scale)
                good = 0
            else:
                unscaled = scaled.astype(np.float64) / scale
                fit.skipped.append(False)
                fit.grad_norm.append(float(np.linalg.norm(unscaled)))
                w = w - rate * unscaled
                stepped += 1
                good += 1
                if good >= growth_interval:
                    scale *= 2
                    good = 0
            fit.scale.append(scale)
    return fit


def separable_fp16(steps: int, lr: float, seed: int = 0, scale: float = 2.0**16) -> Fit:
    """Logistic regression on separable data with the forward pass in float16 and a naive
    sigmoid ``1 / (1 + exp(-z))``, under a dynamic loss scaler, its scheduler stepped only when
    the optimizer stepped (the Hugging Face Trainer's way). The weights grow as the data
    separates; once a score passes -11, ``exp`` overflows float16, the loss is inf on every
    batch, every step is skipped and the weights (and the lr) stay where they were."""
    rng = np.random.default_rng(seed)
    n = 128
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(float)
    X += np.where(y[:, None] > 0, 0.8, -0.8)
    w = np.zeros(2)
    fit = Fit()
    stepped = 0
    with np.errstate(all="ignore"):
        for _ in range(steps):
            z = (X @ w).astype(np.float16)
            p = np.float16(1) / (np.float16(1) + np.exp(-z))  # float16 exp overflows past 11
            loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
            g = X.T @ (p.astype(np.float64) - y) / n
            scaled = (g * scale).astype(np.float16)
            rate = lr * (1 - stepped / (steps + 1))
            fit.loss.append(loss)
            fit.lr.append(rate)
            if not (np.isfinite(loss) and np.all(np.isfinite(scaled))):
                fit.skipped.append(True)
                fit.grad_norm.append(float("nan"))
                scale /= 2
            else:
                fit.skipped.append(False)
                fit.grad_norm.append(float(np.linalg.norm(g)))
                w = w - rate * g
                stepped += 1
            fit.scale.append(scale)
    return fit
