"""Distributed training under torchrun (2 CPU ranks, gloo): one decision for all ranks.

Each torchrun test launches ``python -m torch.distributed.run --nproc-per-node 2`` on the tiny DDP
fit of ``ddp_train.py`` in a subprocess bounded by a timeout, on a free port of its own.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from ._launch import run_root, torchrun

pytestmark = pytest.mark.slow  # torchrun: two ranks in subprocesses

HERE = Path(__file__).parent
SCRIPT = HERE / "ddp_train.py"
BOUND = 120  # seconds for a whole job, start-up of two torch processes included (a loaded CI box)


def _torchrun(tmp_path: Path, entry: list[str], args: list[str], **env: str):
    return torchrun(tmp_path, entry, args, bound=BOUND, strip=("DDP_", "NANSCOPE_"), **env)


def _trace_steps(path: Path) -> list[int]:
    steps = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "step" in rec and "loss" in rec:
            steps.append(int(rec["step"]))
    return steps


RUN = ["-m", "nanscope", "run"]


def _integrated() -> bool:
    from nanscope.commands import run

    return "distributed" in inspect.getsource(run)


@pytest.mark.distributed
def test_nan_row_on_rank_1_stops_every_rank_at_the_same_update(tmp_path):
    out = tmp_path / "d.json"
    proc, took = _torchrun(tmp_path, RUN, ["--json", str(out), "--", str(SCRIPT)],
                           DDP_NAN_RANK="1", DDP_NAN_STEP="5", DDP_NAN_ROW="3")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log  # torchrun: a rank exited 3 (stopped by nanscope)
    assert "exitcode  : 3" in log, log
    root = run_root(tmp_path)
    for rank in (0, 1):  # same update on both ranks, each its own trace
        assert _trace_steps(root / f"rank{rank}" / "trace.jsonl") == [1, 2, 3, 4, 5], rank
        assert f"rank {rank} step 5" not in proc.stdout  # neither rank finished update 5
    for path in (out, root / "diagnosis.json"):
        d = json.loads(path.read_text())
        assert d["rank"] == 1 and d["ranks"] == [1], path
        assert d["cause"] == "nonfinite_input" and d["step"] == 5, d
        assert (d["rows"][0]["batch_row"], d["rows"][0]["column"]) == (3, 2), d["rows"]
        assert d["run"]["trace"].endswith("rank1/trace.jsonl")
        assert any(e["rule"] == "distributed" and "rank 1 of 2" in e["text"]
                   for e in d["evidence"])  # fmt: skip
        assert [r["rank"] for r in d["per_rank"]] == [0, 1]
    rank0 = json.loads((root / "rank0" / "diagnosis.json").read_text())
    assert rank0["ranks"] == [1]  # rank 0's own diagnosis: its gradients went NaN via all-reduce
    assert took < BOUND


@pytest.mark.distributed
def test_healthy_run_ends_with_exit_0_and_verdict_healthy(tmp_path):
    out = tmp_path / "h.json"
    proc, _ = _torchrun(tmp_path, RUN, ["--json", str(out), "--", str(SCRIPT)], DDP_STEPS="12")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout
    assert json.loads(out.read_text())["verdict"] == "healthy"
    assert json.loads((tmp_path / "h.json.rank1").read_text())["verdict"] == "healthy"
    root = run_root(tmp_path)
    merged = json.loads((root / "diagnosis.json").read_text())
    assert merged["verdict"] == "healthy" and merged["ranks"] == []
    assert [r["verdict"] for r in merged["per_rank"]] == ["healthy", "healthy"]
    for rank in (0, 1):
        assert _trace_steps(root / f"rank{rank}" / "trace.jsonl") == list(range(1, 13))


@pytest.mark.distributed
def test_a_rank_that_dies_is_named_and_nothing_hangs(tmp_path):
    proc, took = _torchrun(tmp_path, RUN, ["--", str(SCRIPT)], DDP_DIE_RANK="1",
                           DDP_DIE_STEP="6", DDP_STEPS="200", DDP_TIMEOUT="20")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert took < BOUND
    assert "nanscope (rank 0): rank 1 died" in proc.stderr, log
    root = run_root(tmp_path)
    failure = json.loads((root / "failure.json").read_text())
    assert failure["dead_ranks"] == [1] and failure["reported_by"] == 0
    assert "rank 0 step 199" not in proc.stdout  # rank 0 did not train on alone


@pytest.mark.distributed
def test_watch_in_the_script_agrees_without_nanscope_run(tmp_path):
    proc, _ = _torchrun(tmp_path, [], [str(SCRIPT)], DDP_WATCH="1", DDP_NAN_RANK="1",
                        DDP_NAN_STEP="4")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "DivergenceError" in log and "rank 1 of 2 broke first" in log, log
    root = run_root(tmp_path)
    for rank in (0, 1):
        assert _trace_steps(root / f"rank{rank}" / "trace.jsonl") == [1, 2, 3, 4]
    merged = json.loads((root / "diagnosis.json").read_text())
    assert merged["rank"] == 1 and merged["cause"] == "nonfinite_input" and merged["step"] == 4


@pytest.mark.distributed
@pytest.mark.skipif(not _integrated(), reason="nanscope run does not call distributed.arm yet")
def test_nanscope_cli_run_under_torchrun(tmp_path):
    out = tmp_path / "d.json"
    proc, _ = _torchrun(tmp_path, ["-m", "nanscope.cli", "run"],
                        ["--json", str(out), "--", str(SCRIPT)], DDP_NAN_RANK="1",
                        DDP_NAN_STEP="5")  # fmt: skip
    assert proc.returncode != 0
    d = json.loads(out.read_text())
    assert d["rank"] == 1 and d["ranks"] == [1] and d["cause"] == "nonfinite_input"
