"""``nanscope report RUN_DIR|TRACE|LOG [-o report.html] [--png DIR]``: write the HTML report.

A run directory (what :class:`nanscope.Monitor` writes) gives its ``trace.jsonl`` and its
``diagnosis.json`` (the trace is diagnosed when there is none). Any other path -- a nanscope
trace, a log in a format :mod:`nanscope.logs` reads, a TensorBoard or Trainer folder, or a
``diagnosis.json`` that names its trace -- is read and diagnosed. The page goes to
``RUN_DIR/report.html`` for a run directory and to ``./report.html`` otherwise, unless ``-o`` says
where.

Exit codes: 0 written (the path is printed), 2 bad arguments or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nanscope.commands.base import CommandParser
from nanscope.diagnose.diagnosis import SCHEMA, Diagnosis
from nanscope.errors import InputError, UsageError
from nanscope.trace import Trace

__all__ = ["load_inputs", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nanscope report",
        description="Write one self-contained HTML report (verdict, evidence, actions, per-update "
        "plots) for a run directory, a trace or a training log.",
    )
    parser.add_argument("path", help="a run directory, a nanscope trace, or a training log")
    parser.add_argument(
        "-o",
        "--output",
        help="where to write the page (default: RUN_DIR/report.html, else ./report.html)",
    )
    parser.add_argument("--png", metavar="DIR", help="also write each plot as DIR/<plot>.png")
    parser.add_argument("--title", help="the page title")
    parser.add_argument(
        "--no-plots", action="store_true", help="leave the plots out (a quick page, no matplotlib)"
    )
    return parser


def _read_diagnosis(path: Path) -> Diagnosis | None:
    """The diagnosis stored in a run directory, or None when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        print(
            f"nanscope report: {path} is unreadable ({exc}); diagnosing the trace instead",
            file=sys.stderr,
        )
        return None
    if not isinstance(data, dict) or "verdict" not in data:
        print(
            f"nanscope report: {path} holds no diagnosis; diagnosing the trace instead",
            file=sys.stderr,
        )
        return None
    try:
        return Diagnosis.from_dict(data)
    except (TypeError, ValueError):
        return None


def _load(path: Path) -> Trace:
    """Any trace or log, through the one loader every command uses."""
    from nanscope.loading import load

    return load(path)


def _diagnose(trace: Trace, path: Path | None = None) -> Diagnosis:
    from nanscope.diagnose import diagnose
    from nanscope.loading import run_evidence

    evidence = run_evidence(path) if path is not None and trace.meta.get("schema") else {}
    return diagnose(trace, evidence)


def _as_diagnosis_file(path: Path) -> dict[str, Any] | None:
    if path.suffix != ".json" or path.stat().st_size > 32 * 1024 * 1024:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(data, dict) and data.get("schema") == SCHEMA:
        return data
    return None


def load_inputs(target: str | Path) -> tuple[Trace | None, Diagnosis, Path]:
    """``(trace, diagnosis, default output path)`` for what the user pointed at."""
    path = Path(target)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir() and (path / "trace.jsonl").is_file():
        run_trace = _load(path / "trace.jsonl")
        stored = None
        if (path / "diagnosis.json").is_file():
            stored = _read_diagnosis(path / "diagnosis.json")
        return run_trace, stored or _diagnose(run_trace, path), path / "report.html"
    if path.is_file():
        data = _as_diagnosis_file(path)
        if data is not None:
            diagnosis = Diagnosis.from_dict(data)
            trace_path = (data.get("run") or {}).get("trace")
            sibling = path.parent / "trace.jsonl"
            trace: Trace | None = None
            if trace_path and Path(trace_path).is_file():
                trace = _load(Path(trace_path))
            elif sibling.is_file():
                trace = _load(sibling)
            return trace, diagnosis, path.parent / "report.html"
    loaded = _load(path)
    return loaded, _diagnose(loaded, path), Path("report.html")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    trace, diagnosis, default_out = load_inputs(args.path)
    out = Path(args.output) if args.output else default_out
    if out.is_dir():
        out = out / "report.html"
    from nanscope.report import html as report_html
    from nanscope.report import plots

    if args.png and not plots.have_matplotlib():
        raise UsageError("--png needs matplotlib: pip install 'nanscope[plots]'")
    if args.png and trace is None:
        raise InputError(f"{args.path}: no trace to plot (the diagnosis names no readable trace)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            report_html.render_report(trace, diagnosis, title=args.title, plots=not args.no_plots),
            encoding="utf-8",
        )
        written = []
        if args.png and trace is not None:
            written = plots.write_pngs(plots.build_panels(trace, diagnosis), args.png)
    except OSError as exc:
        raise UsageError(f"cannot write the report: {exc}") from None
    print(out)
    for png in written:
        print(png)
    return 0
