"""``nanscope diagnose FILE...``: diagnose traces or logs someone already has.

Exit 0 when every run looks healthy, 1 when a failure (or a suspect run) is diagnosed, 2 when a
file cannot be read (with several files, the others are still diagnosed). ``--json`` writes the
diagnosis, or with several files a list of them, each with its ``file``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from nanscope.cli import error_line
from nanscope.commands.base import CommandParser, clean, say
from nanscope.commands.output import (
    add_output_options,
    show,
    write_html,
    write_json,
    write_json_list,
)
from nanscope.diagnose import Diagnosis, diagnose
from nanscope.errors import NanscopeError, TraceError, UsageError
from nanscope.trace import Trace

__all__ = ["load", "main"]


def load(path: str) -> Trace:
    """A trace from a nanscope run (file or run directory) or from any log format we read."""
    from nanscope.loading import load as load_any

    return load_any(path)  # bounded: a very long log is thinned away from the first NaN


def _probe_evidence(path: Path) -> dict[str, Any]:
    """Located op and rows from a run's own diagnosis.json, which a bare trace lacks."""
    folder = path if path.is_dir() else path.parent
    saved = folder / "diagnosis.json"
    if not saved.is_file():
        return {}
    try:
        data = json.loads(saved.read_text())
    except (OSError, ValueError):
        return {}
    evidence: dict[str, Any] = {}
    if isinstance(data.get("located"), dict):
        evidence["located"] = data["located"]
    if isinstance(data.get("rows"), list):
        evidence["rows"] = data["rows"]
    if isinstance(data.get("run"), dict):
        evidence["run"] = data["run"]
    return evidence


def main(argv: list[str]) -> int:
    parser = CommandParser(
        prog="nanscope diagnose",
        description="Diagnose nanscope traces, run directories, or training logs. With several "
        "files, each gets its report (its name above it) and --json writes a list.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="trace.jsonl, a run directory, or a log (text, CSV, ...)")  # fmt: skip
    add_output_options(parser)
    args = parser.parse_args(argv)
    if len(args.files) > 1 and args.html:
        raise UsageError("--html writes one page: give one file (or `nanscope report` for each)")
    if len(args.files) == 1:
        diagnosis, trace = _diagnose(args.files[0])
        if args.json != "-":
            show(diagnosis, trace, no_color=args.no_color)
        write_json(diagnosis, args.json)
        write_html(diagnosis, trace, args.html)
        return _code(diagnosis)
    # several: each report under its name; one that cannot be read is one error line, the
    # others still run, and the exit code is the worst (2 for an unreadable file)
    results: list[dict[str, Any]] = []
    codes = []
    for i, name in enumerate(args.files):
        try:
            diagnosis, trace = _diagnose(name)
        except (NanscopeError, OSError) as exc:
            line = error_line("diagnose", exc)
            print(line, file=sys.stderr)
            codes.append(2)
            results.append({"file": name, "error": line.split(": error: ", 1)[-1]})
            continue
        codes.append(_code(diagnosis))
        results.append({"file": name, **diagnosis.to_dict()})
        if args.json != "-":
            say(("" if i == 0 else "\n") + f"== {clean(name)}")
            show(diagnosis, trace, no_color=args.no_color)
    if args.json:
        write_json_list(results, args.json)
    return 2 if 2 in codes else max(codes)


def _diagnose(name: str) -> tuple[Diagnosis, Trace]:
    path = Path(name)
    if not path.exists():
        raise TraceError(f"{name}: no such file or directory")
    trace = load(name)
    evidence = _probe_evidence(path) if trace.meta.get("schema") else {}
    return diagnose(trace, evidence=evidence), trace


def _code(diagnosis: Diagnosis) -> int:
    return 0 if diagnosis.ok else 1
