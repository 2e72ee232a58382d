"""``nanscope run -- python train.py [args]``: run a training script under watch, in this process.

The script runs as ``python train.py`` would (``sys.argv``, ``__main__``, its directory first on
``sys.path``). Every :class:`nanscope.Monitor` it creates is collected; when the script imports
torch, every optimizer it creates is watched with no change to the script. When the script ends or
is stopped, the diagnosis is printed and written where ``--json``/``--html`` say.

Exit codes: 3 when nanscope stopped the run; otherwise the script's own exit code.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from nanscope.commands.common import add_output_options, show, write_html, write_json
from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.errors import DivergenceError, UsageError
from nanscope.monitor import POLICIES, Monitor, active_monitors, set_defaults

__all__ = ["Target", "main", "split_command"]

EXIT_STOPPED = 3
EXPERIMENT_CAUSES = ("step_size_too_large", "exploding_gradients", "update_sign_error")


class Target:
    """What to run: a script path or a module, with its arguments."""

    def __init__(self, script: str | None, module: str | None, args: list[str]) -> None:
        self.script = script
        self.module = module
        self.args = args

    @property
    def name(self) -> str:
        return self.script or f"-m {self.module}"

    @property
    def argv(self) -> list[str]:
        """The command line as the user gave it (for reruns: sweep, experiment)."""
        if self.module:
            return [sys.executable, "-m", self.module, *self.args]
        assert self.script is not None
        return [sys.executable, self.script, *self.args]


def split_command(command: list[str]) -> Target:
    """Parse ``python SCRIPT ARGS``, ``SCRIPT ARGS`` or ``python -m MODULE ARGS``."""
    if not command:
        raise UsageError("give the script to run after --, e.g. nanscope run -- python train.py")
    first = Path(command[0]).name
    if first.startswith("python") or command[0] == sys.executable:
        command = command[1:]
        while (command and command[0] in ("-u", "-B", "-O", "-X")) or (
            command and command[0].startswith("-W")
        ):
            command = command[2:] if command[0] == "-X" else command[1:]
    if not command:
        raise UsageError("no script given after python")
    if command[0] == "-m":
        if len(command) < 2:
            raise UsageError("-m needs a module name")
        return Target(None, command[1], command[2:])
    if command[0] == "-c":
        raise UsageError("python -c is not supported; put the code in a file")
    script = command[0]
    if not Path(script).is_file():
        raise UsageError(f"{script}: no such script")
    return Target(script, None, command[1:])


def _find_divergence(exc: BaseException | None) -> DivergenceError | None:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, DivergenceError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _execute(target: Target) -> tuple[int, DivergenceError | None]:
    """Run the target in this process; return (exit code, the stop if nanscope stopped it)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        if target.module:
            sys.argv = [target.module, *target.args]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target.module, run_name="__main__", alter_sys=True)
        else:
            assert target.script is not None
            sys.argv = [target.script, *target.args]
            sys.path.insert(0, str(Path(target.script).resolve().parent))
            runpy.run_path(target.script, run_name="__main__")
        return 0, None
    except SystemExit as exc:
        stop = _find_divergence(exc.__context__)
        if stop is not None:
            return EXIT_STOPPED, stop
        code = exc.code
        if code is None:
            return 0, None
        if isinstance(code, int):
            return code, None
        print(code, file=sys.stderr)
        return 1, None
    except KeyboardInterrupt:
        return 130, None
    except BaseException as exc:
        stop = _find_divergence(exc)
        if stop is not None:
            return EXIT_STOPPED, stop
        traceback.print_exc()
        return 1, None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _pick(
    monitors: list[Monitor], stop: DivergenceError | None
) -> tuple[Diagnosis | None, Monitor | None]:
    """The diagnosis to report: the one that stopped the run, else the worst of the monitors."""
    if stop is not None and stop.diagnosis is not None:
        owner = next((m for m in monitors if m.diagnosis is stop.diagnosis), None)
        return stop.diagnosis, owner
    order = {"nonfinite": 0, "diverging": 1, "suspect": 2, "healthy": 3}
    best: tuple[Diagnosis | None, Monitor | None] = (None, None)
    for monitor in monitors:
        diagnosis = monitor.close()
        if best[0] is None or order.get(diagnosis.verdict, 9) < order.get(best[0].verdict, 9):
            best = (diagnosis, monitor)
    return best


def _arm_torch() -> None:
    try:
        from nanscope.torch import autowatch
    except ImportError:
        return
    try:
        autowatch.arm()
    except Exception as exc:  # watching must never stop the script from running
        warnings.warn(f"nanscope: could not arm the PyTorch hooks ({exc})", RuntimeWarning,
                      stacklevel=2)  # fmt: skip


