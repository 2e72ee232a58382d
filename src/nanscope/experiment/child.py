"""The sweep's child process: run a training script for its first N updates at lr x factor.

``python -m nanscope.experiment.child --factor F --updates N --out RESULT.json -- TARGET...``

TARGET is ``train.py [args]``, ``python train.py [args]`` or ``python -m module [args]``. Before the
script runs, the child seeds ``random`` and ``numpy`` (torch when it is imported), installs the lr
patch (:mod:`nanscope.experiment.lrpatch`), and wraps ``Monitor.observe``. An *update* is one
step of the first PyTorch optimizer that steps (its loss: the sum of the scalars ``backward()``
was called on since the last step, the micro-batches of a gradient accumulation; the first
closure evaluation for LBFGS; or what a Monitor was told), or, in a script that updates its
parameters by hand, the parameters changing between two ``backward()`` calls (the lr patch
scales their gradients), or, in a script without torch, one ``Monitor.update``. After N
updates, or at the first non-finite loss, the child ends the script by raising a private
exception. It appends one JSON line per update to
``RESULT.json.progress`` (the parent's progress display reads it; a killed child still leaves its
curve there) and writes ``RESULT.json`` at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import runpy
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["Target", "main", "parse_target"]


@dataclass(frozen=True)
class Target:
    """What to run: a script path, a module (``-m``) or code (``-c``), and its arguments."""

    kind: str  # "path" | "module" | "code"
    value: str
    args: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.value if self.kind != "code" else "-c"


def _is_python(word: str) -> bool:
    base = os.path.basename(word).lower()
    return base.startswith("python") or base in ("py", "py.exe")


def parse_target(argv: list[str]) -> Target:
    """``[python [flags]] script.py args`` / ``python -m mod args`` / ``python -c code args``."""
    from nanscope.errors import UsageError

    words = list(argv)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError("no script given: nanscope sweep [options] -- python train.py [args]")
    if _is_python(words[0]) and not words[0].endswith(".py"):
        words = words[1:]
        while words and words[0].startswith("-") and words[0] not in ("-m", "-c"):
            flag = words.pop(0)
            if flag in ("-W", "-X") and words:
                words.pop(0)
        if not words:
            raise UsageError("the python command names no script: add train.py or -m module")
        if words[0] in ("-m", "-c"):
            if len(words) < 2:
                raise UsageError(f"python {words[0]} needs an argument")
            kind = "module" if words[0] == "-m" else "code"
            return Target(kind, words[1], tuple(words[2:]))
    return Target("path", words[0], tuple(words[1:]))


class _Harness:
    def __init__(self, factor: float, updates: int, progress: IO[str] | None) -> None:
        self.factor = factor
        self.limit = updates
        self.progress = progress
        self.mode: str | None = None  # "torch" | "monitor"
        self.losses: list[float | None] = []
        self.pending: list[float] = []
        self.closure: list[float] = []
        self.events: Any = None
        self.monitor_loss: float | None = None
        self.primary: Any = None
        self.optimizers: list[str] = []
        self.base_lr: float | None = None
        self.lr: float | None = None

    # torch ---------------------------------------------------------------------------
    def on_optimizer(self, optimizer: Any, base: Any) -> None:
        if self.mode != "torch" and not self.losses:
            self.mode = "torch"
        self.optimizers.append(type(optimizer).__name__)
        if self.base_lr is None and base is not None:
            try:
                self.base_lr = float(base)
                self.lr = self.base_lr * self.factor  # applied at each step (lrpatch)
            except (TypeError, ValueError, IndexError, KeyError):
                pass

    def on_backward(self, value: float) -> None:
        if self.events is not None and self.events.in_step:
            self.closure.append(value)  # LBFGS's closure, evaluated inside the step
        else:
            self.pending.append(value)

    def _update_loss(self) -> float | None:
        """The loss of the update just made: the sum of the losses ``backward()`` was called on
        since the last update (the micro-batches of a gradient accumulation, each divided by the
        number of them as nanoGPT does: their sum is the batch's loss, whose gradient the update
        applied), or, for a closure optimizer, the first closure evaluation (the loss at the
        weights before the step)."""
        if self.pending:
            loss: float | None = sum(self.pending)
        elif self.closure:
            loss = self.closure[0]
        else:
            loss = None
        self.pending, self.closure = [], []
        return loss

    def on_manual_update(self, lr: float | None) -> None:
        """The script changed its parameters by hand since the last backward: one update, whose
        loss is the backward (or mean of the micro-batch backwards) before it."""
        if self.mode == "torch":
            return
        self.mode = "manual"
        if self.lr is None and lr is not None:
            self.lr = lr  # as applied, read off the change and the gradient
            self.base_lr = lr / self.factor
        self.add(self._update_loss())

    def on_step(self, optimizer: Any) -> None:
        if self.mode != "torch":
            return
        if self.primary is None:
            self.primary = optimizer
        if optimizer is not self.primary:
            return
        loss = self._update_loss()
        if self.monitor_loss is not None:
            loss = self.monitor_loss
        self.monitor_loss = None
        self.add(loss)

    # monitor -------------------------------------------------------------------------
    def on_observe(self, record: Any) -> None:
        loss = record.get("loss") if hasattr(record, "get") else None
        value = float(loss) if isinstance(loss, (int, float)) else None
        if self.mode == "torch":
            self.monitor_loss = value
            return
        self.mode = "monitor"
        lr = record.get("lr")
        if self.base_lr is None and isinstance(lr, (int, float)):
            self.lr = float(lr)
            self.base_lr = float(lr) / self.factor
        self.add(value)

    def add(self, loss: float | None) -> None:
        from nanscope.experiment.sweep import StopSweep

        self.losses.append(loss)
        if self.progress is not None:
            value: Any = loss
            if loss is not None and not math.isfinite(loss):
                value = str(loss)
            self.progress.write(json.dumps({"update": len(self.losses), "loss": value}) + "\n")
            self.progress.flush()
        if len(self.losses) >= self.limit or (loss is not None and not math.isfinite(loss)):
            raise StopSweep


def _wrap_monitor(harness: _Harness) -> None:
    from nanscope import monitor

    monitor.observers.append(lambda _monitor, record: harness.on_observe(record))


def _seed(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy is a core dependency
        pass


def _run_target(target: Target) -> None:
    if target.kind == "path":
        path = os.path.abspath(target.value)
        sys.argv = [target.value, *target.args]
        sys.path[0] = os.path.dirname(path)
        runpy.run_path(path, run_name="__main__")
    elif target.kind == "module":
        sys.argv = [target.value, *target.args]
        sys.path[0] = os.getcwd()
        runpy.run_module(target.value, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *target.args]
        sys.path[0] = ""
        code = compile(target.value, "<string>", "exec")
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


def _where(exc: BaseException) -> str | None:
    """The last frame of the traceback that is not nanscope's own or the standard library's."""
    here = str(Path(__file__).resolve().parents[1])
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if not frame.filename.startswith(here) and "runpy" not in frame.filename:
            return f"{frame.filename}:{frame.lineno}"
    return None


def _encode(values: list[float | None]) -> list[Any]:
    return [v if v is None or math.isfinite(v) else str(v) for v in values]


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    split = args_list.index("--") if "--" in args_list else len(args_list)
    parser = argparse.ArgumentParser(prog="python -m nanscope.experiment.child")
    parser.add_argument("--factor", type=float, required=True)
    parser.add_argument("--updates", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(args_list[:split])
    target = parse_target(args_list[split + 1 :])

    from nanscope.errors import DivergenceError
    from nanscope.experiment import lrpatch
    from nanscope.experiment.sweep import StopSweep
    from nanscope.monitor import active_monitors, set_defaults

    out = Path(opts.out)
    progress = open(str(out) + ".progress", "w", encoding="utf-8")  # noqa: SIM115
    harness = _Harness(opts.factor, opts.updates, progress)
    events = lrpatch.TorchEvents()
    events.on_optimizer = harness.on_optimizer
    events.on_step = harness.on_step
    events.on_backward = harness.on_backward
    events.on_manual_update = harness.on_manual_update
    harness.events = events
    _seed(opts.seed)
    lrpatch.install(opts.factor, seed=opts.seed, events=events)
    _wrap_monitor(harness)
    set_defaults(policy=os.environ.get("NANSCOPE_POLICY") or "warn")

    status, exit_code, error, where = "exited", 0, None, None
    alarm: dict[str, Any] | None = None
    started = time.perf_counter()
    try:
        _run_target(target)
    except StopSweep:
        status = "reached" if len(harness.losses) >= opts.updates else "stopped"
    except DivergenceError as exc:
        status = "stopped"
        diagnosis = exc.diagnosis
        if diagnosis is not None:
            alarm = {"kind": diagnosis.verdict, "step": diagnosis.step, "cause": diagnosis.cause}
    except SystemExit as exc:
        code = exc.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        if exit_code != 0:
            status, error = "error", f"the script exited with status {exit_code}"
            if not isinstance(code, int) and code is not None:
                error += f" ({code})"
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        status, error, where = "error", f"{type(exc).__name__}: {exc}", _where(exc)
        traceback.print_exc()
    duration = time.perf_counter() - started
    for monitor in active_monitors():
        if alarm is None and monitor.alarm is not None and harness.mode == "monitor":
            alarm = {"kind": monitor.alarm.kind, "step": monitor.alarm.step}
    result = {
        "factor": opts.factor,
        "updates": len(harness.losses),
        "requested": opts.updates,
        "losses": _encode(harness.losses),
        "status": status,
        "exit_code": exit_code,
        "error": error,
        "where": where,
        "mode": harness.mode,
        "optimizers": harness.optimizers,
        "base_lr": harness.base_lr,
        "lr": harness.lr,
        "factor_read": lrpatch.factor_was_read(),
        "alarm": alarm,
        "duration": duration,
    }
    progress.close()
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # the script may leave non-daemon threads (data loaders, loggers): do not wait for them
    os._exit(code)
