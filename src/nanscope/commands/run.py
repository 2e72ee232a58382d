"""``nanscope run -- python train.py [args]``: run a training script under watch, in this process.

The script runs as ``python train.py`` would (``sys.argv``, ``__main__``, its directory first on
``sys.path``). Every :class:`nanscope.Monitor` it creates is collected; when the script imports
torch, every optimizer it creates is watched with no change to the script. When the script ends or
is stopped, the diagnosis is printed and written where ``--json``/``--html`` say.

Exit codes: 3 when nanscope stopped the run; otherwise the script's own exit code.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import os
import runpy
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

from nanscope._extras import extra_for
from nanscope._frames import is_nanscope
from nanscope.commands.base import CommandParser, check_folder, clean, progress, warn
from nanscope.commands.interpreter import other_python, run_in
from nanscope.commands.output import add_output_options, show, write_html, write_json
from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.diagnose.verdict import Verdict, rank_of
from nanscope.errors import DivergenceError, UsageError
from nanscope.monitor import POLICIES, Monitor, active_monitors, set_defaults

__all__ = ["Target", "main", "parser", "split_command", "split_options"]

EXIT_STOPPED = 3
EXPERIMENT_CAUSES = ("step_size_too_large", "exploding_gradients", "update_sign_error")
#: what a killed run exits with, as a shell reports it (128 + signal number)
_SIGNAL_EXIT = {"SIGINT": 130, "KeyboardInterrupt": 130, "SIGTERM": 143}


class Target:
    """What to run: a script path, a module, ``-c`` code, or a program that is not Python."""

    def __init__(
        self,
        script: str | None,
        module: str | None,
        args: list[str],
        *,
        code: str | None = None,
        program: list[str] | None = None,
    ) -> None:
        self.script = script
        #: the script's absolute path, taken before it runs (a script may chdir): the ledger's key
        self.path = str(Path(script).resolve()) if script else None
        self.module = module
        self.args = args
        self.code = code
        #: a command that is not Python (``/bin/false``, ``bash x.sh``): run as a subprocess
        self.program = program

    @property
    def kind(self) -> str:
        if self.program is not None:
            return "program"
        if self.module:
            return "module"
        if self.code is not None:
            return "code"
        return "script"

    @property
    def name(self) -> str:
        if self.program is not None:
            return clean(" ".join(self.program), 80)
        if self.module:
            return f"-m {self.module}"
        if self.code is not None:
            return "python -c"
        return self.script or "?"

    @property
    def argv(self) -> list[str]:
        """The command line as the user gave it (for reruns: sweep, experiment)."""
        if self.program is not None:
            return list(self.program)
        if self.module:
            return [sys.executable, "-m", self.module, *self.args]
        if self.code is not None:
            return [sys.executable, "-c", self.code, *self.args]
        assert self.script is not None
        return [sys.executable, self.script, *self.args]


def _looks_python(path: Path) -> bool:
    """A file Python would run: ``.py``, or a text file with no NUL byte whose shebang (if it has
    one) names python."""
    if path.suffix in (".py", ".pyw"):
        return True
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if b"\x00" in head:
        return False
    if head.startswith(b"#!"):
        return b"python" in head.split(b"\n", 1)[0]
    return not os.access(path, os.X_OK)


def _check_module(module: str) -> None:
    """Raise UsageError when ``python -m module`` would fail before running any of its code."""
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
        package = spec is not None and spec.submodule_search_locations is not None
        if package and importlib.util.find_spec(f"{module}.__main__") is None:
            raise UsageError(f"-m {module}: is a package with no __main__.py, so it cannot be run")
    except UsageError:
        raise
    except Exception as exc:  # ModuleNotFoundError of a parent, an error importing a parent
        raise UsageError(f"-m {module}: cannot be found ({clean(exc, 200)})") from None
    finally:
        sys.path.pop(0)
    if spec is None:
        raise UsageError(f"-m {module}: no module named {module!r} (from {os.getcwd()})")


def split_command(command: list[str]) -> Target:
    """Parse ``python SCRIPT ARGS``, ``python -m MODULE ARGS``, ``python -c CODE ARGS``,
    ``SCRIPT ARGS``, or any other program (run unwatched as a subprocess)."""
    if not command:
        raise UsageError("give the script to run after --, e.g. nanscope run -- python train.py")
    first = Path(command[0]).name
    if first.startswith("python") or command[0] == sys.executable:
        command = command[1:]
        while (command and command[0] in ("-u", "-B", "-O", "-X", "-E", "-s", "-I")) or (
            command and command[0].startswith("-W")
        ):
            takes = command[0] == "-X" or command[0] == "-W"
            command = command[2:] if takes else command[1:]
        if not command:
            raise UsageError("no script given after python")
        if command[0] == "-m":
            if len(command) < 2:
                raise UsageError("-m needs a module name")
            _check_module(command[1])
            return Target(None, command[1], command[2:])
        if command[0] == "-c":
            if len(command) < 2:
                raise UsageError("-c needs the code to run")
            return Target(None, None, command[2:], code=command[1])
        script = command[0]
        path = Path(script)
        if path.is_dir():
            if not (path / "__main__.py").is_file():
                raise UsageError(f"{clean(script)}: is a directory with no __main__.py, so "
                                 "Python cannot run it")  # fmt: skip
            return Target(script, None, command[1:])  # python runs its __main__.py
        if not path.is_file():
            raise UsageError(f"{clean(script)}: no such script")
        if not _looks_python(path) and path.suffix not in (".py", ".pyw"):
            with path.open("rb") as fh:
                if b"\x00" in fh.read(4096):
                    raise UsageError(f"{clean(script)}: is a binary file, not a Python script")
        return Target(script, None, command[1:])
    script = command[0]
    path = Path(script)
    if path.is_file():
        if _looks_python(path):
            return Target(script, None, command[1:])
        return Target(None, None, command[1:], program=list(command))
    if path.is_dir():
        if (path / "__main__.py").is_file():
            return Target(script, None, command[1:])
        raise UsageError(f"{clean(script)}: is a directory with no __main__.py, not a script")
    if shutil.which(script) is not None:
        return Target(None, None, command[1:], program=list(command))
    raise UsageError(f"{clean(script)}: no such script or program")


def _find_divergence(exc: BaseException | None) -> DivergenceError | None:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, DivergenceError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


class _Terminated(BaseException):
    """SIGTERM, raised in the script's main thread so the run is reported like a Ctrl-C."""


