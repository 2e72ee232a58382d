"""The in-process sweep API and the outcome classifier, on real numpy fits."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nanscope
from nanscope.errors import UsageError
from nanscope.experiment import FactorResult, SweepResult, classify, sweep


def _least_squares(sign: float = 1.0, steps: int = 500):
    """Least squares, Hessian's top eigenvalue about 8: lr 1.0 diverges, 0.1 descends."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)) * np.array([1.0, 1.5, 2.0])
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=64)
    calls: list[float] = []

    def fit(lr: float, monitor: nanscope.Monitor) -> None:
        calls.append(lr)
        w = np.zeros(3)
        with np.errstate(all="ignore"):
            for _ in range(steps):
                r = x @ w - y
                g = 2 * x.T @ r / len(y)
                monitor.update(float(np.mean(r**2)), params={"w": w}, grads={"w": g}, lr=lr)
                w = w - sign * lr * g

    return fit, calls


def test_diverging_fit_names_the_working_lr() -> None:
    fit, calls = _least_squares()
    result = sweep(fit, lrs=[1.0, 0.1, 0.01], updates=40)
    assert calls == [1.0, 0.1, 0.01]
    assert isinstance(result, SweepResult)
    one, tenth, hundredth = (result.result_for(f) for f in (1.0, 0.1, 0.01))
    assert one.outcome == "diverged" and one.at_update is not None and one.at_update <= 10
    # the sweep stopped the diverging fit early, at its first non-finite loss at the latest
    assert one.updates <= 40
    assert tenth.outcome == "descended" and tenth.updates == 40 and tenth.complete
    assert hundredth.outcome == "descended"
    assert tenth.best_loss is not None and tenth.best_loss < 0.1 * tenth.losses[0]
    assert result.recommended_lr == 0.1
    assert result.recommended_factor == pytest.approx(0.1)
    assert result.text() == (
        f"lr 1.0 diverged at update {one.at_update}; 0.1 descended; 0.01 descended; use 0.1"
    )
    data = result.to_dict()
    assert data["recommended_lr"] == 0.1
    assert [r["outcome"] for r in data["results"]] == ["diverged", "descended", "descended"]
    assert len(data["results"][1]["losses"]) == 40


def test_sign_error_ascends_at_every_lr() -> None:
    fit, _ = _least_squares(sign=-1.0)
    result = sweep(fit, lrs=[1.0, 0.1, 0.01], updates=30)
    assert result.recommended_lr is None
    assert result.every_factor_ascends
    assert all(r.outcome in ("diverged", "ascended") for r in result.results)
    assert "check the sign of the update" in result.text()


def test_the_fit_is_stopped_after_n_updates_even_when_it_would_run_longer() -> None:
    fit, _ = _least_squares(steps=10_000)
    result = sweep(fit, lrs=[0.05], updates=7)
    assert result.results[0].updates == 7


def test_a_fit_that_ends_early_is_reported_with_the_updates_it_made() -> None:
    fit, _ = _least_squares(steps=12)
    result = sweep(fit, lrs=[0.1], updates=50)
    r = result.results[0]
    assert r.updates == 12 and not r.complete
    assert r.outcome == "descended"
    assert "12 of 50 updates" in r.phrase()


def test_a_fit_that_raises_is_an_error_outcome() -> None:
    def fit(lr: float, monitor: nanscope.Monitor) -> None:
        monitor.update(1.0, lr=lr)
        raise KeyError("batch")

    result = sweep(fit, lrs=[0.1, 0.01], updates=5)
    assert [r.outcome for r in result.results] == ["error", "error"]
    assert "KeyError" in (result.results[0].error or "")
    assert result.recommended_lr is None


@pytest.mark.parametrize(
    ("lrs", "updates"),
    [([0.0], 5), ([-1.0], 5), (["a"], 5), ([], 5), ([math.nan], 5), ([0.1], 0), ([0.1], 2.5)],
)
def test_bad_arguments(lrs: list, updates: object) -> None:
    fit, _ = _least_squares()
    with pytest.raises(UsageError):
        sweep(fit, lrs=lrs, updates=updates)  # type: ignore[arg-type]


def test_a_fit_that_never_reports_an_update_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"monitor\.update"):
        sweep(lambda lr, monitor: None, lrs=[0.1], updates=5)


def test_nanscope_sweep_is_the_same_function() -> None:
    from nanscope.experiment import sweep as direct

    assert nanscope.sweep is direct


def test_public_api() -> None:
    import nanscope.experiment as ex

    wanted = {"sweep", "SweepResult", "FactorResult", "run_experiment", "lr_factor"}
    assert set(ex.__all__) >= wanted
    for name in ex.__all__:
        assert hasattr(ex, name)


# ------------------------------------------------------------------ classify


def _geometric(start: float, ratio: float, n: int) -> list[float]:
    return [start * ratio**i for i in range(n)]


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e9])
def test_classify_is_scale_free(scale: float) -> None:
    descending = [scale * (1 + 1 / (i + 1)) for i in range(40)]
    assert classify(descending) == ("descended", None)
    flat = [scale * (1 + 1e-4 * math.sin(i)) for i in range(40)]
    assert classify(flat) == ("flat", None)
    rising = [scale * (1 + 0.01 * i) for i in range(40)]  # steady, linear: not geometric
    assert classify(rising) == ("ascended", None)
    outcome, at = classify([scale * v for v in _geometric(1.0, 1.5, 20)])
    assert outcome == "diverged" and at == 5


