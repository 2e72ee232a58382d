"""Each rule's measured fingerprint, read directly: what the rule measured on a real fit, before any
scoring or wording.

A rule is ``fingerprint(ctx)`` (a small frozen dataclass of numbers, indices and flags, or None when
its shape is not there) and the wording that turns it into a Finding. The contexts here are what
the engine saw: a trace a Monitor recorded from a real fit, with the probes' evidence, either read
from the rule fixtures (``fixtures/record.py``; the torch fits among them), recorded live from a
numpy fit run here, or read from a framework log printed from a real fp16 fit
(``tests/logs/fixtures/write.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.diagnose._fits import adam_mlp, logreg_ascent, resumed_sgd

import nanscope
from nanscope.diagnose.context import Context
from nanscope.diagnose.rules import D001_step_size_too_large as d001
from nanscope.diagnose.rules import D002_nonfinite_input as d002
from nanscope.diagnose.rules import D003_update_sign_error as d003
from nanscope.diagnose.rules import D004_extreme_batch as d004
from nanscope.diagnose.rules import D005_log_of_zero as d005
from nanscope.diagnose.rules import D006_exploding_gradients as d006
from nanscope.diagnose.rules import D007_zero_division as d007
from nanscope.diagnose.rules import D008_fp16_overflow as d008
from nanscope.diagnose.rules import D009_bad_initialization as d009
from nanscope.diagnose.rules import D010_bad_initialization as d010
from nanscope.diagnose.rules import D011_step_size_too_large as d011
from nanscope.diagnose.rules import D012_step_size_too_large as d012
from nanscope.logs import load_trace
from nanscope.trace import Trace, read_trace

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def recorded(stem: str, fixed: bool = False) -> Context:
    """The context of a rule fixture: the trace a Monitor recorded from a real fit (the fixed fit
    with ``fixed``) and the evidence the probes gave the engine."""
    name = f"{stem}{'.fixed' if fixed else ''}"
    evidence = json.loads((FIXTURES / f"{name}.evidence.json").read_text())
    return Context(read_trace(FIXTURES / f"{name}.jsonl"), evidence)


def watched(fit: Callable[..., Any], *args: Any, **kwargs: Any) -> Context:
    """The context the engine got when a Monitor first diagnosed ``fit`` (where it stopped the
    fit, or at its close)."""
    engine = importlib.import_module("nanscope.diagnose")  # the Monitor looks it up here
    real = engine.diagnose
    seen: list[Context] = []

    def spy(trace: Any, evidence: Any = None) -> Any:
        seen.append(Context(Trace(trace.records, trace.meta), evidence))  # as it was then
        return real(trace, evidence)

    monitor = nanscope.Monitor(write=False)
    engine.diagnose = spy
    try:
        with contextlib.suppress(nanscope.DivergenceError):  # the Monitor stopped the fit
            fit(monitor, *args, **kwargs)
        monitor.close()
    finally:
        engine.diagnose = real
    assert seen, "the Monitor never diagnosed the fit"
    return seen[0]


def test_fingerprints_are_frozen() -> None:
    found = d002.fingerprint(recorded("D002_nonfinite_input"))
    assert dataclasses.is_dataclass(found)
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.batch = 0  # type: ignore[misc, union-attr]


# --------------------------------------------------------------------------- D001


def test_d001_measures_a_geometric_climb_that_oscillates_downhill() -> None:
    ctx = recorded("D001_step_size_too_large")  # an unscaled salary column at lr 1e-8
    found = d001.growth(ctx)
    assert found is not None and found.at == ctx.stop
    assert found.rise.length >= 2 and found.rise.growth > 1e6  # the loss multiplied
    assert found.gradients >= 1 and found.reversed == found.gradients and found.reversal == 1.0
    assert found.median_grad_cos < -0.99  # each gradient points against the one before
    assert found.max_flip is not None and found.max_flip >= 0.2  # the weights flip sign
    assert found.min_update_cos is not None and found.min_update_cos < 0  # still downhill
    assert not found.extreme_jump


def test_d001_the_same_climb_is_an_explosion_of_its_first_step_from_zero_weights() -> None:
    ctx = recorded("D001_step_size_too_large")
    found = d001.explosion(ctx)
    assert found is not None
    assert found.factor == found.after / found.before >= d001.EXPLOSION_JUMP
    assert found.before == found.start == ctx.loss[0]  # the very first step threw it
    # from weights at zero every first step moves them by all of their norm: no measure of it
    assert found.moved is None and not found.extreme


def test_d001_an_explosion_into_an_extreme_row_says_so() -> None:
    found = d001.explosion(recorded("D004_extreme_batch"))
    assert found is not None and found.extreme  # the row threw it, not the step size
    assert found.moved is not None and found.moved < 0.1  # the step before it was ordinary


def test_d001_measures_adam_jumping_to_a_plateau() -> None:
    ctx = watched(adam_mlp, 3.0)  # each update moves every weight by about lr
    found = d001.departure(ctx)
    assert found is not None and found.at == ctx.stop and not found.ended
    jump = found.jump
    assert jump["jump_updates"] <= 3 and jump["factor"] >= 3 and not jump["climb"]
    assert jump["plateau"] >= 3 * jump["best"]
    assert found.update_ratio is not None and found.update_ratio[0] >= d001.LARGE_UPDATE
    assert not (found.steady or found.extreme or found.uphill)


def test_d001_a_steady_climb_whose_updates_point_downhill_is_no_sign_error() -> None:
    ctx = watched(resumed_sgd, 1.003)  # just past the stability limit, under minibatch noise
    found = d001.departure(ctx)
    assert found is not None and found.jump["climb"]
    assert found.steady and found.downhill and not found.uphill
    assert found.directions >= 3 and found.downhill_share > 0.8 and found.median_update_cos < 0
    assert found.update_ratio is not None and found.update_ratio[1] is not None
    assert found.update_ratio[0] > found.update_ratio[1]  # the steps grew as it left


def test_d001_finds_nothing_in_healthy_fits() -> None:
    for ctx in (recorded("D001_step_size_too_large", fixed=True), watched(adam_mlp, 1e-2)):
        assert d001.growth(ctx) is None
        assert d001.departure(ctx) is None
        assert d001.explosion(ctx) is None


# --------------------------------------------------------------------------- D002


def test_d002_names_the_batch_and_the_row_that_held_the_nan() -> None:
    ctx = recorded("D002_nonfinite_input")  # row 203 of the data has a NaN feature
    found = d002.fingerprint(ctx)
    assert isinstance(found, d002.BadBatch)
    assert found.fail == ctx.fail and found.batch == found.fail  # that row's own batch
    assert (found.inputs, found.targets) == (1, 0)
    assert [(r["dataset_row"], r["column"]) for r in found.rows] == [(203, 2)]
    assert found.made is None and found.columns == ()  # read from the data, one row, not computed


def test_d002_is_silent_on_the_imputed_fit() -> None:
    assert d002.fingerprint(recorded("D002_nonfinite_input", fixed=True)) is None


def _nan_in_unrecorded_data(monitor: Any) -> None:
    """Least squares on data with one missing value; the Monitor is not given the inputs."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 3))
    X[5, 1] = np.nan
    y = X @ np.array([1.0, -1.0, 0.5])
    w = np.zeros(3)
    for _ in range(5):
        r = X @ w - y
        g = 2 * X.T @ r / 64
        monitor.update(float(np.mean(r * r)), params={"w": w}, grads={"w": g}, lr=0.1)
        w = w - 0.1 * g


