"""``nanscope diagnose FILE``: diagnose a trace or a log someone already has.

Exit 0 when the run looks healthy, 1 when a failure (or a suspect run) is diagnosed, 2 when the
file cannot be read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nanscope.commands.base import CommandParser
from nanscope.commands.common import add_output_options, show, write_html, write_json
from nanscope.diagnose import diagnose
from nanscope.errors import TraceError
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
        description="Diagnose a nanscope trace, a run directory, or a training log.",
    )
    parser.add_argument("file", help="trace.jsonl, a run directory, or a log (text, CSV, ...)")
    add_output_options(parser)
    args = parser.parse_args(argv)
    path = Path(args.file)
    if not path.exists():
        raise TraceError(f"{args.file}: no such file or directory")
    trace = load(args.file)
    evidence = _probe_evidence(path) if trace.meta.get("schema") else {}
    diagnosis = diagnose(trace, evidence=evidence)
    if args.json != "-":
        show(diagnosis, trace, no_color=args.no_color)
    write_json(diagnosis, args.json)
    write_html(diagnosis, trace, args.html)
    return 0 if diagnosis.verdict == "healthy" else 1
