"""Quiet numpy updates are judged in batches (Monitor.update): the alarms, their updates, the
trace and the rows of a spike must be exactly those of judging every update at once."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import nanscope
import nanscope.monitor as monitor_module
from nanscope.outcome import FAR

pytestmark = pytest.mark.slow  # the numpy zoo, each case run twice

_spec = importlib.util.spec_from_file_location(
    "_nanscope_zoo_loader", Path(__file__).parents[1] / "zoo" / "_zoo.py"
)
assert _spec is not None and _spec.loader is not None
_zoo = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("_nanscope_zoo_loader", _zoo)
_spec.loader.exec_module(_zoo)

CASES = _zoo.load_cases(("numpy",))


def _run(case, monkeypatch, *, defer: bool):  # type: ignore[no-untyped-def]
    # deferral from the first update (the most of it), or never
    monkeypatch.setattr(monitor_module, "FLUSH_LINES", 0 if defer else 10**9)
    batches: list[int] = []
    judge = nanscope.Monitor._judge_deferred

    def counted(self):  # type: ignore[no-untyped-def]
        batches.append(len(self._deferred))
        judge(self)

    monkeypatch.setattr(nanscope.Monitor, "_judge_deferred", counted)
    outcome = _zoo.run_case(case)
    records = [json.dumps(r, sort_keys=True, default=str) for r in outcome.monitor.trace]
    diagnosis = outcome.diagnosis.to_dict()
    run_id = diagnosis.pop("run")["id"]  # new for every run
    message = str(outcome.error).replace(run_id, "<run>")
    return outcome, records, diagnosis, message, sum(batches)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_zoo_fit_judged_in_batches_is_judged_the_same(case, monkeypatch):  # type: ignore[no-untyped-def]
    late, late_records, late_diagnosis, late_message, waited = _run(case, monkeypatch, defer=True)
    now, now_records, now_diagnosis, now_message, none_waited = _run(case, monkeypatch, defer=False)
    assert none_waited == 0
    losses = [r.get("loss") for r in now.monitor.trace]
    if len(now_records) > 1 and any(_quiet_loss(losses[0], v) for v in losses[1:-1]):
        # (a fit that fails at its first update has none to defer, nor one whose loss is far
        # above where it started from its second update on: each of those is judged at once)
        assert waited > 0, "no update of the fit was judged late: the test shows nothing"
    assert late.raised == now.raised
    assert late_message == now_message  # the same alarm, at the same update
    assert late_records == now_records
    assert late_diagnosis == now_diagnosis


def _quiet_loss(first: object, loss: object) -> bool:
    """A loss that can wait to be judged: finite and not far above the first."""
    if not isinstance(first, float) or not isinstance(loss, float) or first <= 0:
        return True
    return loss <= FAR * first


def _refilled_buffer_fit(mon: nanscope.Monitor, updates: int = 160) -> int:
    """Linear regression whose loop refills one batch buffer in place (np.take(..., out=)), with
    one extreme row first drawn at update 120: its spike must be probed before the refill."""
    rng = np.random.default_rng(3)
    n, d, size = 4000, 5, 20
    X = rng.standard_normal((n, d))
    y = X @ rng.standard_normal(d) + 0.1 * rng.standard_normal(n)
    order = rng.permutation(n)
    bad = int(order[120 * size + 7])
    X[bad, 1] = 4e4  # one record in the wrong unit
    xb, yb = np.empty((size, d)), np.empty(size)
    index = np.empty(size, dtype=np.int64)
    w = np.zeros(d)
    for step in range(updates):
        index[:] = order[step * size : (step + 1) * size]
        np.take(X, index, axis=0, out=xb)
        np.take(y, index, out=yb)
        r = xb @ w - yb
        loss = 0.5 * float(r @ r) / size
        g = xb.T @ r / size
        mon.update(loss, params={"w": w}, grads={"w": g}, lr=0.05, inputs=xb, targets=yb,
                   index=index)  # fmt: skip
        w -= 0.05 * np.clip(g, -1.0, 1.0)  # clipped: the fit survives the one batch
    return bad


def test_a_spike_is_probed_before_a_refilled_buffer_changes():
    mon = nanscope.Monitor(write=False)
    bad = _refilled_buffer_fit(mon)
    spiked = [r for r in mon.trace if "loss_spike" in (r.get("events") or [])]
    assert [r["step"] for r in spiked][:1] == [121]
    rows = spiked[0].get("rows") or []
    assert bad in {row.get("dataset_row") for row in rows}, rows
    assert all(row.get("step") == 121 for row in rows if row.get("dataset_row") == bad)
    mon.close()


def test_a_trace_read_mid_run_holds_every_update():
    mon = nanscope.Monitor(write=False)
    rng = np.random.default_rng(0)
    w = rng.standard_normal(4)
    for step in range(200):
        g = 0.1 * w
        mon.update(float(w @ w), params={"w": w}, grads={"w": g}, lr=0.1)
        w = w - 0.1 * g
        if step == 150:
            assert mon._deferred, "nothing waits: the test shows nothing"
            assert [r["step"] for r in mon.trace] == list(range(1, 152))
            assert mon.diagnose().summary["updates"] == 151
    assert mon.close().verdict == "healthy"


def test_a_run_directory_holds_the_waiting_updates_after_close(tmp_path):
    mon = nanscope.Monitor(run_dir=tmp_path / "run")
    w = np.ones(3)
    for _ in range(100):
        mon.update(float(w @ w), params={"w": w}, grads={"w": 0.1 * w}, lr=0.1)
        w = w * 0.99
    mon.close()
    trace = nanscope.read_trace(tmp_path / "run" / "trace.jsonl")
    assert [r["step"] for r in trace] == list(range(1, 101))