class _Signals:
    """While the script runs: SIGINT and SIGTERM noted (so an interrupt the script swallows is
    still known), SIGTERM turned into an exception that unwinds the script."""

    def __init__(self) -> None:
        self.caught: str | None = None
        #: "ValueError at train.py:47" when the script ended with an uncaught exception
        self.crashed: str | None = None
        #: that exception as a run event's fields: type, message, file, line
        self.crash: dict[str, Any] | None = None
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self._saved[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_int)
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                self._saved[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_term)
        except (ValueError, OSError):
            pass
        return self

    def _on_int(self, signum: int, frame: Any) -> None:
        self.caught = self.caught or "SIGINT"
        raise KeyboardInterrupt

    def _on_term(self, signum: int, frame: Any) -> None:
        self.caught = self.caught or "SIGTERM"
        raise _Terminated

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, handler)


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Any:
    """While the script runs with ``--json -``: its stdout (Python's ``print``, a C library's
    writes to file descriptor 1, its subprocesses') goes to stderr, so stdout carries the JSON
    alone and pipes into ``jq``."""
    if not active:
        yield
        return
    saved_stream, saved_fd = sys.stdout, None
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    try:
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved_fd = None  # no file descriptors to move (an embedded interpreter): Python's alone
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.stdout = saved_stream
        if saved_fd is not None:
            with contextlib.suppress(OSError):
                os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _user_traceback(exc: BaseException) -> None:
    """Print the script's traceback as ``python train.py`` would: no nanscope or runpy frames
    (nanscope's import hook sits between a script's ``import`` and the module it imports)."""
    report = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    todo = [report]
    while todo:
        part = todo.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        # none of the script's own (it did not compile): Python prints the error alone, so do we
        part.stack = traceback.StackSummary.from_list(
            [f for f in part.stack if not _is_ours(f.filename)]
        )
        todo.extend(p for p in (part.__cause__, part.__context__) if p is not None)
    sys.stderr.write("".join(report.format()))
    extra = extra_for(exc.name) if isinstance(exc, ModuleNotFoundError) else None
    if extra is not None:
        # a framework missing under nanscope: it was installed away from the training packages
        progress(f"nanscope: {_package(exc)} is not installed for {sys.executable}, the "
                 "Python that runs the script: install nanscope in the environment that has it "
                 f"(pip install 'nanscope[{extra}]' there)")  # fmt: skip


