"""Precision alone: a real GradScaler's skipped steps, its scale, and when the scale collapsed."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from nanscope.torch.precision import SCALE_FLOOR, SKIP_LIMIT, Precision, scale_of  # noqa: E402


def _scaler(init_scale=2.0**4):
    if not hasattr(torch.amp, "GradScaler"):
        pytest.skip("no torch.amp.GradScaler")
    try:
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1000)
    except Exception:
        pytest.skip("GradScaler('cpu') not available")
    if not scaler.is_enabled():
        pytest.skip("GradScaler('cpu') disabled")
    return scaler


def _step(precision, scaler, model, opt, *, inf):
    """One real scaled step; ``optimizer.step`` tells ``precision`` when it ran."""
    opt.zero_grad()
    scaler.scale(model(torch.ones(2, 3)).pow(2).mean()).backward()
    if inf:
        model.weight.grad[0, 0] = math.inf
    precision.step_begin(scaler)
    handle = opt.register_step_post_hook(lambda *a: precision.on_step())
    try:
        scaler.step(opt)
    finally:
        handle.remove()
    skip = precision.step_end(scaler)
    scaler.update()
    return skip


def test_a_step_the_scaler_runs_is_no_skip_and_a_skipped_one_is():
    scaler = _scaler()
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    precision = Precision()
    assert _step(precision, scaler, model, opt, inf=False) is None
    assert precision.skips == 0 and precision.scale_tensor() is scaler._scale
    skip = _step(precision, scaler, model, opt, inf=True)
    assert skip == {"scale": 16.0, "skips": 1, "collapsed": False}
    assert list(precision.scale_history) == [16.0] and scale_of(scaler) == 8.0  # halved
    record = Precision.skipped_record(7, 0.5, 0.01, skip)
    assert record["events"] == ["skipped_step"] and "nf_grads" not in record
    assert record["extra"] == {"loss_scale": 16.0, "skipped_step": True, "consecutive_skips": 1}
    assert _step(precision, scaler, model, opt, inf=False) is None
    assert precision.skips == 0  # a step that ran ends the run of skips


def test_skips_in_a_row_collapse_the_scale_and_say_the_gradients_overflow():
    scaler = _scaler(init_scale=2.0**-10)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    precision = Precision()
    skips = [_step(precision, scaler, model, opt, inf=True) for _ in range(SKIP_LIMIT)]
    first = next(i for i, s in enumerate(skips) if s["collapsed"])
    assert skips[first]["scale"] < SCALE_FLOOR or skips[first]["skips"] >= SKIP_LIMIT
    assert not any(s["collapsed"] for s in skips[:first])
    record = Precision.skipped_record(30, 0.5, None, skips[first])
    assert record["events"] == ["skipped_step", "loss_scale_collapse"]
    assert record["nf_grads"] == 1 and "float16" in record["extra"]["fp16_story"]
    assert "lr" not in record


def test_a_disabled_scaler_has_no_scale_tensor():
    precision = Precision()
    assert precision.scale_tensor() is None
    precision.scaler = torch.amp.GradScaler("cpu", enabled=False)
    assert precision.scale_tensor() is None
    assert math.isnan(scale_of(object()))