def test_d002_suspects_the_data_of_a_first_update_that_broke_unchecked() -> None:
    ctx = watched(_nan_in_unrecorded_data)
    found = d002.fingerprint(ctx)
    assert isinstance(found, d002.UncheckedStart)
    assert found.loss_nonfinite and math.isnan(found.loss)


# --------------------------------------------------------------------------- D003


def test_d003_measures_updates_that_point_along_the_gradient() -> None:
    ctx = recorded("D003_update_sign_error")  # linear regression updated with w + lr * g
    found = d003.fingerprint(ctx)
    assert found is not None and found.directed
    assert found.along == 1.0 and found.median_update_cos > d003.EXACTLY_ALONG
    assert found.rises == found.compared >= 4 and found.rising == 1.0
    assert found.last > found.first


def test_d003_a_noisy_minibatch_ascent_is_read_from_its_directions() -> None:
    found = d003.fingerprint(watched(logreg_ascent))  # log loss climbs roughly linearly
    assert found is not None and found.directed and found.along >= 0.8
    assert found.median_update_cos > 0.3 and found.last > found.first


def test_d003_is_silent_on_descent() -> None:
    assert d003.fingerprint(watched(logreg_ascent, sign=-1.0)) is None
    assert d003.fingerprint(recorded("D003_update_sign_error", fixed=True)) is None


