"""The lean per-update check on CPU (watch.py): the same records as the full check, in batches.

Every update is checked for non-finite values at once (one norm pass over the gradients, the
loss read at its backward); the records of finite updates are shown to the detectors and written
together. These tests compare the records with those of the full check on the same fits and
check that the batching loses nothing: a read of the trace mid-run is complete, a NaN still stops
before its step, a stop found in a batch keeps the updates that ran after it.
"""

from __future__ import annotations

import math

import pytest

import nanscope
import torch
from nanscope.torch.measure import LEAN_EACH_MAX, LEAN_SMALL
from nanscope.torch.watch import BATCH_RECORDS
from torch import nn


def _fit(steps, *, lean, lr=0.05, clip=None, micro=1, seed=0, tmp_path=None, policy="warn",
         deep=False, wide=False):  # fmt: skip
    torch.manual_seed(seed)
    if deep:  # many small tensors: the lean check takes one dot product over all of them
        layers = [m for _ in range(6) for m in (nn.Linear(6, 6), nn.Tanh())]
        model = nn.Sequential(*layers, nn.Linear(6, 1))
    elif wide:  # more large tensors than LEAN_EACH_MAX: one fused norm call over them
        hidden = [m for _ in range(LEAN_EACH_MAX + 1)
                  for m in (nn.Linear(65, 65, bias=False), nn.Tanh())]  # fmt: skip
        model = nn.Sequential(nn.Linear(6, 65, bias=False), *hidden, nn.Linear(65, 1, bias=False))
        assert sum(p.numel() > LEAN_SMALL for p in model.parameters()) > LEAN_EACH_MAX
    else:
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(256, 6, generator=gen)
    y = x @ torch.randn(6, 1, generator=gen) + 0.1 * torch.randn(256, 1, generator=gen)
    watcher = nanscope.watch(model, opt, policy=policy, run_dir=tmp_path)
    if not lean:
        watcher.lean.applies = lambda step: False  # type: ignore[method-assign]
    loss_fn = nn.MSELoss()
    for step in range(steps):
        opt.zero_grad()
        for k in range(micro):
            rows = slice((step * micro + k) * 16 % 256, (step * micro + k) * 16 % 256 + 16)
            (loss_fn(model(x[rows]), y[rows]) / micro).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return watcher, model


KEYS = ("step", "loss", "nf_loss", "lr", "grad_norm", "nf_grads", "update_norm", "update_cos",
        "grad_cos", "flip_frac", "weight_norm", "input_absmax")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"clip": 0.05}, {"micro": 3}, {"deep": True},
                                     {"wide": True, "lr": 0.005}])  # fmt: skip
def test_the_lean_records_are_the_full_check_records(options):
    lean, _ = _fit(40, lean=True, **options)
    full, _ = _fit(40, lean=False, **options)
    got, want = lean.monitor.trace.records, full.monitor.trace.records
    assert [r["step"] for r in got] == list(range(1, 41))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for key in KEYS:
            assert (key in a) == (key in b), (a["step"], key)
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-9), (a["step"], key)
        assert a.get("extra", {}).keys() == b.get("extra", {}).keys()
    lean.close()
    full.close()


def test_a_read_of_the_trace_mid_run_sees_every_update():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = nanscope.watch(model, opt, policy="warn")
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    for step in range(1, 30):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        assert watcher.monitor.trace.records[-1]["step"] == step
    assert watcher.lean.waiting == []
    watcher.close()


def test_the_lean_path_holds_records_in_batches():
    """Between two reads the records wait (what makes the check cheap), at most a batch."""
    watcher, _ = _fit(5, lean=True)  # steps 2..5: lean (1 is a full update)
    assert 1 <= len(watcher.lean.waiting) < BATCH_RECORDS
    assert watcher.monitor.trace.records[-1]["step"] == 5  # the read hands them over
    assert watcher.lean.waiting == []
    watcher.close()


