"""Small pieces the commands share: writing the JSON, printing the report, the exit code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nanscope.commands.base import warn
from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.errors import UsageError
from nanscope.trace import Trace

__all__ = ["add_output_options", "show", "write_json"]


def add_output_options(
    parser: argparse.ArgumentParser,
    *,
    json_help: str = "write the diagnosis as JSON ('-' = stdout)",
) -> None:
    parser.add_argument("--json", metavar="PATH", help=json_help)
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML report")
    parser.add_argument("--no-color", action="store_true", help="plain text, no colour")


def write_json(diagnosis: Diagnosis, path: str | None) -> None:
    if not path:
        return
    text = diagnosis.to_json() + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write --json {path}: {exc.strerror}") from None


def write_html(diagnosis: Diagnosis, trace: Trace | None, path: str | None) -> None:
    if not path:
        return
    try:
        from nanscope.report.html import write_report
    except ImportError as exc:
        warn(f"HTML report unavailable ({exc})")
        return
    if trace is None:
        trace = Trace()
    write_report(trace, diagnosis, Path(path))
    print(f"nanscope: report written to {path}", file=sys.stderr)


def show(
    diagnosis: Diagnosis, trace: Trace | None, *, no_color: bool, to_stderr: bool = False
) -> None:
    """The terminal report: a result, so stdout (stderr when stdout carries ``--json -``)."""
    from nanscope.report.terminal import print_report

    stream = sys.stderr if to_stderr else sys.stdout
    color = False if no_color else (None if stream.isatty() else False)
    print_report(diagnosis, trace, file=stream, color=color)