# --------------------------------------------------------------------------- D004


def test_d004_measures_the_descent_the_jump_and_the_extreme_row() -> None:
    ctx = recorded("D004_extreme_batch")  # row 1000 of a feature is 3e18, in batch 32
    found = d004.fingerprint(ctx)
    assert found is not None
    assert found.broke and found.spike == ctx.fail and found.at == ctx.fail
    assert found.onset <= found.spike and found.descended
    losses = ctx.loss[: found.onset]
    assert found.first == losses[0] and found.last == losses[-1] < found.first
    assert found.ratio > 1e30 and found.jumped_to > 1e30 and not found.filtered
    assert [r["dataset_row"] for r in found.rows] == [1000]
    assert found.rows[0]["z"] > 1e15
    assert found.inputs_measured and found.overflow is None  # numpy: no op was located


def test_d004_is_silent_once_the_row_is_fixed() -> None:
    assert d004.fingerprint(recorded("D004_extreme_batch", fixed=True)) is None


# --------------------------------------------------------------------------- D005


def test_d005_follows_the_log_numpy_saw_take_zero() -> None:
    ctx = recorded("D005_log_of_zero")  # log(sigmoid) on separable data: the sigmoid rounds to 1
    found = d005.fingerprint(ctx)
    assert found is not None and found.producer is not None
    assert found.log and found.producer.op == "log" and found.producer.observed
    assert found.input_zero and not found.computed and not found.other_op
    assert found.fail == ctx.fail and math.isnan(found.loss) and not found.filtered
    assert found.grad_measured and math.isfinite(found.grad_norm)
    assert found.weights_seen and found.inputs_seen
    assert found.weights is not None and found.weights[1] > 3 * found.weights[0]  # they grew


