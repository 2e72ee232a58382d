"""The ``nanscope`` command line: one small dispatcher, each command in its own module.

Every command is a ``main(argv: list[str]) -> int`` function, imported only when it is used so that
``nanscope lint`` never pays for torch. Exit codes are the same for every command:

0 nothing wrong, 1 findings or a diagnosed failure, 2 usage or input error, 3 ``run`` stopped a
training run with a diagnosis. A script's own failure under ``run`` passes its exit code through.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType

from nanscope._extras import install_hint, missing
from nanscope._messages import (
    clean,
    hold_warnings,
    install_warning_format,
    release_warnings,
    set_quiet,
)
from nanscope.errors import InputError, UsageError

__all__ = ["COMMANDS", "error_line", "main"]

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_STOPPED = 3

#: command name -> one-line help; each is ``main`` of ``nanscope.commands.<name>``, imported lazily
COMMANDS: dict[str, str] = {
    "run": "run a training script under watch: -- python train.py",
    "diagnose": "diagnose a trace or a log after the fact",
    "sweep": "rerun the first updates at lr x 1, 0.1, 0.01",
    "scan": "scan a data file for NaN, inf, outliers, unscaled columns",
    "lint": "lint training code for numerical hazards",
    "report": "write an HTML report for a run, trace or log",
    "history": "list past runs and the learning rates that worked",
    "runs": "list the run folders, or prune them (--keep N)",
    "demo": "watch a fit diverge, be diagnosed, and be fixed",
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: nanscope COMMAND [ARGS]", "       nanscope --version", "", "commands:"]
    for name, text in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {text}")
    lines.append("")
    lines.append("options:")
    lines.append("  -h, --help     show this help")
    lines.append("  -V, --version  print the version")
    lines.append("")
    lines.append("Run 'nanscope COMMAND --help' for a command's options. Results go to stdout,")
    lines.append("progress and warnings to stderr. Exit codes: 0 nothing wrong, 1 findings or a")
    lines.append("diagnosed failure, 2 usage or input error, 3 'run' stopped a training run.")
    lines.append("NANSCOPE_DEBUG=1 shows the traceback behind an error line.")
    return "\n".join(lines)


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"nanscope.commands.{name}")


def _load(name: str) -> Callable[[list[str]], int]:
    func: Callable[[list[str]], int] = _module(name).main
    return func


#: commands that finish quickly: their warnings are held, so an error is still one line
_QUICK = ("diagnose", "scan", "lint", "report", "history", "runs")

#: options whose value is a file the command writes; checked before any work starts
_OUTPUTS = ("--json", "--html", "-o", "--output")
#: options whose value is a folder the command writes into
_FOLDERS = ("--run-dir", "--png")


def _precheck(name: str, rest: list[str]) -> None:
    """Checks every command shares, done before it starts: the output paths and the policy."""
    from nanscope.commands.base import check_folder, check_writable, parse_values

    options = rest
    if name in ("run", "sweep") and "--" not in rest:
        # `nanscope run [options] train.py --json x`: the script's own arguments are not ours
        valued = _module(name).parser().valued_options()
        cut = next((i for i, t in enumerate(rest) if not t.startswith("-")
                    and (i == 0 or rest[i - 1] not in valued)), len(rest))  # fmt: skip
        options = rest[:cut]
    for option, value in parse_values(options, _OUTPUTS).items():
        check_writable(value, option)
    for option, value in parse_values(options, _FOLDERS).items():
        check_folder(value, option)
    policy = os.environ.get("NANSCOPE_POLICY")
    if policy and name in ("run", "sweep", "demo"):
        from nanscope.monitor import POLICIES

        if policy not in POLICIES:
            raise UsageError(
                f"NANSCOPE_POLICY={policy!r} is not a policy; use one of {', '.join(POLICIES)} "
                "(or unset it)"
            )


def _debug() -> bool:
    return os.environ.get("NANSCOPE_DEBUG", "").strip() not in ("", "0", "false", "no")


def error_line(name: str, exc: BaseException) -> str:
    """The one line an error of command ``name`` is: ``nanscope NAME: error: what and where``."""
    prefix = f"nanscope {name}: error: " if name else "nanscope: error: "
    lacking = missing(exc, f"nanscope {name}")
    if lacking is not None:
        return prefix + f"needs {lacking.name}, which is not installed here: " + install_hint(
            lacking.name or ""
        )
    if isinstance(exc, (UsageError, InputError)):
        return prefix + clean(exc, limit=500)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or str(exc) or type(exc).__name__
        return prefix + clean(f"{where}{what}", limit=500)
    if isinstance(exc, MemoryError):
        return prefix + "out of memory; the input is too large for this command"
    text = clean(f"{type(exc).__name__}: {exc}", limit=300)
    return (
        f"{prefix}internal error ({text}); please report it, "
        "with NANSCOPE_DEBUG=1 for the traceback"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)

    install_warning_format()
    set_quiet(False)  # until the command's own parser reads -q
    if not args or args[0] in ("-h", "--help", "help"):
        # asked for: the help is the result (stdout, 0); no command at all is a usage error
        print(_usage(), file=sys.stdout if args else sys.stderr)
        return EXIT_OK if args else EXIT_USAGE
    if args[0] in ("-V", "--version"):
        from nanscope import __version__

        print(f"nanscope {__version__}")
        return EXIT_OK
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        known = ", ".join(COMMANDS)
        print(f"nanscope: unknown command '{clean(name, 60)}' (known: {known})", file=sys.stderr)
        return EXIT_USAGE
    try:
        if not any(a in ("-h", "--help") for a in rest):
            _precheck(name, rest)
        command = _load(name)
        if name in _QUICK:
            hold_warnings()
        result = int(command(rest) or 0)
        release_warnings()
        return result
    except SystemExit as exc:  # --help inside a command, or a command that exits by itself
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(f"nanscope {name}: {clean(exc.code)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"nanscope {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:
        held = release_warnings(show=_debug())
        if _debug():
            traceback.print_exc()
        line = error_line(name, exc)
        if held:
            # what went wrong on the way there is the reason: still one line
            line += f" ({clean(held[0], 200)}" + (f"; {len(held) - 1} more warnings)"
                                                  if len(held) > 1 else ")")  # fmt: skip
        print(line, file=sys.stderr)
        return EXIT_USAGE
    finally:
        release_warnings()


def entry() -> None:
    """Console-script entry point: ``nanscope --help | head -1`` ends quietly."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (head, less): stop writing, say nothing, exit as a shell would
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        code = 141
    sys.exit(code)


if __name__ == "__main__":
    entry()