def _package(exc: BaseException) -> str:
    """The top-level package a ``ModuleNotFoundError`` names."""
    return str(getattr(exc, "name", None) or "?").split(".", 1)[0]


def _where_it_crashed(exc: BaseException) -> str:
    """``"ValueError at train.py:47"``: the exception and the script's innermost line it passed."""
    crash = _crash_event(exc)
    where = f" at {os.path.basename(crash['file'])}:{crash['line']}" if crash["file"] else ""
    return f"{crash['type']}{where}"


def _crash_event(exc: BaseException) -> dict[str, Any]:
    """The script's own exception as a ``crashed`` event: its type, message (one line, bounded)
    and the script's innermost line it passed (``file`` as the traceback names it, ``line``)."""
    message = clean(str(exc).strip().splitlines()[0] if str(exc).strip() else "", 200)
    event: dict[str, Any] = {"type": type(exc).__name__, "message": message, "file": None,
                             "line": None}  # fmt: skip
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:  # the file that won't parse
        event.update(file=exc.filename, line=exc.lineno, message=clean(exc.msg or "", 200))
        return event
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _is_ours(f.filename)]
    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    own = [f for f in frames if "-packages" not in f.filename
           and not f.filename.startswith(("<", stdlib))]  # fmt: skip
    at = (own or frames)[-1:] if frames else []
    if at:
        event.update(file=at[0].filename, line=at[0].lineno)
    return event


def _is_ours(filename: str) -> bool:
    """nanscope's own frames and runpy's, which ``python train.py`` would not show."""
    return (
        is_nanscope(filename)
        or filename == "<frozen runpy>"
        or filename.endswith(f"{os.sep}runpy.py")
    )