def _separable_logreg_silenced(monitor: Any) -> None:
    """float32 logistic regression with log(sigmoid) on separable data, floating-point errors
    silenced: no op is located, the loss turns NaN while the gradient stays finite."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((200, 2)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(np.float32)
    X = (X + np.where(y[:, None] > 0, 1.5, -1.5).astype(np.float32)) * np.float32(4.0)
    w = np.zeros(2, np.float32)
    for _ in range(80):
        with np.errstate(all="ignore"):
            p = (1 / (1 + np.exp(-(X @ w)))).astype(np.float32)
            loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
        g = (X.T @ (p - y) / np.float32(200)).astype(np.float32)
        monitor.update(loss, params={"w": w}, grads={"w": g}, lr=5.0, inputs=X, targets=y)
        w = (w - np.float32(5.0) * g).astype(np.float32)


def test_d005_without_a_located_op_measures_what_was_finite_beside_the_loss() -> None:
    ctx = watched(_separable_logreg_silenced)
    found = d005.fingerprint(ctx)
    assert found is not None
    assert found.producer is None and not found.log and found.located == {}
    assert not math.isfinite(found.loss)
    assert found.grad_measured and math.isfinite(found.grad_norm)
    assert found.weights_seen and found.inputs_seen


def test_d005_is_silent_on_the_loss_computed_from_logits() -> None:
    assert d005.fingerprint(recorded("D005_log_of_zero", fixed=True)) is None


# --------------------------------------------------------------------------- D006


def test_d006_measures_the_gradient_running_ahead_of_the_loss() -> None:
    ctx = recorded("D006_exploding_gradients")  # a tanh RNN, recurrent gain 3, longer sequences
    found = d006.fingerprint(ctx)
    assert found is not None
    assert found.fail is None and found.at == found.peak  # a finished run: the peak is named
    g = ctx.trace.column("grad_norm")
    assert found.norm == g[found.peak] == np.nanmax(g)
    assert found.ratio == found.norm / found.reference >= 1e3 and not found.from_start
    assert found.loss_ratio < 1 and not found.elastic  # the loss did not follow
    assert not (found.grad_first or found.sudden or found.extreme_rows or found.scaler_collapsed)
    assert found.overflow is None and found.clip is None  # no float32 overflow, no clipping
    assert found.layer is not None and found.layer.name == "W_rec"
    assert found.layer.share > 0.5 and found.layer.growth > 1e3


def test_d006_an_extreme_row_that_throws_loss_and_gradient_together_is_elastic() -> None:
    found = d006.fingerprint(recorded("D004_extreme_batch"))
    assert found is not None and found.extreme_rows
    assert found.loss_ratio > 1 and found.elastic  # the loss grew like the gradient's square


def test_d006_is_silent_on_a_contracting_recurrence() -> None:
    assert d006.fingerprint(recorded("D006_exploding_gradients", fixed=True)) is None


# --------------------------------------------------------------------------- D007


def test_d007_measures_the_root_whose_gradient_met_zero() -> None:
    ctx = recorded("D007_zero_division")  # a siamese distance sqrt(sum((a - b)^2)), a == b
    found = d007.fingerprint(ctx)
    assert found is not None and found.fail == ctx.fail
    assert (found.family, found.phase) == ("root", "backward")
    assert found.producer.op == "SqrtBackward0" and found.producer.forward_op == "sqrt"
    assert found.producer.observed and found.zero and not found.computed
    assert found.located == ctx.located and found.located["module"] == "Siamese"
    assert found.flushed_eps is None  # float32: an eps is an eps


def test_d007_is_silent_with_an_epsilon_under_the_root() -> None:
    assert d007.fingerprint(recorded("D007_zero_division", fixed=True)) is None


def _standardised_per_batch(monitor: Any) -> None:
    """Least squares on batches standardised in the training loop; one column is constant, so
    its std is 0 and the division fills it with NaN (0/0) in every row."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((256, 3))
    X[:, 2] = 1.0
    y = X[:, 0] - X[:, 1]
    w = np.zeros(3)
    for t in range(8):
        idx = np.arange(32 * t, 32 * t + 32)
        Xb = (X[idx] - X[idx].mean(0)) / X[idx].std(0)  # numpy's error names the division
        r = Xb @ w - y[idx]
        g = 2 * Xb.T @ r / 32
        monitor.update(float(np.mean(r * r)), params={"w": w}, grads={"w": g}, lr=0.1,
                       inputs=Xb, targets=y[idx])  # fmt: skip
        w = w - 0.1 * g


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
def test_a_division_in_the_loop_is_computed_for_d007_and_made_for_d002() -> None:
    ctx = watched(_standardised_per_batch)
    found = d007.fingerprint(ctx)
    assert found is not None
    assert (found.family, found.phase) == ("division", "preprocess")
    assert found.zero and found.computed and found.nan_loss
    batch = d002.fingerprint(ctx)
    assert isinstance(batch, d002.BadBatch)
    assert batch.inputs == 32 and {r["column"] for r in batch.rows} == {2}
    assert batch.made is not None and batch.made.op == found.producer.op  # not the data's fault


# --------------------------------------------------------------------------- D008

LOGS = FIXTURES.parents[1] / "logs" / "fixtures"  # framework logs printed from real fp16 fits


def test_d008_measures_the_op_recomputed_past_the_half_range() -> None:
    found = d008.fingerprint(recorded("D008_fp16_overflow"))  # exp(score) in float16
    assert found is not None and found.producer is not None
    assert (found.kind, found.dtype) == ("recomputed", "float16")
    assert found.producer.op == "exp" and found.producer.observed
    precision = found.producer.precision or {}
    assert precision["value"] > precision["limit"] == 65504.0  # finite when run in float32
    assert not (found.scale.telling or found.scale.scales or found.scale.skipped)


def test_d008_is_silent_with_exp_in_float32() -> None:
    assert d008.fingerprint(recorded("D008_fp16_overflow", fixed=True)) is None


def test_d008_reads_a_scale_halved_to_the_floor_from_a_megatron_log() -> None:
    found = d008.fingerprint(Context(load_trace(LOGS / "megatron_skipped.log")))
    assert found is not None and found.kind is None and found.producer is None  # no op located
    scale = found.scale
    assert scale.collapse and scale.collapsed and scale.telling and not scale.settled
    assert max(scale.scales) == 2**14 and scale.scales[-1] == 1.0 and scale.halvings == 14.0


