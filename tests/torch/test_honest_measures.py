"""Measures that cannot lie: the gradient the step applies, a norm that overflows float32 while
every element is finite, the scale of the first batch's columns."""

from __future__ import annotations

import math

import pytest

import nanscope

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402


def test_a_clip_called_before_backward_does_not_hide_a_nan_gradient() -> None:
    # the clip reads the zeroed gradients (0.0) before backward(); the step's own gradient holds
    # NaN (sqrt at 0 in the backward) while the loss is finite: it must never reach the weights
    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watcher = nanscope.watch(model, opt, monitor=nanscope.Monitor(write=False))
    before = [p.detach().clone() for p in model.parameters()]
    try:
        with pytest.raises(nanscope.DivergenceError) as info:
            for _ in range(80):  # past the first full update: the lean check serves the rest
                opt.zero_grad()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                loss = nn.functional.mse_loss(model(x), y)
                if watcher.step >= 70:
                    loss = loss + torch.sqrt((model.weight * 0).pow(2).sum())
                loss.backward()
                opt.step()
    finally:
        watcher.close()
    d = info.value.diagnosis
    assert d.first_nonfinite == {"step": 71, "what": "grad"}
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not any(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_a_norm_past_float32_with_finite_elements_is_measured_and_stops() -> None:
    # every gradient element is finite (3e37), but their float32 sum of squares overflows, and
    # the true norm (3e37 * sqrt(n)) lies past the float32 range: any step with it overflows
    torch.manual_seed(0)
    model = nn.Linear(2000, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    monitor = nanscope.Monitor(write=False)
    watcher = nanscope.watch(model, opt, monitor=monitor)
    x = torch.ones(1, 2000)
    try:
        with pytest.raises(nanscope.DivergenceError) as info:
            opt.zero_grad()
            (model(x).sum() * 3e37).backward()
            assert torch.isfinite(model.weight.grad).all()
            opt.step()
    finally:
        watcher.close()
    record = monitor.trace.records[0]
    assert record["nf_grads"] == 0 and record.get("grad_past_range") is True
    assert math.isclose(record["grad_norm"], 3e37 * math.sqrt(2000), rel_tol=1e-3)
    assert info.value.diagnosis.first_nonfinite == {"step": 1, "what": "grad"}


def test_the_first_batch_names_a_column_in_raw_units() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    x[:, 1] = torch.randn(64) * 1000 + 5000  # a price in dollars beside standardised columns
    y = x[:, :1] * 0.1
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-9)
    monitor = nanscope.Monitor(write=False)
    watcher = nanscope.watch(model, opt, monitor=monitor)
    try:
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    finally:
        watcher.close()
    first = monitor.trace.records[0]
    assert first["input_scale_column"] == 1 and first["input_scale_ratio"] > 100


def _half_fit_with_static_scale(scale: float, monitor: nanscope.Monitor) -> list[float]:
    """A float16 classifier trained with ``(loss * scale).backward()`` written by hand; the
    losses the script itself logs."""
    torch.manual_seed(0)
    x = torch.randn(256, 8).half()
    y = torch.randint(0, 16, (256,))
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 16)).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    watcher = nanscope.watch(model, opt, monitor=monitor)
    logged = []
    try:
        for _ in range(40):
            opt.zero_grad()
            logp = torch.log(torch.softmax(model(x), dim=-1))
            loss = -logp.gather(-1, y.unsqueeze(-1)).mean()
            (loss * scale).backward()
            for p in model.parameters():
                p.grad /= scale
            opt.step()
            logged.append(loss.item())
    finally:
        watcher.close()
    return logged


def test_a_static_loss_scale_that_overflows_float16_while_the_gradients_stay_finite_is_healthy(
) -> None:
    # ln(16) * 32768 is past 65504: the value backward() is called on is inf on every update,
    # while its gradient, 32768 times each loss's, is finite and the fit trains
    monitor = nanscope.Monitor(write=False)
    logged = _half_fit_with_static_scale(32768.0, monitor)
    assert logged[0] * 32768.0 > 65504 and all(math.isfinite(v) for v in logged)
    assert logged[-1] < logged[0]
    recorded = [r["loss"] for r in monitor.trace.records]
    assert recorded == pytest.approx(logged, rel=1e-3)  # the loss before the scale
    assert monitor.diagnose().verdict == "healthy"


def test_a_static_loss_scale_whose_gradients_overflow_float16_still_stops() -> None:
    # 2**24 times the gradient is past float16 in the backward: the step holds inf and stops
    monitor = nanscope.Monitor(write=False)
    with pytest.raises(nanscope.DivergenceError) as info:
        _half_fit_with_static_scale(2.0**24, monitor)
    assert info.value.diagnosis.first_nonfinite["what"] == "grad"
    assert info.value.diagnosis.cause == "fp16_overflow"
    assert math.isfinite(monitor.trace.records[-1]["loss"])  # the loss itself never was inf