def test_classify_nonfinite_with_and_without_growth() -> None:
    assert classify([math.nan, math.nan]) == ("nonfinite", 1)
    # descending, then a sudden NaN: non-finite, not a divergence
    assert classify([4.0, 3.0, 2.0, 1.5, math.nan]) == ("nonfinite", 5)
    # growing, then inf: diverged (where the growth was confirmed)
    assert classify([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, math.inf]) == ("diverged", 5)
    # a short rise straight into inf also counts as a divergence, at the first inf
    assert classify([1.0, 1.5, 40.0, math.inf]) == ("diverged", 4)


def test_classify_uses_a_monitor_alarm_when_it_is_earlier() -> None:
    curve = _geometric(1.0, 1.5, 20)
    assert classify(curve, alarm_kind="diverging", alarm_step=3) == ("diverged", 3)


def test_classify_negative_losses() -> None:
    # a log-likelihood style loss that descends below zero
    assert classify([1.0 - 0.2 * i for i in range(30)])[0] == "descended"
    # a negative loss climbing geometrically
    assert classify([-100.0 + 2.0**i for i in range(12)])[0] == "diverged"


def test_factor_result_to_dict_is_strict_json() -> None:
    import json

    r = FactorResult(factor=1.0, lr=0.5, outcome="nonfinite", at_update=2, updates=2, requested=5,
                     losses=[1.0, math.nan])  # fmt: skip
    text = json.dumps(r.to_dict(), allow_nan=False)
    assert '"nan"' in text and r.best_loss == 1.0 and not r.complete


def _poly_sgd_losses(lr: float, updates: int = 300) -> list[float]:
    """A real minibatch fit with a very noisy loss: a degree-4 polynomial regression on random
    batches of 32 (x^4 of normal draws is heavy-tailed), SGD at ``lr``."""
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=4)
    w = np.zeros(4)
    losses = []
    for _ in range(updates):
        x = rng.normal(size=32)
        features = np.stack([x, x**2, x**3, x**4], axis=1)
        r = features @ w - features @ w_true
        losses.append(float(np.mean(r**2)))
        with np.errstate(all="ignore"):
            w = w - lr * 2 * features.T @ r / 32
        if not np.all(np.isfinite(w)):
            break
    return losses


def test_a_noisy_minibatch_loss_that_descends_is_not_called_diverged() -> None:
    # four rises in a row happen by chance in this loss; growth must also clear its recent range
    assert classify(_poly_sgd_losses(0.002))[0] == "descended"
    assert classify(_poly_sgd_losses(0.05))[0] in ("diverged", "nonfinite")


def _relu_net_on_raw_units():
    """A one-hidden-layer ReLU net on a feature in dollars (mean 5000): a large step kills most
    units and throws the output bias far out, and the loss then falls slowly from there."""
    rng = np.random.default_rng(0)
    n = 256
    x = np.column_stack([rng.normal(5000, 1000, n), rng.normal(size=n), rng.normal(size=n)])
    y = 0.002 * x[:, 0] + x[:, 1] + 0.1 * rng.normal(size=n)

    def fit(lr: float, monitor: nanscope.Monitor) -> None:
        init = np.random.default_rng(1)
        w1, b1 = init.normal(size=(3, 16)) / np.sqrt(3), np.zeros(16)
        w2, b2 = init.normal(size=16) / 4, np.zeros(1)
        with np.errstate(all="ignore"):
            for _ in range(200):
                h = x @ w1 + b1
                a = np.maximum(h, 0)
                r = a @ w2 + b2 - y
                gp = 2 * r / n
                ga = np.outer(gp, w2) * (h > 0)
                grads = {"w1": x.T @ ga, "b1": ga.sum(0), "w2": a.T @ gp,
                         "b2": gp.sum(keepdims=True)}
                monitor.update(float(np.mean(r * r)), params={"w1": w1, "b1": b1, "w2": w2,
                                                              "b2": b2}, grads=grads, lr=lr)
                w1, b1 = w1 - lr * grads["w1"], b1 - lr * grads["b1"]
                w2, b2 = w2 - lr * grads["w2"], b2 - lr * grads["b2"]

    return fit


def test_a_loss_that_jumped_and_then_fell_is_never_called_descended() -> None:
    # lr 1e-3 throws the loss from 2.7e3 to 2.8e17 in one update, and it then falls for the rest
    # of the run to ~1e11: its last quarter sits far below its first, and it ended far above
    # where it started. 1e-5 jumps to 1e10 and comes back below its start. Only 1e-8 trains.
    result = sweep(_relu_net_on_raw_units(), lrs=[1e-3, 1e-5, 1e-8], updates=40)
    outcomes = [result.result_for(f).outcome for f in (1.0, 1e-2, 1e-5)]
    assert outcomes[0] == "diverged"
    assert outcomes[1] != "descended"
    assert outcomes[2] == "descended"
    assert result.recommended_lr == 1e-8


class _Recorder:
    """Stands in for a Monitor: keeps the losses, stops nothing (what a log would hold)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def update(self, loss: float, **_: object) -> None:
        self.losses.append(loss)


def test_classify_judges_the_end_against_the_start_not_the_quarters() -> None:
    fit = _relu_net_on_raw_units()
    curves = {}
    for lr in (1e-3, 1e-5, 1e-8):
        recorder = _Recorder()
        fit(lr, recorder)  # type: ignore[arg-type]
        curves[lr] = recorder.losses
    # the unwatched curves: 1e-3 ends ~1e8 times its start after a 1e14 jump, still falling
    assert curves[1e-3][-1] > 1e6 * curves[1e-3][0] and curves[1e-3][-1] < curves[1e-3][60]
    assert classify(curves[1e-3])[0] == "diverged"
    assert classify(curves[1e-5])[0] != "descended"
    assert classify(curves[1e-8][:40])[0] == "descended"
