"""``nanscope history [SCRIPT] [--limit N] [--json PATH] [--ledger PATH]``: past runs.

Exit codes: 0 (also when there is no history yet), 2 a bad argument or a ledger that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nanscope._console import columns, rich_text, table
from nanscope.commands.base import CommandParser, clean, write_output
from nanscope.errors import UsageError

__all__ = ["main", "render"]

_HEADERS = (
    "started", "script", "outcome", "update", "optimizer", "lr", "best loss", "lr that worked",
)  # fmt: skip
_NUMERIC = ("update", "lr", "best loss", "lr that worked")


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
            shown[path] = name if len(group) == 1 else _short(path, group)
    return shown


def _short(path: str, group: set[str]) -> str:
    """The path relative to the current folder when inside it, else its fewest last parts that
    no other path of ``group`` ends with (``a/train.py`` beside ``b/train.py``)."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        pass
    parts = Path(path).parts
    others = [Path(p).parts for p in group if p != path]
    for k in range(2, len(parts) + 1):
        if all(o[-k:] != parts[-k:] for o in others):
            return str(Path(*parts[-k:]))
    return path


def _cells(run: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    from nanscope.ledger import local_time

    outcome = str(run.get("outcome") or "?")
    script = str(run.get("script") or "?")
    if run.get("module"):
        shown = f"-m {run['module']}"
    else:
        shown = (names or {}).get(script) or Path(script).name
    return [
        local_time(run.get("started")),
        clean(shown, 80),
        outcome,
        "" if run.get("failed_at") is None else str(run["failed_at"]),
        str(run.get("optimizer") or ""),
        _num(run.get("lr")),
        _num(run.get("best_loss")),
        _num(run.get("sweep_lr")),
    ]


def render(runs: list[dict[str, Any]], *, rich: bool, width: int | None = None) -> str:
    """The runs as a table at ``width`` columns (``None``: no limit), in colour when ``rich``.

    A column no run fills is left out; on a narrow terminal the headers and the dates wrap at
    their spaces, and a value (a cause, a number, a script's name) is never split."""
    names = _script_names(runs)
    rows = [_cells(r, names) for r in runs]
    keep = [j for j in range(len(_HEADERS)) if any(row[j] for row in rows)]
    headers = [_HEADERS[j] for j in keep]
    right = {i for i, j in enumerate(keep) if _HEADERS[j] in _NUMERIC}
    lines = table(headers, [[row[j] for j in keep] for row in rows], width, right=right)
    if not rich:
        return "".join(line + "\n" for line, _ in lines)
    from rich.text import Text

    texts = [Text("nanscope history", style="bold")]
    for line, index in lines:
        healthy = index >= 0 and runs[index].get("outcome") == "healthy"
        texts.append(Text(line, style="bold" if index < 0 else ("green" if healthy else "")))
    return rich_text(*texts, width=None, color=True)


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
        write_output(text + "\n", args.json)
        if args.json == "-":
            return 0
    if not runs:
        which = f" of {args.script}" if args.script else ""
        print(f"no runs{which} in the ledger ({path})")
        return 0
    sys.stdout.write(render(runs, rich=sys.stdout.isatty(), width=columns(sys.stdout)))
    return 0