def test_d008_reads_the_minimum_scale_line_of_a_deepspeed_log() -> None:
    scale = d008.scale_story(Context(load_trace(LOGS / "deepspeed_minimum.log")))
    assert scale.minimum and scale.minimum[0]["kind"] == "loss_scale_min"
    assert scale.overflows >= d008.HALVINGS and scale.telling


def test_d008_a_scaler_that_found_its_scale_and_trained_on_is_no_story() -> None:
    ctx = Context(load_trace(LOGS / "deepspeed_calibration.log"))
    scale = d008.scale_story(ctx)
    assert scale.overflows > 0 and scale.settled and not scale.telling
    assert d008.fingerprint(ctx) is None


# --------------------------------------------------------------------------- D009


def test_d009_measures_the_first_forward_of_weights_scaled_up() -> None:
    ctx = recorded("D009_bad_initialization")  # a 12-layer MLP, every initial weight x100
    found = d009.fingerprint(ctx)
    assert found is not None
    assert found.fail == 0 and found.first_forward and not found.half_only
    assert math.isinf(found.first_loss)
    assert found.overflow is not None and found.overflow.observed
    assert found.overflow.phase == "loss" and found.overflow.past_range()
    acts = found.activations
    assert acts is not None and acts.growth >= d009.GROWTH and acts.layers >= 12
    assert acts.median_ratio > 10  # each layer multiplies the scale, it does not add to it
    scale = found.weight_scale
    assert scale is not None and scale.ratio >= d009.SCALE_FAR
    assert scale.layer["param"].endswith("weight") and scale.layer["fan_in"] == 32


def test_d009_is_silent_on_the_default_initialisation() -> None:
    assert d009.fingerprint(recorded("D009_bad_initialization", fixed=True)) is None


def _relu_stack_times_1e4(monitor: Any) -> None:
    """A float32 ReLU stack whose initial weights are 1e4 times a standard scale: the first
    squared error overflows, on clean standardised inputs."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 8)).astype(np.float32)
    y = X @ rng.standard_normal(8).astype(np.float32)
    P = {f"W{k}": (1e4 * rng.standard_normal((8, 8))).astype(np.float32) for k in range(6)}
    for _ in range(3):
        a = X
        for k in range(6):
            a = np.maximum(a @ P[f"W{k}"], 0)
        r = a.sum(1) - y
        loss = float(np.mean(r * r))  # numpy's overflow error names the multiply
        g = {k: np.zeros_like(v) for k, v in P.items()}
        monitor.update(loss, params=P, grads=g, lr=1e-3, inputs=X, targets=y)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_d009_a_first_update_that_broke_on_clean_inputs_measures_the_initial_weights() -> None:
    # no layer outputs are measured in a numpy loop, but the weights it handed the Monitor at
    # its first update are the initial ones: their scale is read there
    found = d009.fingerprint(watched(_relu_stack_times_1e4))
    assert found is not None
    assert found.fail == 0 and found.first_forward and math.isinf(found.first_loss)
    assert found.located["op"] == "multiply"  # seen, but numpy does not say it ran in the model
    assert found.overflow is None and found.activations is None
    assert found.weight_scale is not None and found.weight_scale.ratio >= d009.SCALE_FAR


def test_d009_a_log_of_zero_on_the_second_update_is_not_the_initialisers() -> None:
    ctx = recorded("D005_log_of_zero")
    assert ctx.fail is not None and ctx.fail < d009.EARLY
    assert d009.fingerprint(ctx) is None



# --------------------------------------------------------------------------- D010


def test_d010_measures_a_start_orders_of_magnitude_off_that_never_recovered() -> None:
    ctx = recorded("D010_bad_initialization")  # a ReLU MLP whose initial weights are x30
    found = d010.fingerprint(ctx)
    assert found is not None
    assert found.first_loss == ctx.loss[0] >= d010.ABSURD
    assert found.first_grad >= d010.ABSURD
    assert found.later == ctx.n - 1 and found.best is not None
    assert found.best > found.first_loss / d010.FELL  # it did not come down


def _large_targets_that_learn(monitor: Any) -> None:
    """Least squares on targets in the tens of thousands (not given to the Monitor): the first
    loss is ~4e9, and the fit learns it down to below 1."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((256, 4))
    y = 1e4 * (X @ np.array([1.0, -2.0, 0.5, 3.0])) + 5e4
    w, b = np.zeros(4), np.zeros(1)
    for _ in range(60):
        r = X @ w + b - y
        gw, gb = 2 * X.T @ r / 256, 2 * r.mean(keepdims=True)
        monitor.update(float(np.mean(r * r)), params={"w": w, "b": b}, grads={"w": gw, "b": gb},
                       lr=0.1)  # fmt: skip
        w, b = w - 0.1 * gw, b - 0.1 * gb


