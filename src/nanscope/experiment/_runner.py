"""Run a script's sweep: one child process per factor, as many at once as there are cores."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nanscope
from nanscope._messages import quiet, status
from nanscope.errors import InputError, UsageError
from nanscope.experiment.child import Target, parse_target
from nanscope.experiment.sweep import (
    FactorResult,
    SweepResult,
    check_positive,
    check_updates,
    classify,
)

__all__ = ["NO_STEP", "run_sweep"]

NO_STEP = (
    "no optimizer step seen: is this a training script? (PyTorch optimizers are found by "
    "themselves; any other fit reports each update with nanscope.Monitor.update and multiplies its "
    "learning rate by nanscope.experiment.lr_factor())"
)

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass
class _Child:
    factor: float
    out: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    returncode: int | None = None
    timed_out: bool = False
    started: float = 0.0
    duration: float = 0.0
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seen(self) -> int:
        try:
            with open(str(self.out) + ".progress", encoding="utf-8") as fh:
                return sum(1 for _ in fh)
        except OSError:
            return 0


def _check_target(target: Target) -> None:
    """Refuse, before any child starts, a target that cannot be a Python training script."""
    if target.kind == "path":
        path = Path(target.value)
        if not path.exists():
            raise InputError(f"script not found: {target.value}")
        if path.is_dir():
            raise InputError(f"{target.value} is a directory, not a script")
        try:
            with path.open("rb") as fh:
                head = fh.read(4096)
        except OSError as exc:
            raise InputError(f"{target.value}: cannot be read ({exc.strerror or exc})") from None
        if b"\x00" in head:
            raise InputError(
                f"{target.value} is not a Python script (a binary file); the sweep reruns Python "
                "training scripts"
            )
    elif target.kind == "module":
        _check_module(target.value)


def _check_module(module: str) -> None:
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
    except Exception as exc:  # a parent package that is missing or fails to import
        raise InputError(f"-m {module}: cannot be found ({type(exc).__name__}: {exc})") from None
    finally:
        sys.path.pop(0)
    if spec is None:
        raise InputError(f"-m {module}: no module named {module!r} (from {os.getcwd()})")


def _child_env(factor: float, jobs: int, root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env["NANSCOPE_LR_FACTOR"] = repr(float(factor))
    env["NANSCOPE_DIR"] = str(root / "runs")
    env["NANSCOPE_NO_LEDGER"] = "1"
    threads = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    for name in _THREAD_VARS:
        env.setdefault(name, threads)
    package_root = str(Path(nanscope.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    return env


def _run_child(
    child: _Child,
    command: list[str],
    env: dict[str, str],
    timeout: float | None,
    stopping: threading.Event,
) -> None:
    child.started = time.perf_counter()
    with open(child.log, "wb") as log:
        with child.lock:
            if stopping.is_set():
                child.done = True
                return
            child.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        try:
            child.returncode = child.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.timed_out = True
            child.process.kill()
            child.returncode = child.process.wait()
    child.duration = time.perf_counter() - child.started
    child.done = True


def _read_progress(child: _Child) -> list[float | None]:
    losses: list[float | None] = []
    try:
        with open(str(child.out) + ".progress", encoding="utf-8") as fh:
            for line in fh:
                try:
                    losses.append(_decode(json.loads(line).get("loss")))
                except ValueError:
                    break
    except OSError:
        pass
    return losses


def _decode(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        return float(value)  # "nan", "inf", "-inf"
    return float(value)


def _log_tail(child: _Child, lines: int = 6) -> str:
    try:
        text = child.log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _result(child: _Child, updates: int) -> tuple[FactorResult, dict[str, Any]]:
    raw: dict[str, Any] = {}
    try:
        raw = json.loads(child.out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = {}
    if raw:
        losses = [_decode(v) for v in raw.get("losses", [])]
    else:
        losses = _read_progress(child)
    error = raw.get("error")
    if not raw:
        if child.timed_out:
            error = "timed out"
        else:
            error = f"the child process died (exit status {child.returncode})"
            tail = _log_tail(child, 1)
            if tail:
                error += f": {tail}"
    alarm = raw.get("alarm") or {}
    outcome, at = classify(losses, alarm_step=alarm.get("step"), alarm_kind=alarm.get("kind"))
    if error is not None and outcome not in ("diverged", "nonfinite"):
        outcome, at = "error", None
    base_lr = raw.get("base_lr")
    lr = base_lr * child.factor if isinstance(base_lr, (int, float)) else None
    note = None
    if raw.get("status") == "exited" and len(losses) < updates:
        note = f"the script ended by itself after {len(losses)} updates"
    if raw.get("where"):
        note = f"raised at {raw['where']}"
    extra = {"optimizers": raw.get("optimizers", []), "mode": raw.get("mode")}
    result = FactorResult(
        factor=child.factor,
        lr=lr,
        outcome=outcome,
        at_update=at,
        updates=len(losses),
        requested=updates,
        losses=losses,
        error=error,
        note=note,
        duration=float(raw.get("duration") or child.duration),
        extra=extra,
    )
    return result, raw


class _Display:
    """A rich progress display on stderr (a terminal), else one plain line per finished factor."""

    def __init__(self, children: list[_Child], updates: int, live: bool) -> None:
        self.children = children
        self.updates = updates
        self.progress: Any = None
        self.tasks: dict[float, Any] = {}
        self.reported: set[float] = set()
        if live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.progress = Progress(
                TextColumn("lr ×{task.fields[factor]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[state]}"),
                console=Console(stderr=True),
                transient=False,
            )
            for child in children:
                self.tasks[child.factor] = self.progress.add_task(
                    "", total=updates, factor=f"{child.factor:g}", state="waiting"
                )
            self.progress.start()

    def refresh(self) -> None:
        if self.progress is None:
            return
        for child in self.children:
            task = self.tasks[child.factor]
            self.progress.update(task, completed=min(child.seen(), self.updates))
            if child.factor not in self.reported:
                state = "running" if child.process else "waiting"
                self.progress.update(task, state=state)

    def finished(self, result: FactorResult) -> None:
        if result.factor in self.reported:
            return
        self.reported.add(result.factor)
        if self.progress is not None:
            self.progress.update(self.tasks[result.factor], state=result.outcome)
        else:
            status(
                f"nanscope sweep: lr ×{result.factor:g}: {result.phrase()} "
                f"({result.updates} updates, {result.duration:.1f} s)"
            )

    def stop(self) -> None:
        if self.progress is not None:
            self.refresh()
            self.progress.stop()


def run_sweep(
    argv: Sequence[str],
    factors: Sequence[float] = (1.0, 0.1, 0.01),
    updates: int = 50,
    *,
    jobs: int | None = None,
    seed: int = 0,
    timeout: float | None = None,
    progress: bool | None = None,
) -> SweepResult:
    """Rerun the script ``argv`` for its first ``updates`` updates at lr × each factor.

    ``argv``: ``["python", "train.py", ...]``, ``["train.py", ...]`` or ``["python", "-m", "mod"]``.
    ``jobs``: child processes at once (default: the number of cores). ``progress``: ``None`` shows
    a live display when stderr is a terminal. Raises :class:`~nanscope.errors.UsageError` for bad
    factors or updates, :class:`~nanscope.errors.InputError` when the script is missing or never
    makes an update.
    """
    factor_list = check_positive(factors, "factors")
    check_updates(updates)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UsageError(f"jobs must be a whole number of at least 1; got {jobs!r}")
    if timeout is not None and not (timeout > 0):
        raise UsageError(f"timeout must be a positive number of seconds; got {timeout!r}")
    target = parse_target(list(argv))
    _check_target(target)
    workers = min(len(factor_list), jobs or os.cpu_count() or 1)
    root = Path(tempfile.mkdtemp(prefix="nanscope-sweep-"))
    children = [
        _Child(factor=f, out=root / f"factor-{i}.json", log=root / f"factor-{i}.log")
        for i, f in enumerate(factor_list)
    ]
    live = sys.stderr.isatty() and not quiet() if progress is None else progress
    display = _Display(children, updates, live=bool(live))
    stopping = threading.Event()
    results: dict[float, tuple[FactorResult, dict[str, Any]]] = {}
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures: list[tuple[_Child, Future[None]]] = []
            for child in children:
                command = [
                    sys.executable, "-m", "nanscope.experiment.child",
                    "--factor", repr(child.factor), "--updates", str(updates),
                    "--seed", str(seed), "--out", str(child.out), "--", *argv,
                ]  # fmt: skip
                env = _child_env(child.factor, workers, root)
                futures.append(
                    (child, pool.submit(_run_child, child, command, env, timeout, stopping))
                )
            try:
                while len(results) < len(children):
                    for child, future in futures:
                        if future.done() and child.factor not in results:
                            future.result()
                            results[child.factor] = _result(child, updates)
                            display.finished(results[child.factor][0])
                    display.refresh()
                    time.sleep(0.1)
            except BaseException:
                stopping.set()
                for child in children:
                    with child.lock:
                        if child.process is not None and child.process.poll() is None:
                            child.process.kill()
                raise
    finally:
        display.stop()
        shutil.rmtree(root, ignore_errors=True)
    ordered = [results[f] for f in factor_list]
    _check_seen(target, [raw for _, raw in ordered], [r for r, _ in ordered], factor_list)
    base = next((raw.get("base_lr") for _, raw in ordered if raw.get("base_lr") is not None), None)
    sweep = SweepResult(
        results=[r for r, _ in ordered],
        updates=updates,
        base_lr=float(base) if isinstance(base, (int, float)) and math.isfinite(base) else None,
        extra={"script": target.name, "args": list(target.args)},
    )
    return sweep


def _check_seen(
    target: Target,
    raws: list[dict[str, Any]],
    results: list[FactorResult],
    factors: list[float],
) -> None:
    """Input errors that make the sweep meaningless: no update at all, or a factor nobody read."""
    if all(r.updates == 0 for r in results):
        errors = [r.error for r in results if r.error]
        if errors and not any(raw.get("optimizers") for raw in raws):
            raise InputError(f"{target.name} failed before its first update: {errors[0]}")
        made = sorted({name for raw in raws for name in raw.get("optimizers", [])})
        if made:
            raise InputError(
                f"{target.name} built an optimizer ({', '.join(made)}) but never stepped it "
                "before it ended: " + NO_STEP.split(": ", 1)[1]
            )
        raise InputError(NO_STEP)
    monitor_only = all(raw.get("mode") in ("monitor", None) for raw in raws)
    if monitor_only and len(factors) > 1 and not any(raw.get("factor_read") for raw in raws):
        raise InputError(
            f"{target.name} reports its updates through a Monitor but never reads the sweep's "
            "factor, so every run would be the same: multiply its learning rate by "
            "nanscope.experiment.lr_factor()"
        )
