"""How a diagnosis leaves a command: its JSON (one or a list), its HTML page, its report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nanscope.commands.base import warn, write_output
from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.trace import Trace

__all__ = ["add_output_options", "show", "write_html", "write_json", "write_json_list"]


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
    write_output(diagnosis.to_json() + "\n", path)


def write_json_list(items: list[dict[str, Any]], path: str) -> None:
    """Several diagnoses (``nanscope diagnose a.log b.log --json PATH``) as one JSON list."""
    import json

    write_output(json.dumps(items, indent=2, allow_nan=False) + "\n", path)


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
