"""Real small numpy fits watched by nanscope.Monitor, shared by the report tests."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import nanscope


def least_squares_run(run_dir: Path, lr: float, updates: int = 200) -> nanscope.Monitor:
    """Mini-batch least squares with one unscaled feature; lr 0.5 diverges, 0.01 converges."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    X[:, 2] *= 10
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=200)
    w = np.zeros(3)
    mon = nanscope.Monitor(run_dir=run_dir)
    try:
        for _ in range(updates):
            batch = rng.integers(0, 200, 32)
            residual = X[batch] @ w - y[batch]
            loss = float(np.mean(residual**2))
            grad = 2 * X[batch].T @ residual / len(batch)
            mon.update(loss, params={"w": w}, grads={"w": grad}, lr=lr, inputs=X[batch],
                       targets=y[batch])
            w = w - lr * grad
    except nanscope.DivergenceError:
        pass
    mon.close()
    return mon


def nan_input_run(run_dir: Path) -> nanscope.Monitor:
    """Two parameter blocks; dataset row 300 holds a NaN, reached at update 31 (policy warn)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 3))
    y = X @ np.array([1.0, -2.0, 0.5])
    X[300, 1] = np.nan
    params = {"a": np.zeros(3), "b": np.zeros(1)}
    lr = 0.05
    mon = nanscope.Monitor(run_dir=run_dir, policy="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(40):
            idx = np.arange(step * 10, step * 10 + 10) % 400
            r = X[idx] @ params["a"] + params["b"][0] - y[idx]
            loss = float(np.mean(r**2))
            grads = {"a": 2 * X[idx].T @ r / 10, "b": np.array([2 * r.mean()])}
            mon.update(loss, params=params, grads=grads, lr=lr, inputs=X[idx], targets=y[idx],
                       index=idx)
            params = {k: params[k] - lr * grads[k] for k in params}
        mon.close()
    return mon


@pytest.fixture(scope="session")
def diverging_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("diverging") / "run"
    least_squares_run(run_dir, lr=0.5)
    return run_dir


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("healthy") / "run"
    least_squares_run(run_dir, lr=0.005, updates=60)
    return run_dir


@pytest.fixture(scope="session")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("nan") / "run"
    nan_input_run(run_dir)
    return run_dir
