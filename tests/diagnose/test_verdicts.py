"""The verdicts that are never healthy, and cut files, from real fits.

``unobserved``: nothing was recorded, so nothing was watched. ``interrupted``: the run was stopped
from outside (an ``interrupted`` event in the trace) and no failure was found in the updates seen.
A trace or log cut short still gets its verdict, but the evidence says so and a healthy verdict
from it claims less.
"""

from __future__ import annotations

import json
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.cli import main as cli
from nanscope.diagnose.engine import interruption
from nanscope.loading import load
from nanscope.report.html import render_report
from nanscope.report.terminal import render
from nanscope.trace import TraceWriter


def _fit(steps: int, lr: float, seed: int = 0) -> Iterator[tuple[float, dict, dict, Any, Any]]:
    """Mini-batch least squares with one unscaled feature (lr 0.5 diverges, 0.005 converges)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(200, 3))
    X[:, 2] *= 10
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=200)
    w = np.zeros(3)
    for _ in range(steps):
        batch = rng.integers(0, 200, 32)
        residual = X[batch] @ w - y[batch]
        grad = 2 * X[batch].T @ residual / len(batch)
        yield float(np.mean(residual**2)), {"w": w}, {"w": grad}, X[batch], y[batch]
        w = w - lr * grad


def _interrupted_run(run: Path, lr: float, at: int, policy: str = "raise") -> int:
    """Fit until a real SIGINT arrives before update ``at``; record the event like `run` does."""
    mon = nanscope.Monitor(run_dir=run, policy=policy)
    seen = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for loss, params, grads, xb, yb in _fit(500, lr):
                if seen == at:
                    signal.raise_signal(signal.SIGINT)
                mon.update(loss, params=params, grads=grads, lr=lr, inputs=xb, targets=yb)
                seen += 1
        except KeyboardInterrupt:
            TraceWriter(run / "trace.jsonl").event("interrupted", signal="SIGINT", step=seen)
        mon.close()
    return seen


@pytest.mark.usefixtures("ctrl_c")
def test_an_interrupted_healthy_fit_is_interrupted_not_healthy(tmp_path: Path) -> None:
    run = tmp_path / "run"
    seen = _interrupted_run(run, lr=0.005, at=40)
    trace = load(run / "trace.jsonl")
    assert interruption(trace) == {"event": "interrupted", "signal": "SIGINT", "step": 40}
    diagnosis = nanscope.diagnose(trace)
    assert diagnosis.verdict == "interrupted" and diagnosis.cause != "healthy"
    assert not diagnosis.ok and diagnosis.step == seen == 40
    texts = " ".join(e.text for e in diagnosis.evidence)
    assert "interrupted (SIGINT) after update 40" in texts and "no failure" in texts
    assert diagnosis.headline().startswith("interrupted after update 40")
    # the same trace without its event is a healthy fit: the event alone makes the difference
    assert nanscope.diagnose(nanscope.Trace(trace.records)).verdict == "healthy"
    # `nanscope diagnose` exits 1 on it, and says it on the page and in the terminal
    assert cli(["diagnose", str(run), "--json", str(tmp_path / "d.json")]) == 1
    assert json.loads((tmp_path / "d.json").read_text())["verdict"] == "interrupted"
    page = render_report(trace, diagnosis, plots=False)
    assert 'class="verdict verdict-interrupted"' in page and "stopped from outside" in page
    assert "nanscope: interrupted after update 40" in render(diagnosis, trace)


@pytest.mark.usefixtures("ctrl_c")
def test_a_failure_before_the_interruption_stays_the_verdict(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _interrupted_run(run, lr=0.5, at=30, policy="warn")  # diverges to NaN, then Ctrl-C
    diagnosis = nanscope.diagnose(run / "trace.jsonl")
    assert diagnosis.verdict in ("nonfinite", "diverging")
    assert diagnosis.cause == "step_size_too_large"
    assert any("interrupted (SIGINT)" in e.text for e in diagnosis.evidence)


@pytest.mark.usefixtures("ctrl_c")
def test_interrupted_before_the_first_update_is_unobserved(tmp_path: Path) -> None:
    # the run was stopped while loading data: a header and the event, no update
    run = tmp_path / "run"
    writer = TraceWriter(run / "trace.jsonl", {"run_id": "x", "name": "fit"})
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        writer.event("interrupted", signal="SIGINT", step=0)
    writer.close()
    diagnosis = nanscope.diagnose(run)
    assert diagnosis.verdict == "unobserved" and diagnosis.summary["updates"] == 0
    assert "before nanscope saw its first update" in diagnosis.evidence[0].text
    assert cli(["diagnose", str(run)]) == 1
    page = render_report(load(run), diagnosis)
    assert 'class="verdict verdict-unobserved"' in page and "nothing was watched" in page


def test_a_monitor_that_saw_no_update_says_why(tmp_path: Path) -> None:
    mon = nanscope.Monitor(run_dir=tmp_path / "run")
    batches = iter([])  # an empty data loader: the loop body never runs
    for loss in batches:
        mon.update(loss)
    diagnosis = mon.close()
    assert diagnosis.verdict == "unobserved" and not diagnosis.ok
    assert "no loss was recorded" in diagnosis.evidence[0].text
    assert diagnosis.to_dict()["verdict"] == "unobserved"


def _healthy_trace(run: Path, steps: int = 60) -> Path:
    mon = nanscope.Monitor(run_dir=run)
    for loss, params, grads, xb, yb in _fit(steps, 0.005):
        mon.update(loss, params=params, grads=grads, lr=0.005, inputs=xb, targets=yb)
    mon.close()
    return run / "trace.jsonl"


def test_a_cut_trace_says_so_and_claims_less(tmp_path: Path) -> None:
    path = _healthy_trace(tmp_path / "run")
    whole = nanscope.diagnose(path)
    assert whole.verdict == "healthy" and whole.confidence > 0.5
    data = path.read_bytes()
    path.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 25])  # killed mid-record
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cut = nanscope.diagnose(path)
    assert cut.verdict == "healthy" and cut.confidence <= 0.5 < whole.confidence
    assert any("cut short" in e.text and e.data.get("truncated") for e in cut.evidence)


def test_a_cut_json_log_of_one_update_is_not_a_confident_healthy(tmp_path: Path) -> None:
    # a training script printing one JSON object per update, killed while writing the second
    lines = [json.dumps({"step": i + 1, "loss": loss, "lr": 0.005})
             for i, (loss, *_) in enumerate(_fit(2, 0.005))]  # fmt: skip
    log = tmp_path / "metrics.jsonl"
    log.write_text(lines[0] + "\n" + lines[1][:14])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = load(log)
        diagnosis = nanscope.diagnose(trace)
    assert trace.meta.get("truncated") is True and len(trace) == 1
    assert diagnosis.confidence <= 0.5
    assert any("cut short" in e.text for e in diagnosis.evidence)


def test_the_engine_takes_a_trace_not_a_path(tmp_path: Path) -> None:
    from nanscope.diagnose.engine import diagnose

    path = _healthy_trace(tmp_path / "run", steps=10)
    with pytest.raises(TypeError, match=r"nanscope\.loading"):
        diagnose(str(path))
    # the public nanscope.diagnose reads the path through nanscope.loading
    assert nanscope.diagnose(path).to_dict() == diagnose(load(path)).to_dict()


def test_every_verdict_is_ranked_and_a_run_that_saw_nothing_hides_none(tmp_path: Path) -> None:
    from nanscope.diagnose.diagnosis import VERDICT_RANK, VERDICTS

    assert set(VERDICT_RANK) == set(VERDICTS)
    watched = nanscope.diagnose(_healthy_trace(tmp_path / "a", steps=10))
    unused = nanscope.Monitor(write=False).close()
    # which diagnosis a run with two monitors reports: the one that watched something
    assert min((unused, watched), key=lambda d: VERDICT_RANK[d.verdict]) is watched
    assert VERDICT_RANK["interrupted"] < VERDICT_RANK["healthy"]
