"""Thresholds are scale-free: big healthy numbers stay healthy; real failures are told apart."""

from __future__ import annotations

import numpy as np
import pytest

import nanscope


def _linreg(
    scale: float, lr: float, steps: int = 150, noise: float = 0.0, batch: int | None = None
):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 6))
    y = scale * (X @ rng.normal(size=6)) + noise * scale * rng.normal(size=400)
    w = np.zeros(6)
    mon = nanscope.Monitor(write=False)
    for _ in range(steps):
        idx = rng.choice(400, batch, replace=False) if batch else np.arange(400)
        r = X[idx] @ w - y[idx]
        g = 2 * X[idx].T @ r / len(idx)
        mon.update(np.mean(r**2), params={"w": w}, grads={"w": g}, lr=lr, inputs=X[idx],
                   targets=y[idx], index=idx)  # fmt: skip
        w = w - lr * g
    return mon.close()


def test_a_loss_of_1e10_that_falls_is_healthy():
    diagnosis = _linreg(scale=1e5, lr=0.05)
    assert diagnosis.verdict == "healthy"
    assert diagnosis.summary["first_loss"] > 1e9


def test_large_gradient_norms_can_be_normal():
    diagnosis = _linreg(scale=300.0, lr=0.02, noise=0.5, batch=16, steps=300)
    assert diagnosis.verdict == "healthy"


def test_too_large_step_on_the_same_fit_is_caught():
    with pytest.raises(nanscope.DivergenceError) as info:
        _linreg(scale=1e5, lr=1.5)
    assert info.value.diagnosis.cause == "step_size_too_large"
    assert info.value.diagnosis.verdict == "diverging"  # stopped before any inf
