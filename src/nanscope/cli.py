"""The ``nanscope`` command line: one small dispatcher, each command in its own module.

Every command is a ``main(argv: list[str]) -> int`` function, imported only when it is used so that
``nanscope lint`` never pays for torch. Exit codes are the same for every command:

0 nothing wrong, 1 findings or a diagnosed failure, 2 usage or input error, 3 ``run`` stopped a
training run with a diagnosis. A script's own failure under ``run`` passes its exit code through.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from nanscope.errors import InputError, UsageError

__all__ = ["COMMANDS", "main"]

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_STOPPED = 3

#: command name -> ("module:function", one-line help). Modules are imported lazily.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("nanscope.commands.run:main", "run a training script under watch: -- python train.py"),
    "diagnose": ("nanscope.commands.diagnose:main", "diagnose a trace or a log after the fact"),
    "sweep": ("nanscope.experiment.cli:main", "rerun the first updates at lr x 1, 0.1, 0.01"),
    "scan": ("nanscope.data.cli:main", "scan a data file for NaN, inf, outliers, unscaled columns"),
    "lint": ("nanscope.lint.cli:main", "lint training code for numerical hazards"),
    "report": ("nanscope.report.cli:main", "write an HTML report for a run, trace or log"),
    "history": ("nanscope.ledger_cli:main", "list past runs and the learning rates that worked"),
    "demo": ("nanscope.commands.demo:main", "watch a fit diverge, be diagnosed, and be fixed"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: nanscope COMMAND [ARGS]", "", "commands:"]
    for name, (_, text) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {text}")
    lines.append("")
    lines.append("Run 'nanscope COMMAND --help' for a command's options.")
    return "\n".join(lines)


def _load(target: str) -> Callable[[list[str]], int]:
    module_name, _, func_name = target.partition(":")
    module = importlib.import_module(module_name)
    func: Callable[[list[str]], int] = getattr(module, func_name)
    return func


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return EXIT_OK if args else EXIT_USAGE
    if args[0] in ("-V", "--version"):
        from nanscope import __version__

        print(f"nanscope {__version__}")
        return EXIT_OK
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        known = ", ".join(COMMANDS)
        print(f"nanscope: unknown command '{name}' (known: {known})", file=sys.stderr)
        return EXIT_USAGE
    try:
        command = _load(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        print(
            f"nanscope: '{name}' needs a package that is not installed ({exc.name}); "
            f"install nanscope with its extras, e.g. pip install 'nanscope[all]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        return int(command(rest) or 0)
    except (UsageError, InputError) as exc:
        print(f"nanscope {name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"nanscope {name}: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
