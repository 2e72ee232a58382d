"""What an update is when no ``optimizer.step()`` marks it (hand-made updates under ``nanscope
run``) and when one step evaluates its closure many times (LBFGS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses: nanscope run on hand-made updates

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]

MANUAL = """
import torch
torch.manual_seed(0)
X = torch.randn(128, 5)
y = X @ torch.randn(5, 1)
w = torch.zeros(5, 1, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
for step in range(40):
    idx = torch.arange(step * 16, step * 16 + 16) % 128
    loss = ((X[idx] @ w + b - y[idx]) ** 2).mean()
    loss.backward()
    if {clip}:
        torch.nn.utils.clip_grad_norm_([w, b], 0.5)
    with torch.no_grad():
        for p in (w, b):
            p -= {lr} * p.grad
            p.grad = None
print("done", float(loss))
"""


def _run(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "NANSCOPE_DIR": str(tmp_path / "runs"), "NANSCOPE_NO_LEDGER": "1",
           "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "nanscope.cli", "run", "--json", str(tmp_path / "d.json"), "--",
         sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    traces = sorted((tmp_path / "runs").rglob("trace.jsonl"))
    assert len(traces) == 1, proc.stderr[-2000:]
    lines = [json.loads(line) for line in traces[0].read_text().splitlines()]
    return proc, lines


@pytest.mark.parametrize("clip", [False, True], ids=["plain", "clipped"])
def test_a_hand_made_update_loop_is_watched_with_its_lr(tmp_path: Path, clip: bool) -> None:
    proc, lines = _run(tmp_path, MANUAL.format(lr=0.05, clip=clip))
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, records = lines[0], lines[1:]
    assert header["optimizer"] == "manual update (no torch.optim)"
    assert [r["step"] for r in records] == list(range(1, 41))  # the first update's loss is kept
    # the lr is read off each update and the (clipped) gradient it applied
    lrs = [r["lr"] for r in records if "lr" in r]
    assert len(lrs) >= 38 and all(abs(lr - 0.05) < 1e-4 for lr in lrs), lrs
    if clip:
        clipped = [r["extra"]["grad_norm_clipped"] for r in records[1:]]
        assert all(c <= 0.5 + 1e-5 for c in clipped)
        assert all(r["extra"]["grad_norm_source"] == "pre_clip" for r in records[1:])
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["verdict"] == "healthy"


def test_a_script_with_an_optimizer_gets_no_second_watcher(tmp_path: Path) -> None:
    body = MANUAL.replace("with torch.no_grad():\n        for p in (w, b):\n"
                          "            p -= {lr} * p.grad\n            p.grad = None",
                          "opt.step()\n    opt.zero_grad()")  # fmt: skip
    body = body.replace("for step in range(40):", "opt = torch.optim.SGD([w, b], lr=0.05)\n"
                        "for step in range(40):")  # fmt: skip
    proc, lines = _run(tmp_path, body.format(lr=0.05, clip=False))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert lines[0]["optimizer"] == "SGD" and len(lines) == 41


def test_an_lbfgs_update_has_the_loss_before_its_step_and_every_closure_loss(tmp_path) -> None:
    import nanscope
    from nanscope.trace import read_trace

    torch.manual_seed(0)
    X = torch.randn(64, 3, dtype=torch.float64)
    y = torch.sin(X.sum(1, keepdim=True))
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = model.double()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=10)
    seen: list[list[float]] = []
    monitor = nanscope.Monitor(run_dir=tmp_path / "run")
    with nanscope.watch(model, opt, monitor=monitor) as watcher:
        for _ in range(4):
            seen.append([])

            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(X), y)
                loss.backward()
                seen[-1].append(float(loss.detach()))
                return loss

            opt.step(closure)
        records = list(watcher.monitor.trace.records)
    assert len(records) == 4
    for record, losses in zip(records, seen):
        assert len(losses) > 1  # LBFGS evaluated the closure several times
        # the first evaluation, not the mean of all (the record holds it in float32)
        assert record["loss"] == pytest.approx(losses[0], rel=1e-6)
        assert abs(record["loss"] - sum(losses) / len(losses)) > 1e-3 * losses[0]
        assert record["extra"]["closure_losses"] == pytest.approx(losses, rel=1e-6)
    # the trace file keeps them too, on their update, and holds no extra update
    on_disk = read_trace(tmp_path / "run" / "trace.jsonl")
    assert len(on_disk) == 4 and "events" not in on_disk.meta
    for record, losses in zip(on_disk.records, seen):
        assert record["extra"]["closure_losses"] == pytest.approx(losses, rel=1e-6)


ACCUMULATED = """
import torch
torch.manual_seed(0)
X = torch.randn(256, 5)
y = X @ torch.randn(5, 1)
w = torch.zeros(5, 1, requires_grad=True)
for step in range(30):
    for micro in range(2):  # two micro-batches per update, the loss divided by 2
        idx = torch.arange((2 * step + micro) * 8, (2 * step + micro) * 8 + 8) % 256
        loss = ((X[idx] @ w - y[idx]) ** 2).mean() / 2
        loss.backward()
    torch.nn.utils.clip_grad_norm_([w], 0.5)
    with torch.no_grad():
        w.add_(w.grad, alpha=-0.1)
        w.grad = None
print("done")
"""


def test_hand_made_accumulation_is_one_update_per_step(tmp_path: Path) -> None:
    proc, lines = _run(tmp_path, ACCUMULATED)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = lines[1:]
    assert [r["step"] for r in records] == list(range(1, 31))
    lrs = [r["lr"] for r in records if "lr" in r]
    assert len(lrs) >= 28 and all(abs(lr - 0.1) < 1e-4 for lr in lrs), lrs
    # checked after the clip, on the gradient of both micro-batches
    assert all(r["extra"]["grad_norm_clipped"] <= 0.5 + 1e-5 for r in records[1:])