def _watched(tmp_path, *hidden):
    """A seeded 4 -> 8 -> ``hidden`` -> 1 model, its SGD, its watcher and one batch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), *hidden, nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    return model, opt, watcher, torch.randn(64, 4), torch.randn(64, 1)


@pytest.mark.slow
def test_a_nan_in_a_lean_run_stops_before_the_step_with_the_batch_observed(tmp_path):
    model, opt, watcher, x, y = _watched(tmp_path, nn.ReLU())
    with pytest.raises(nanscope.DivergenceError):
        for step in range(1, 40):
            xb = x.clone()
            if step == 23:
                xb[5, 2] = math.nan
            opt.zero_grad()
            nn.functional.mse_loss(model(xb), y).backward()
            before = {k: v.clone() for k, v in model.state_dict().items()}
            opt.step()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name  # the NaN never reached the weights
    records = watcher.monitor.trace.records
    assert [r["step"] for r in records] == list(range(1, 24))
    assert records[-1]["nf_loss"] == 1
    assert all(r["nf_loss"] == 0 for r in records[:-1])
    assert watcher.monitor.diagnosis.cause == "nonfinite_input"


class _Gated(nn.Module):
    """Many small layers, then a per-feature gate parametrised as ``sqrt(|g|)``: a gate pruned
    to exactly 0 gives a NaN gradient in that one element (``0 * inf`` in the backward of abs and
    sqrt) while the loss stays finite."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(6, 6), nn.Tanh())])
        self.gate = nn.Parameter(torch.ones(6))
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x) * self.gate.abs().sqrt())


@pytest.mark.slow
def test_a_nan_in_one_small_gradient_stops_the_stacked_lean_check(tmp_path):
    """A model of many small layers has its small gradients stacked in a few buffers by the lean
    check: a NaN in one element of one of them still stops the update before its step."""
    torch.manual_seed(0)
    model = _Gated()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    x, y = torch.randn(64, 6), torch.randn(64, 1)
    with pytest.raises(nanscope.DivergenceError):
        for step in range(1, 40):
            if step == 21:
                with torch.no_grad():
                    model.gate[3] = 0.0  # magnitude pruning of one gate
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            before = {k: v.clone() for k, v in model.state_dict().items()}
            opt.step()
    _, stacks = watcher.records.measure._lean_stacked  # the stacked path was the one in use
    assert any(model.gate is p for stacked, _, _ in stacks for p in stacked)
    assert math.isfinite(float(loss)) and int(torch.isnan(model.gate.grad).sum()) == 1
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name  # the NaN never reached the weights
    records = watcher.monitor.trace.records
    assert [r["step"] for r in records] == list(range(1, 22))
    assert records[-1]["nf_grads"] == 1 and records[-1]["nf_loss"] == 0
    assert all(r["nf_grads"] == 0 for r in records[:-1])
    watcher.close()


def test_a_stop_found_while_the_trace_is_read_is_raised_at_the_next_step(monkeypatch):
    """A read must not raise out of user code; the next optimizer step does (before it runs)."""
    from nanscope.detectors import Alarm

    watcher, model = _fit(6, lean=True, policy="raise")
    assert watcher.lean.waiting
    held = watcher.lean.waiting
    monkeypatch.setattr(
        watcher.monitor.detectors, "step",
        lambda rec: Alarm("diverging", rec["step"], "test alarm", {})
        if rec["step"] == held[0] else None,
    )  # fmt: skip
    records = watcher.monitor.trace.records  # no raise here
    assert [r["step"] for r in records] == list(range(1, 7))  # the later ones kept too
    assert watcher.monitor.alarm is not None and watcher.monitor.alarm.step == held[0]
    weights = [p.detach().clone() for p in model.parameters()]
    opt = watcher.optimizer
    nn.functional.mse_loss(model(torch.randn(4, 6)), torch.randn(4, 1)).backward()
    with pytest.raises(nanscope.DivergenceError):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def test_a_clip_over_every_parameter_is_the_finiteness_check():
    """``clip_grad_norm_`` already reduced every gradient: the lean check reads its total."""
    calls = []
    watcher, _ = _fit(3, lean=True, clip=0.05)
    measure = watcher.records.measure
    original = measure.lean_norms
    measure.lean_norms = lambda: calls.append(1) or original()  # type: ignore[method-assign]
    opt, model = watcher.optimizer, watcher.model
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    for _ in range(5):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
    assert calls == []
    clipped = watcher.monitor.trace.records[-1]["extra"]["grad_norm_clipped"]
    assert clipped == pytest.approx(0.05, rel=1e-5)
    for _ in range(3):  # clipping only the first layer proves nothing about the others
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model[0].parameters(), 0.05)
        opt.step()
    assert len(calls) == 3


def test_a_nan_gradient_outside_the_clipped_parameters_still_stops_its_update(tmp_path):
    """sqrt at 0: a finite loss whose gradient is NaN, in a branch the script does not clip."""
    torch.manual_seed(0)
    head, side = nn.Linear(4, 1), nn.Linear(4, 1)
    opt = torch.optim.SGD([*head.parameters(), *side.parameters()], lr=0.01)
    watcher = nanscope.watch(head, opt, run_dir=tmp_path)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    with pytest.raises(nanscope.DivergenceError):
        for step in range(1, 30):
            opt.zero_grad()
            gate = torch.relu(side(x)) * (0.0 if step == 20 else 1.0)
            bend = torch.sqrt(gate + 1e-3 * (step != 20)).mean()
            loss = nn.functional.mse_loss(head(x), y) + bend
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
    assert watcher.step == 20
    assert all(torch.isfinite(p).all() for p in side.parameters())
    assert watcher.monitor.trace.records[-1]["nf_grads"] > 0