def test_d010_a_large_start_that_came_down_is_no_bad_start() -> None:
    ctx = watched(_large_targets_that_learn)
    assert ctx.loss[0] >= d010.ABSURD and ctx.loss[-1] < 1
    assert d010.fingerprint(ctx) is None
    assert d010.fingerprint(recorded("D010_bad_initialization", fixed=True)) is None


# --------------------------------------------------------------------------- D011


def test_d011_measures_a_short_run_that_ended_at_its_highest() -> None:
    ctx = recorded("D011_step_size_too_large")  # least squares at lr 2.5, three updates
    found = d011.fingerprint(ctx)
    assert found is not None and found.records == ctx.n == 3
    assert (found.first, found.last) == (ctx.loss[0], ctx.loss[-1]) and found.last == ctx.loss.max()
    assert found.ratio >= d011.RISE


def test_d011_is_silent_at_a_step_the_loss_can_take() -> None:
    assert d011.fingerprint(recorded("D011_step_size_too_large", fixed=True)) is None


# --------------------------------------------------------------------------- D012


def test_d012_measures_a_fit_thrown_out_of_its_start_that_ended_above_it() -> None:
    ctx = recorded("D012_step_size_too_large")  # a softmax classifier by hand at lr 30
    found = d012.fingerprint(ctx)
    assert found is not None and found.first == ctx.loss[0] and found.peak == ctx.loss.max()
    assert found.peak_ratio >= 10 and found.end_ratio > 1
    assert ctx.loss[ctx.steps.tolist().index(found.peak_step)] == found.peak


def test_d012_is_silent_on_the_fit_at_a_tenth_of_the_step_and_on_its_log() -> None:
    assert d012.fingerprint(recorded("D012_step_size_too_large", fixed=True)) is None
    ctx = recorded("D012_step_size_too_large")
    ctx.trace.meta["source"] = "a log read after the fact"  # (it may begin anywhere)
    assert d012.fingerprint(Context(ctx.trace)) is None

# --------------------------------------------------------------------------- shared measures


def test_the_update_a_finding_names_is_the_failure_the_stop_or_the_last() -> None:
    broke = recorded("D002_nonfinite_input")
    stopped = recorded("D003_update_sign_error")  # the ascent detector stopped it
    finished = recorded("D006_exploding_gradients")
    assert broke.fail is not None and broke.break_index == broke.fail
    assert stopped.fail is None and stopped.stop is not None
    assert stopped.break_index == stopped.stop
    assert finished.fail is None and finished.stop is None
    assert finished.break_index == finished.n - 1


def test_d005_a_log_of_zero_right_after_a_step_that_replaced_the_model_defers_to_the_step() -> None:
    # logistic regression by hand at lr 1.3 from small random weights: one step multiplies the
    # weight norm about tenfold, the sigmoid saturates and log(0) is NaN at update 2
    def fit(monitor: Any) -> None:
        rng = np.random.default_rng(3)
        X = rng.normal(size=(128, 3)) * np.array([4.0, 1.0, 1.0])
        y = (X @ np.array([1.0, -1.0, 0.5]) > 0).astype(float)
        w = rng.normal(size=3) * 0.3
        for _ in range(4):
            p = 1 / (1 + np.exp(-(X @ w)))
            with np.errstate(divide="ignore", invalid="ignore"):
                loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
            g = X.T @ (p - y) / len(y)
            monitor.update(loss, params={"w": w}, grads={"w": g}, lr=40.0, inputs=X, targets=y)
            w = w - 40.0 * g

    ctx = watched(fit)
    found = d005.fingerprint(ctx)
    assert found is not None and found.moved is not None and found.moved >= 1
    finding = d005.check(ctx)
    assert finding is not None and finding.confidence <= 0.5
    assert ("step_size_too_large", 0.7) in finding.alternatives