def _distributed() -> Any:
    """The distributed helpers when this process is one rank of a torchrun job, else None."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_RANK" not in os.environ:
        return None
    try:
        from nanscope.torch import distributed
    except ImportError:
        return None
    return distributed


def _remembered(target: Target) -> None:
    if not target.script:
        return
    try:
        from nanscope.ledger import remembered_line
    except ImportError:
        return
    try:
        line = remembered_line(target.script)
    except Exception:
        return
    if line:
        print(f"nanscope: {line}", file=sys.stderr)


def _record(diagnosis: Diagnosis, monitor: Monitor | None, target: Target, started: float) -> None:
    try:
        from nanscope.ledger import record_diagnosis
    except ImportError:
        return
    try:
        rollbacks = len(monitor.rollbacks) if monitor is not None else 0
        record_diagnosis(
            diagnosis,
            monitor,
            script=target.script,
            duration=time.time() - started,
            rollbacks=rollbacks,
        )
    except Exception as exc:
        warnings.warn(f"nanscope: ledger not updated ({exc})", RuntimeWarning, stacklevel=2)


def _enrich(diagnosis: Diagnosis, args: argparse.Namespace, target: Target) -> None:
    """Add what later stages know: the sweep, the data scan, the lint near the located line."""
    if args.experiment and diagnosis.cause in EXPERIMENT_CAUSES:
        try:
            from nanscope.experiment import run_experiment

            print("nanscope: running the tenfold learning-rate cut...", file=sys.stderr)
            diagnosis.extra["experiment"] = run_experiment(diagnosis, target.argv)
        except Exception as exc:
            print(f"nanscope: the experiment could not run ({exc})", file=sys.stderr)
    if args.data and diagnosis.cause in ("nonfinite_input", "extreme_batch", "step_size_too_large"):
        try:
            diagnosis.extra["scan"] = link_scan(args.data, diagnosis)
        except Exception as exc:
            print(f"nanscope: the data scan could not run ({exc})", file=sys.stderr)
    source = (diagnosis.located or {}).get("source") or {}
    if source.get("file") and source.get("line"):
        try:
            from nanscope.lint import lint_near

            found = lint_near(str(source["file"]), int(source["line"]))
            diagnosis.extra["lint"] = [f.to_dict() for f in found]
        except Exception:
            pass


def link_scan(path: str, diagnosis: Diagnosis) -> dict[str, object]:
    """Scan the data file and keep the findings about the rows and columns the diagnosis names."""
    from nanscope.data import scan

    report = scan(path)
    rows = [int(r["dataset_row"]) for r in diagnosis.rows if r.get("dataset_row") is not None]
    findings = report.findings_for(rows=rows or None)
    return {
        "path": path,
        "rows": rows,
        "findings": [f.to_dict() for f in findings],
    }


def main(argv: list[str]) -> int:
    if "--" in argv:
        cut = argv.index("--")
        options, command = argv[:cut], argv[cut + 1 :]
    else:
        options, command = [], argv
        # allow `nanscope run --policy warn train.py`: options first, then the script
        while command and command[0].startswith("-"):
            takes_value = command[0] in ("--json", "--policy", "--html", "--data", "--run-dir")
            options.extend(command[: 2 if takes_value else 1])
            command = command[2 if takes_value else 1 :]
    parser = argparse.ArgumentParser(
        prog="nanscope run",
        description="Run a training script under watch: nanscope run [options] -- python train.py",
    )
    add_output_options(parser)
    parser.add_argument("--policy", choices=POLICIES, default=None,
                        help="what to do when the fit breaks (default: raise)")  # fmt: skip
    parser.add_argument("--experiment", action="store_true",
                        help="on a step-size/sign/gradient cause, run the lr sweep")  # fmt: skip
    parser.add_argument("--data", metavar="PATH", help="the data file, to link scan findings")
    parser.add_argument("--run-dir", metavar="DIR", help="root folder for run directories")
    args = parser.parse_args(options)
    target = split_command(command)
    set_defaults(policy=args.policy, root=args.run_dir, keep=True)
    if args.policy:
        os.environ["NANSCOPE_POLICY"] = args.policy
    ranks = _distributed()
    rank = int(os.environ.get("RANK", "0") or 0) if ranks else 0
    if rank:
        # one report per job: rank 0 writes the merged one, the others keep theirs beside it
        args.json = None if args.json == "-" else (args.json and f"{args.json}.rank{rank}")
        args.html = args.html and f"{args.html}.rank{rank}"
    if ranks and args.experiment:
        print("nanscope: --experiment is skipped under torchrun (the sweep reruns single-process)",
              file=sys.stderr)  # fmt: skip
        args.experiment = False
    if rank == 0:
        _remembered(target)
    _arm_torch()
    if ranks:
        ranks.arm()
    started = time.time()
    before = set(id(m) for m in active_monitors())
    code, stop = _execute(target)
    monitors = [m for m in active_monitors() if id(m) not in before]
    diagnosis, owner = _pick(monitors, stop)
    if ranks and diagnosis is not None:
        diagnosis = ranks.finish(diagnosis, code=code)
    if diagnosis is None:
        print(
            f"nanscope: {target.name} created no Monitor and no watched optimizer stepped; "
            "nothing to diagnose",
            file=sys.stderr,
        )
        return code
    trace = owner.trace if owner is not None else None
    _enrich(diagnosis, args, target)
    if owner is not None:
        owner.save_diagnosis(diagnosis)
    if args.json != "-" or diagnosis.verdict != "healthy":
        show(diagnosis, trace, no_color=args.no_color)
    write_json(diagnosis, args.json)
    write_html(diagnosis, trace, args.html)
    if rank == 0:
        _record(diagnosis, owner, target, started)
    if stop is not None:
        return EXIT_STOPPED
    return code