def _run_code(code: str) -> None:
    """``python -c code``: run in a fresh ``__main__`` module, the current folder on sys.path."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(compile(code, "<string>", "exec"), module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _run_program(target: Target, signals: _Signals) -> int:
    """A program that is not Python: run it, wait, pass its exit code through."""
    assert target.program is not None
    try:
        proc = subprocess.Popen(target.program)
    except OSError as exc:
        raise UsageError(f"{target.name}: cannot be run ({exc.strerror or exc})") from None
    while True:
        try:
            code = proc.wait()
            # killed by a signal: report it as a shell would (128 + the signal's number)
            return 128 - code if code < 0 else code
        except (KeyboardInterrupt, _Terminated):
            signals.caught = signals.caught or "SIGINT"
            with contextlib.suppress(OSError):
                proc.terminate()


def _execute(target: Target, signals: _Signals) -> tuple[int, DivergenceError | None]:
    """Run the target in this process; return (exit code, the stop if nanscope stopped it)."""
    if target.program is not None:
        return _run_program(target, signals), None
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        if target.module:
            sys.argv = [target.module, *target.args]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target.module, run_name="__main__", alter_sys=True)
        elif target.code is not None:
            sys.argv = ["-c", *target.args]
            sys.path.insert(0, "")
            _run_code(target.code)
        else:
            assert target.script is not None
            sys.argv = [target.script, *target.args]
            if not Path(target.script).is_dir():  # (run_path puts a folder first itself)
                sys.path.insert(0, str(Path(target.script).resolve().parent))
            # as python does: the script's code (its __file__, its tracebacks) names it absolutely
            runpy.run_path(os.path.abspath(target.script), run_name="__main__")
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
        signals.caught = signals.caught or "KeyboardInterrupt"
        return _SIGNAL_EXIT[signals.caught], None
    except _Terminated:
        signals.caught = signals.caught or "SIGTERM"
        return _SIGNAL_EXIT["SIGTERM"], None
    except BaseException as exc:
        stop = _find_divergence(exc)
        if stop is not None:
            return EXIT_STOPPED, stop
        _user_traceback(exc)
        signals.crashed = _where_it_crashed(exc)
        signals.crash = _crash_event(exc)
        return 1, None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _ranked(
    monitors: list[Monitor], stop: DivergenceError | None
) -> list[tuple[Diagnosis, Monitor | None]]:
    """Every run's diagnosis, the one to report first: the one that stopped the run, then the
    worst verdict (the first made among equals)."""
    stopped = stop.diagnosis if stop is not None else None
    ranked: list[tuple[Diagnosis, Monitor | None]] = [
        (monitor.close(), monitor) for monitor in monitors
        if stopped is None or monitor.diagnosis is not stopped
    ]  # fmt: skip
    ranked.sort(key=lambda pair: rank_of(pair[0].verdict))
    if stopped is not None:
        owner = next((m for m in monitors if m.diagnosis is stopped), None)
        ranked.insert(0, (stopped, owner))
    return ranked


def _runs_summary(
    diagnoses: list[Diagnosis], monitors: list[Monitor | None]
) -> list[dict[str, Any]]:
    """One entry per run of the script (the ``runs`` field of ``--json``), in the order given:
    its verdict, cause and update, what it watched, and where its own diagnosis is."""
    out = []
    for diagnosis, monitor in zip(diagnoses, monitors):
        meta = monitor.meta if monitor is not None else {}
        folder = diagnosis.run.get("dir") or (str(monitor.run_dir) if monitor else None)
        written = monitor is not None and monitor.writes
        out.append({
            "id": diagnosis.run.get("id") or (monitor.run_id if monitor else None),
            "name": monitor.name if monitor is not None else None,
            "model": meta.get("model"),
            "optimizer": meta.get("optimizer"),
            "lr": meta.get("optimizer_lr"),
            "verdict": diagnosis.verdict,
            "cause": diagnosis.cause,
            "confidence": round(float(diagnosis.confidence), 3),
            "step": diagnosis.step,
            "headline": diagnosis.headline(),
            "dir": folder,
            "diagnosis": str(Path(folder) / "diagnosis.json") if written and folder else None,
        })  # fmt: skip
    return out


def _arm_torch() -> None:
    try:
        from nanscope.torch import autowatch
    except ImportError:
        return
    try:
        autowatch.arm()
    except Exception as exc:  # watching must never stop the script from running
        warn(f"could not arm the PyTorch hooks ({exc}); the script runs unwatched by them")


def _arm_numpy() -> None:
    """numpy's floating-point errors are recorded from the script's first line: a log of a zero
    count in the data preparation is the producer of the -inf a later batch holds."""
    from nanscope.probes import fperrors

    fperrors.arm()


def _disarm_torch() -> None:
    autowatch = sys.modules.get("nanscope.torch.autowatch")
    if autowatch is None:
        return
    try:
        autowatch.disarm()
    except Exception as exc:
        warn(f"could not remove the PyTorch hooks ({exc})")


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
    key = target.path or target.module
    if not key:
        return
    try:
        from nanscope.ledger import remembered_line
    except ImportError:
        return
    try:
        line = remembered_line(key)
    except Exception:
        return
    if line:
        # before the script's own output, so labelled as the ledger's (not this run's result)
        progress(f"nanscope: the ledger's {line}")


def _record(diagnosis: Diagnosis, monitor: Monitor | None, target: Target, started: float) -> None:
    try:
        from nanscope.ledger import record_diagnosis
    except ImportError:
        return
    try:
        rollbacks = len(monitor.rollbacks) if monitor is not None else 0
        extra: dict[str, Any] = {"module": target.module} if target.module else {}
        record_diagnosis(
            diagnosis,
            monitor,
            script=target.path,
            duration=time.time() - started,
            rollbacks=rollbacks,
            **extra,
        )
    except Exception as exc:
        warn(f"ledger not updated ({exc})")


def _enrich(diagnosis: Diagnosis, args: argparse.Namespace, target: Target) -> None:
    """Add what later stages know: the sweep, the data scan, the lint near the located line."""
    if args.experiment and diagnosis.cause in EXPERIMENT_CAUSES:
        try:
            from nanscope.experiment import advise, run_experiment

            progress("nanscope: running the tenfold learning-rate cut...")
            diagnosis.extra["experiment"] = run_experiment(diagnosis, target.argv)
            advise(diagnosis)
        except Exception as exc:
            warn(f"the experiment could not run ({exc})")
    if args.data and diagnosis.cause in ("nonfinite_input", "extreme_batch", "step_size_too_large"):
        try:
            diagnosis.extra["scan"] = link_scan(args.data, diagnosis)
        except Exception as exc:
            warn(f"the data scan could not run ({exc})")
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


def _unobserved(
    reason: str, *, program: bool = False, crashed: bool = False, refused: bool = False
) -> Diagnosis:
    """The diagnosis of a run nanscope could not watch, as the engine gives it."""
    from nanscope.diagnose.engine import unwatched

    return unwatched(reason, program=program, crashed=crashed, refused=refused)


def _crashed_unwatched(crash: dict[str, Any]) -> Diagnosis | None:
    """The diagnosis of a script that raised before nanscope watched any update: ``crashed``."""
    from nanscope.trace import Trace

    try:
        from nanscope.diagnose import diagnose

        trace = Trace()
        trace.meta["events"] = [{"event": "crashed", **crash, "step": None}]
        diagnosis = diagnose(trace)
    except Exception:
        return None
    return diagnosis if diagnosis.verdict == Verdict.CRASHED else None


def _nothing_to_diagnose(target: Target, signals: _Signals, args: argparse.Namespace) -> None:
    """No Monitor saw the script: say why, and still write the ``--json``/``--html`` promised."""
    if target.program is not None:
        reason = (f"{target.name} is not a Python program; it ran unwatched (nanscope "
                  "watches Python: nanscope run -- python train.py)")  # fmt: skip
    else:
        reason = f"{target.name} created no Monitor and no watched optimizer stepped"
        backwards = _backwards_without_step()
        if backwards:
            reason = (f"{target.name} called backward() {backwards} times but no optimizer "
                      "ever stepped and no weight was updated by hand: its weights never "
                      "changed (is opt.step() behind a condition that is never true, like an "
                      "accumulation counter that restarts every epoch?)")  # fmt: skip
        if signals.crashed:
            reason = f"{target.name} stopped with {signals.crashed} before any update"
    progress(f"nanscope: {reason}; nothing to diagnose")
    if args.json or args.html:
        diagnosis = _unobserved(reason, program=target.program is not None,
                                crashed=bool(signals.crashed))  # fmt: skip
        if signals.caught:
            diagnosis.extra["interrupted"] = {"signal": signals.caught, "step": None}
        write_json(diagnosis, args.json)
        write_html(diagnosis, None, args.html)


def _backwards_without_step() -> int:
    autowatch = sys.modules.get("nanscope.torch.autowatch")
    try:
        return int(autowatch.backwards_without_step()) if autowatch is not None else 0
    except Exception:
        return 0


def _last_step(monitor: Monitor) -> int | None:
    records = monitor.trace.records
    if not records:
        return None
    step = records[-1].get("step")
    return int(step) if isinstance(step, (int, float)) else len(records)


def split_options(argv: list[str], valued: frozenset[str]) -> tuple[list[str], list[str]]:
    """``nanscope run``'s own options and the command it runs: what comes after ``--``, else
    from the first word that is neither an option nor the value of one of ``valued``."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    options, command = [], list(argv)
    # allow `nanscope run --policy warn train.py`: options first, then the script
    while command and command[0].startswith("-"):
        takes_value = command[0] in valued
        options.extend(command[: 2 if takes_value else 1])
        command = command[2 if takes_value else 1 :]
    return options, command


