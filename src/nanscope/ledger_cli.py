"""``nanscope history [SCRIPT] [--limit N] [--json PATH] [--ledger PATH]``: past runs.

Exit codes: 0 (also when there is no history yet), 2 a bad argument or a ledger that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nanscope.commands.base import CommandParser, clean
from nanscope.errors import UsageError

__all__ = ["main", "render"]

_HEADERS = (
    "started", "script", "outcome", "update", "optimizer", "lr", "best loss", "lr that worked",
)  # fmt: skip



def _parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="nanscope history",
        description="List the runs in the ledger, newest first: the outcome of each, the update "
        "it failed at, and the learning rate a sweep found to work.",
    )
    p.add_argument("script", nargs="?", help="only the runs of this script (path or same content)")
    p.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    p.add_argument("--json", metavar="PATH", help="write the runs as JSON ('-' for stdout)")
    p.add_argument("--ledger", metavar="PATH", help="the ledger file (default: $NANSCOPE_LEDGER)")
    return p


def _num(value: Any) -> str:
    return "" if value is None else f"{value:.4g}"


def _script_names(runs: list[dict[str, Any]]) -> dict[str, str]:
    """How each script is shown: its file name, or more of its path where two different files
    share a name (two ``train.py`` are two scripts); ``-m NAME`` for a module run."""
    paths = {str(r.get("script")) for r in runs if r.get("script") and not r.get("module")}
    by_name: dict[str, set[str]] = {}
    for path in paths:
        by_name.setdefault(Path(path).name, set()).add(path)
    shown: dict[str, str] = {}
    for name, group in by_name.items():
        for path in group:
            shown[path] = name if len(group) == 1 else _short(path)
    return shown


def _short(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _cells(run: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    from nanscope.ledger import _when

    outcome = str(run.get("outcome") or "?")
    script = str(run.get("script") or "?")
    if run.get("module"):
        shown = f"-m {run['module']}"
    else:
        shown = (names or {}).get(script) or Path(script).name
    return [
        _when(run.get("started")),
        clean(shown, 80),
        outcome,
        "" if run.get("failed_at") is None else str(run["failed_at"]),
        str(run.get("optimizer") or ""),
        _num(run.get("lr")),
        _num(run.get("best_loss")),
        _num(run.get("sweep_lr")),
    ]


def render(runs: list[dict[str, Any]], *, rich: bool) -> str:
    """The runs as a rich table (``rich``) or as aligned plain text."""
    names = _script_names(runs)
    rows = [_cells(r, names) for r in runs]
    if rich:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="nanscope history", title_justify="left")
        for name in _HEADERS:
            table.add_column(name)
        for run, cells in zip(runs, rows):
            style = "green" if run.get("outcome") == "healthy" else None
            table.add_row(*cells, style=style)
        console = Console(record=True, width=120, force_terminal=True)
        with console.capture() as capture:
            console.print(table)
        return capture.get()
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(_HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(_HEADERS, widths)).rstrip()]
    for cells in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.limit < 1:
        raise UsageError(f"--limit must be at least 1; got {args.limit}")
    from nanscope.ledger import Ledger, default_path

    path = Path(args.ledger) if args.ledger else default_path()
    if not path.exists():
        runs: list[dict[str, Any]] = []
    else:
        with Ledger(path, strict=True) as ledger:
            runs = ledger.runs(args.script, limit=args.limit)
    if args.json:
        text = json.dumps({"ledger": str(path), "runs": runs}, indent=2, default=str)
        if args.json == "-":
            sys.stdout.write(text + "\n")
            return 0
        try:
            Path(args.json).write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write --json {args.json}: {exc.strerror}") from exc
    if not runs:
        which = f" of {args.script}" if args.script else ""
        print(f"no runs{which} in the ledger ({path})")
        return 0
    sys.stdout.write(render(runs, rich=sys.stdout.isatty()))
    return 0
