"""``bench/overhead.py`` and ``bench/hook_cost.py`` run (CI never times them: the machines are
shared), and the GPT-style loop is the loop it claims to be: micro-batches accumulated, the clip's
total read by the lean check."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import nanscope

pytest.importorskip("torch")  # the benches' workloads are torch models

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def overhead(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import overhead as module  # type: ignore[import-not-found]

    return module


@pytest.mark.slow
def test_the_overhead_bench_prints_a_row_per_workload():
    out = subprocess.run(
        [sys.executable, str(BENCH / "overhead.py"), "--steps", "2", "--rounds", "1", "--warm",
         "1", "--no-memory", "--threads", "1"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha()}
    for name in ("mlp512", "mlp512-minibatch", "lstm2", "transformer", "chartf", "gpt"):
        plain_ms, floor, watched, run = (float(v) for v in rows[name][1:5])
        assert plain_ms > 0 and all(math.isfinite(r) and r > 0 for r in (floor, watched, run))
    assert "worst watched/plain or run/plain" in out
    assert "watched <= 1.03: one round: no spread: mlp512, " in out  # one round: no verdict


@pytest.mark.slow
def test_the_hook_cost_bench_times_each_entry_point_of_the_gpt_loop():
    out = subprocess.run(
        [sys.executable, str(BENCH / "hook_cost.py"), "--workloads", "gpt,mlp512", "--rounds", "1",
         "--block", "3", "--warm", "63"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("gpt", "mlp"))}
    for part in ("all hooks", "step pre-hook", "backward", "forward pre-hook", "clip"):
        assert part in rows["gpt"], part
    assert "gradient norms" not in rows["gpt"]  # the clip's total is the pass over the gradients
    assert "gradient norms" in rows["mlp512"] and "clip" not in rows["mlp512"]
    assert "beyond the hooks" in rows["mlp512"]  # the whole watched block, less hooks and plain
    # the block holds updates 64-66: the full update 65 and the sample of update 66 after it
    parts = rows["mlp512"].split(None, 1)[1]
    shares = dict(re.findall(r"([a-z][a-z (),0-9-]*?) (\d+\.\d+)%", parts))
    assert float(shares["full updates (every 64)"]) > 0
    assert float(shares["direction samples"]) > 0
    assert float(shares["step pre-hook"]) >= float(shares["full updates (every 64)"])


@pytest.mark.slow
def test_the_gpt_loop_accumulates_clips_and_takes_the_lean_check(overhead, tmp_path):
    work = overhead.loop("gpt", "cpu")
    assert work.clips and len(work.opt.param_groups) == 2
    watcher = nanscope.watch(work.model, work.opt, policy="raise", run_dir=tmp_path)
    lean = []
    check_lean = watcher.lean.check
    watcher.lean.check = (  # type: ignore[method-assign]
        lambda step, measure, lr: lean.append(check_lean(step, measure, lr)) or lean[-1]
    )
    for _ in range(6):
        work.step(False)
    records = watcher.monitor.trace.records
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert lean == [True] * 5  # update 1 is a full one; the others, lean
    for record in records:
        assert record["extra"]["micro_batches"] == 2
        assert record["extra"]["grad_norm_source"] == "pre_clip"
        assert record["lr"] == pytest.approx(1e-3 * record["step"] / 20)  # the warm-up
    assert records[-1]["loss"] < records[0]["loss"]
    watcher.close()


def test_the_verdict_reads_the_rounds_spread_not_the_median(overhead):
    def result(q1, median, q3):
        return {"watched_q1": q1, "watched": median, "watched_q3": q3}

    assert overhead.verdict(result(1.01, 1.02, 1.03)) == "met"
    assert overhead.verdict(result(1.031, 1.04, 1.05)) == "not met"
    # a median under the target with a spread across it is no evidence (nor one over it)
    assert overhead.verdict(result(1.00, 1.02, 1.06)) == overhead.verdict(
        result(1.00, 1.05, 1.06)) == "the target inside the rounds' middle half"  # fmt: skip