def parser() -> CommandParser:
    """``nanscope run``'s options (the script's own come after them)."""
    p = CommandParser(
        prog="nanscope run",
        description="Run a training script under watch: nanscope run [options] -- python train.py",
    )
    add_output_options(p, json_help="write the diagnosis as JSON ('-' = stdout, which then "
                       "carries the JSON alone: the script's own stdout goes to stderr)")
    p.add_argument("--policy", choices=POLICIES, default=None,
                   help="what to do when the fit breaks (default: raise)")  # fmt: skip
    p.add_argument("--experiment", action="store_true",
                   help="on a step-size/sign/gradient cause, run the lr sweep")  # fmt: skip
    p.add_argument("--data", metavar="PATH", help="the data file, to link scan findings")
    p.add_argument("--run-dir", metavar="DIR", help="root folder for run directories")
    return p


def main(argv: list[str]) -> int:
    options_parser = parser()
    options, command = split_options(argv, options_parser.valued_options())
    args = options_parser.parse_args(options)
    try:
        check_folder(args.run_dir, "--run-dir")
        if args.data and not Path(args.data).exists():
            raise UsageError(f"--data {clean(args.data)}: no such file or directory")
        elsewhere = other_python(command)
        if elsewhere is not None:  # the interpreter the command names runs it, watched there
            return run_in(elsewhere, options, command)
        target = split_command(command)
    except UsageError as exc:
        if args.json:  # the --json file is promised whatever happens: it says why nothing ran
            write_json(_unobserved(f"nothing ran: {exc}", refused=True), args.json)
        raise
    set_defaults(policy=args.policy, root=args.run_dir, keep=True)
    if args.policy:
        os.environ["NANSCOPE_POLICY"] = args.policy
    ranks = _distributed() if target.program is None else None
    rank = int(os.environ.get("RANK", "0") or 0) if ranks else 0
    if rank:
        # one report per job: rank 0 writes the merged one, the others keep theirs beside it
        args.json = None if args.json == "-" else (args.json and f"{args.json}.rank{rank}")
        args.html = args.html and f"{args.html}.rank{rank}"
    if ranks and args.experiment:
        progress("nanscope: --experiment is skipped under torchrun (the sweep reruns "
                 "single-process)")  # fmt: skip
        args.experiment = False
    if rank == 0:
        _remembered(target)
    if target.program is None:
        _arm_torch()
        _arm_numpy()
    if ranks:
        ranks.arm()
    started = time.time()
    before = set(id(m) for m in active_monitors())
    with _Signals() as signals, _stdout_to_stderr(args.json == "-"):
        code, stop = _execute(target, signals)
    monitors = [m for m in active_monitors() if id(m) not in before]
    if signals.caught and stop is None:
        for monitor in monitors:
            monitor.record_event("interrupted", signal=signals.caught, step=_last_step(monitor))
    if signals.crash is not None:
        for monitor in monitors:
            monitor.record_event("crashed", **signals.crash, step=_last_step(monitor))
    ranked = _ranked(monitors, stop)
    diagnosis, owner = ranked[0] if ranked else (None, None)
    if target.program is None:
        _disarm_torch()  # (run in process, as tests and notebooks do: the hooks go with it)
    if ranks and diagnosis is not None:
        diagnosis = ranks.finish(diagnosis, code=code)
    if diagnosis is not None and owner is not None and not owner.trace.records and stop is None:
        from nanscope.diagnose.engine import saw_no_update

        diagnosis = saw_no_update(
            diagnosis, f"{target.name} created a Monitor but it saw no update; nothing was watched"
        )
    if diagnosis is None and signals.crash is not None:
        diagnosis = _crashed_unwatched(signals.crash)
    if diagnosis is None:
        _nothing_to_diagnose(target, signals, args)
        return code
    from nanscope.diagnose.engine import note_crash, note_interruption

    if signals.caught and stop is None:
        note_interruption(diagnosis, signals.caught, _last_step(owner) if owner else None)
    if signals.crash is not None and diagnosis.verdict != Verdict.CRASHED:
        note_crash(diagnosis, signals.crash, _last_step(owner) if owner else None)
    trace = owner.trace if owner is not None else None
    _enrich(diagnosis, args, target)
    if len(ranked) > 1:  # several optimizers or Monitors: every run is named, the worst first
        diagnoses = [diagnosis] + [d for d, _ in ranked[1:]]
        diagnosis.extra["runs"] = _runs_summary(diagnoses, [owner] + [m for _, m in ranked[1:]])
    if owner is not None:
        owner.save_diagnosis(diagnosis)
    write_json(diagnosis, args.json)  # first: the file is there whatever happens next
    if args.json != "-" or diagnosis.verdict != Verdict.HEALTHY:
        show(diagnosis, trace, no_color=args.no_color, to_stderr=args.json == "-")
    write_html(diagnosis, trace, args.html)
    if rank == 0:
        _record(diagnosis, owner, target, started)
    if stop is not None:
        _end_process_group()
        return EXIT_STOPPED
    return code


def _end_process_group() -> None:
    """A rank nanscope stopped never reached the script's own ``destroy_process_group()``: end it
    here, or the process group's teardown at exit can abort the process (SIGABRT) once the
    other ranks are gone, and the job reports that instead of the stop's exit code."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    with contextlib.suppress(Exception):
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
