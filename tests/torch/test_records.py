"""RecordBuilder alone: one real step's device vector packed, read and turned into the record."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from nanscope.torch.measure import param_names  # noqa: E402
from nanscope.torch.records import RecordBuilder, count_nonfinite  # noqa: E402
from nanscope.torch.window import StepWindow  # noqa: E402
from nanscope.trace import RECORD_KEYS  # noqa: E402


def _setup(every=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    builder = RecordBuilder(every)
    builder.rename(param_names(model))
    return model, opt, builder


def _step(model, opt, builder, step, x, y, *, clip=None, scale=None):
    """One real update: forward, loss module, backward, then the builder's record of it."""
    window = StepWindow()
    opt.zero_grad()
    window.on_forward((x,), {}, rng=False)
    loss_fn = nn.MSELoss()
    out = model(x)
    window.on_loss_module(loss_fn, (out, y), {})
    loss = loss_fn(out, y)
    window.on_backward(loss, None, None, lambda t, s: None)
    loss.backward()
    if clip is not None:
        window.on_clip(nn.utils.clip_grad_norm_(model.parameters(), clip))
    params = list(model.parameters())
    if builder.measure is None or builder.params_changed(opt):
        builder.measure_for(opt, params)
    vec, ctx, batch = builder.pack(step, window, window.loss(), scale, interval=1, lr=0.1)
    record, what, seen_scale = builder.unpack(step, vec.tolist(), ctx, batch=batch, late=False)
    return record, what, seen_scale, params


def test_a_full_update_holds_the_reference_measures():
    model, opt, builder = _setup()
    x, y = torch.randn(16, 3) * 3, torch.randn(16, 1)
    record, what, scale, params = _step(model, opt, builder, 1, x, y)
    with torch.no_grad():
        loss = float(nn.functional.mse_loss(model(x), y))
    grad = torch.cat([p.grad.reshape(-1) for p in params]).double().norm()
    weight = torch.cat([p.detach().reshape(-1) for p in params]).double().norm()
    assert record["step"] == 1 and what == "loss" and scale is None
    assert record["loss"] == pytest.approx(loss, rel=1e-6) and record["nf_loss"] == 0
    assert record["grad_norm"] == pytest.approx(float(grad), rel=1e-5)
    assert record["weight_norm"] == pytest.approx(float(weight), rel=1e-5)
    assert record["input_absmax"] == pytest.approx(float(x.abs().max()))
    assert record["target_absmax"] == pytest.approx(float(y.abs().max()))
    assert set(record["grad_norms"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert record["lr"] == 0.1 and "extra" not in record
    assert set(record) <= set(RECORD_KEYS)  # the one trace key set


def test_between_full_updates_only_the_cheap_measures():
    model, opt, builder = _setup(every=4)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    for step in (1, 2, 3):
        record, *_ = _step(model, opt, builder, step, x, y)
        opt.step()
    assert "weight_norm" not in record and "input_absmax" not in record
    assert "grad_norm" in record and record["nf_grads"] == 0


def test_a_nonfinite_update_between_full_ones_gets_the_full_measures_now():
    model, opt, builder = _setup(every=4)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    _step(model, opt, builder, 1, x, y)
    opt.step()
    x = x.clone()
    x[5, 1] = math.nan
    record, what, _, _ = _step(model, opt, builder, 2, x, y)
    assert what == "loss" and record["nf_loss"] == 1 and record["nf_grads"] >= 1
    assert record["nf_inputs"] == 1 == count_nonfinite(x)  # the batch read at the failure
    assert "grad_norms" in record and "weight_norm" in record
    assert set(record) <= set(RECORD_KEYS)


def test_the_pre_clip_norm_and_the_loss_scale_go_into_the_record():
    model, opt, builder = _setup()
    x, y = torch.randn(16, 3) * 10, torch.randn(16, 1)
    record, _, scale, params = _step(model, opt, builder, 1, x, y, clip=0.01,
                                     scale=torch.tensor(1024.0))  # fmt: skip
    clipped = torch.cat([p.grad.reshape(-1) for p in params]).norm()
    assert record["grad_norm"] > 0.01 and record["extra"]["grad_norm_source"] == "pre_clip"
    assert record["extra"]["grad_norm_clipped"] == pytest.approx(float(clipped), rel=1e-4)
    assert scale == 1024.0 and record["extra"]["loss_scale"] == 1024.0


def test_backfill_adds_per_name_norms_to_the_records_that_went_without():
    model, opt, builder = _setup(every=16)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    records = []
    for step in (1, 2, 3):
        record, *_ = _step(model, opt, builder, step, x, y)
        records.append(record)
        opt.step()
    assert "grad_norms" not in records[2]
    builder.backfill_grad_norms(records)
    assert set(records[2]["grad_norms"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_a_new_param_group_makes_a_new_measure():
    model, opt, builder = _setup()
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    _step(model, opt, builder, 1, x, y)
    first = builder.measure
    extra = nn.Parameter(torch.ones(2))
    opt.add_param_group({"params": [extra]})
    assert builder.params_changed(opt)
    extra.grad = torch.ones(2)
    builder.measure_for(opt, [p for g in opt.param_groups for p in g["params"]])
    assert builder.measure is not first and not builder.params_changed(opt)
