"""The weights a numpy loop hands the Monitor at its first update are the initial ones (the
step comes after ``update``): their scale against a standard initialiser's is evidence about the
initialisation, measured, not guessed from the loss."""

from __future__ import annotations

import numpy as np
import pytest

import nanscope


def _poisson(monitor: nanscope.Monitor, *, scale: float) -> None:
    """Poisson regression by hand (an exp head on counts), minibatches of 32, plain SGD."""
    rng = np.random.default_rng(4)
    n, d = 256, 6
    X = rng.normal(size=(n, d))
    y = rng.poisson(np.exp(0.8 * X @ rng.normal(size=d) / np.sqrt(d))).reshape(-1, 1)
    w = rng.normal(size=(d, 1)) * scale
    b = np.zeros(1)
    with np.errstate(all="ignore"):
        for _ in range(4):
            for start in range(0, n, 32):
                xb, yb = X[start:start + 32], y[start:start + 32]
                z = xb @ w + b
                rate = np.exp(z)
                loss = np.mean(rate - yb * z)
                dz = (rate - yb) / len(xb)
                gw, gb = xb.T @ dz, dz.sum(axis=0)
                monitor.update(loss, params={"w": w, "b": b}, grads={"w": gw, "b": gb},
                               lr=0.05, inputs=xb, targets=yb)  # fmt: skip
                w -= 0.05 * gw
                b -= 0.05 * gb


def test_weights_thirty_times_too_large_are_named_from_their_measured_scale() -> None:
    # randn * 30 on 6 inputs: std(W) * sqrt(fan_in) = 73; exp of the first outputs is absurd
    # and the first step, made of that gradient, throws the weights out
    monitor = nanscope.Monitor(write=False)
    with pytest.raises(nanscope.DivergenceError):
        _poisson(monitor, scale=30.0)
    d = monitor.close()
    assert d.cause == "bad_initialization", d.evidence
    ratio = next(e.data["ratio"] for e in d.evidence if "sqrt(fan_in)" in e.text)
    assert 30 < ratio < 150
    assert d.confidence >= 0.75


def test_the_same_fit_from_a_standard_scale_is_healthy_and_says_nothing_of_the_init() -> None:
    monitor = nanscope.Monitor(write=False)
    _poisson(monitor, scale=1 / np.sqrt(6))
    d = monitor.close()
    assert d.verdict == "healthy"
    scale = monitor.evidence["initial_weight_scale"]
    assert 0.5 < scale["max_ratio"] < 2 and scale["layers"][0]["fan_in"] == 6