def _nan_at(step_bad, model, opt, x, y, *, train_from=1):
    with pytest.raises(nanscope.DivergenceError):
        for step in range(1, 40):
            model.train(step >= train_from)
            xb = x.clone()
            if step == step_bad:
                xb[5, 2] = math.nan
            opt.zero_grad()
            nn.functional.mse_loss(model(xb), y).backward()
            opt.step()


@pytest.mark.slow
@pytest.mark.parametrize(("train_from", "bad"), [(1, 23), (6, 10)])
def test_a_forward_with_dropout_keeps_its_rng_state_for_an_exact_replay(tmp_path, train_from, bad):
    model, opt, watcher, x, y = _watched(tmp_path, nn.ReLU(), nn.Dropout(0.5))
    # not a probed update (the forwards of updates 1, 65, ... are); train_from=6: the first
    # forwards run in eval mode and draw nothing, the switch to training is probed at once
    _nan_at(bad, model, opt, x, y, train_from=train_from)
    failure = watcher.failure
    assert failure is not None and failure.step == bad
    state = failure.extra["rng_state"]
    torch.set_rng_state(state)
    again = model(*failure.args)  # the weights are those the failing forward saw
    torch.testing.assert_close(again, failure.output, equal_nan=True)  # the same dropout mask
    watcher.close()


@pytest.mark.slow
def test_a_forward_without_randomness_skips_the_rng_copy_and_still_locates(tmp_path):
    model, opt, watcher, x, y = _watched(tmp_path, nn.ReLU())
    _nan_at(23, model, opt, x, y)
    assert watcher.window.rng_used is False
    assert "rng_state" not in watcher.failure.extra
    found = watcher.monitor.diagnosis.to_dict()
    assert found["cause"] == "nonfinite_input"
    # the replay of update 23 needed no RNG state: the same op, module and rows
    assert found["located"]["how"] == "replay of the failing update"
    assert (found["located"]["op"], found["located"]["module"]) == ("linear", "0")
    assert found["rows"][0]["batch_row"] == 5
    watcher.close()


def _warmup_past_stability(lean, tmp_path):
    """Full-batch least squares on correlated features, SGD whose warm-up takes the step past
    2 / the largest curvature (to 3 / it): the loss falls, then grows geometrically while it
    oscillates, by less than the jump that is judged at once on its own (a rise to 4x). Returns
    the update the stop came at, the weights then, and the watcher."""
    torch.manual_seed(3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(512, 8, generator=gen) @ torch.randn(8, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen) + 0.1 * torch.randn(512, 1, generator=gen)
    model = nn.Linear(8, 1)
    curvature = float(torch.linalg.eigvalsh(2 * x.T @ x / len(x)).max())
    opt = torch.optim.SGD(model.parameters(), lr=3.0 / curvature)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / 60))
    watcher = nanscope.watch(model, opt, policy="raise", run_dir=tmp_path)
    if not lean:
        watcher.lean.applies = lambda step: False  # type: ignore[method-assign]
    loss_fn = nn.MSELoss()
    for step in range(1, 200):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        try:
            opt.step()
        except nanscope.DivergenceError:
            return step, [p.detach().clone() for p in model.parameters()], watcher
        schedule.step()
    raise AssertionError("the fit never stopped")


def test_a_climb_stops_the_lean_check_at_the_update_the_full_check_stops(tmp_path):
    """The climb is judged out of turn: the divergence detector stops the very update it would
    stop update by update, before its step, with the records before it all judged."""
    lean_step, lean_weights, lean = _warmup_past_stability(True, tmp_path / "lean")
    full_step, full_weights, full = _warmup_past_stability(False, tmp_path / "full")
    assert lean.monitor.alarm.kind == full.monitor.alarm.kind == "diverging"
    assert lean_step == full_step and lean_step % 64 != 1  # a lean update, not a full one
    assert lean.monitor.alarm.step == lean_step
    assert all(torch.equal(a, b) for a, b in zip(lean_weights, full_weights))
    assert [r["step"] for r in lean.monitor.trace.records] == list(range(1, lean_step + 1))
    lean.close()
    full.close()
