"""``nanscope runs [list|prune]``: the run folders nanscope wrote, and pruning them.

::

    nanscope runs                          # newest first: when, verdict, cause, size
    nanscope runs prune --keep 20          # remove all but the 20 newest
    nanscope runs prune --older-than 30d   # remove those untouched for 30 days (h, d, w)

The folders are those under ``--run-dir`` (default ``$NANSCOPE_DIR``, else ``./.nanscope/runs``,
where ``nanscope run`` and :class:`nanscope.Monitor` write). Only folders that hold a run's files
(``trace.jsonl``, ``diagnosis.json``, ``last_good.*``) are listed or removed; anything else there
is left alone. A run's age is that of its newest file. The ledger keeps its rows (``nanscope
history``): pruning removes the traces and weights, not what was learned from them.

Exit codes: 0 done (also when there is nothing to list or remove), 2 bad arguments.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanscope._console import columns, shown_path, table
from nanscope.commands.base import CommandParser, clean, progress, say, write_output
from nanscope.errors import UsageError

__all__ = ["RunFolder", "find_runs", "main", "parse_age"]

#: a folder holding one of these is a run's
_MARKERS = ("trace.jsonl", "diagnosis.json", "last_good.pt", "last_good.npz")
_UNITS = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


@dataclass
class RunFolder:
    """One run folder: its path, when it was last written, its size, and its verdict."""

    path: Path
    modified: float
    size: int
    verdict: str = ""
    cause: str = ""
    step: int | None = None


def parse_age(text: str) -> float:
    """``"30d"`` -> seconds; ``m``, ``h``, ``d`` (the default unit) or ``w``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhdw]?)\s*", text)
    if not match:
        raise UsageError(f"--older-than: {text!r} is not an age; e.g. 30d, 12h, 2w")
    return float(match.group(1)) * _UNITS[match.group(2) or "d"]


def find_runs(root: Path) -> list[RunFolder]:
    """The run folders directly under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = []
    for folder in root.iterdir():
        if not folder.is_dir() or folder.is_symlink():
            continue
        if not any((folder / marker).exists() for marker in _MARKERS):
            continue
        files = [f for f in folder.rglob("*") if f.is_file() and not f.is_symlink()]
        stats = [f.stat() for f in files]
        modified = max((s.st_mtime for s in stats), default=folder.stat().st_mtime)
        run = RunFolder(folder, modified, sum(s.st_size for s in stats))
        _read_verdict(run)
        found.append(run)
    found.sort(key=lambda r: (r.modified, r.path.name), reverse=True)
    return found


def _read_verdict(run: RunFolder) -> None:
    try:
        data = json.loads((run.path / "diagnosis.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(data, dict):
        run.verdict = str(data.get("verdict") or "")
        run.cause = str(data.get("cause") or "")
        step = data.get("step")
        run.step = step if isinstance(step, int) else None


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def _parser() -> CommandParser:
    p = CommandParser(
        prog="nanscope runs",
        description="List the run folders (newest first), or prune them: "
        "`nanscope runs prune --keep 20` or `--older-than 30d`.",
    )
    p.add_argument("action", nargs="?", choices=("list", "prune"), default="list",
                   help="list (default) or prune")  # fmt: skip
    p.add_argument("--run-dir", metavar="DIR",
                   help="the folder of run folders (default: $NANSCOPE_DIR, else "
                   "./.nanscope/runs)")  # fmt: skip
    p.add_argument("--keep", type=int, metavar="N", help="prune: keep the N newest runs")
    p.add_argument("--older-than", metavar="AGE",
                   help="prune: remove runs untouched for AGE (30d, 12h, 2w)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="prune: say what would go, remove none")
    p.add_argument("--json", metavar="PATH", help="list: write the runs as JSON ('-' = stdout)")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from nanscope.monitor import runs_root

    root = Path(args.run_dir) if args.run_dir else runs_root()
    if args.action == "list":
        if args.keep is not None or args.older_than or args.dry_run:
            raise UsageError("--keep, --older-than and --dry-run are for `nanscope runs prune`")
        return _list(root, args.json)
    if args.keep is None and not args.older_than:
        raise UsageError("say what to prune: --keep N (the newest N stay) or --older-than AGE")
    if args.keep is not None and args.keep < 0:
        raise UsageError(f"--keep must be 0 or more; got {args.keep}")
    age = parse_age(args.older_than) if args.older_than else None
    runs = find_runs(root)
    doomed = runs[args.keep :] if args.keep is not None else list(runs)
    if age is not None:
        cutoff = time.time() - age
        doomed = [r for r in doomed if r.modified < cutoff]
    freed = 0
    for run in doomed:
        if not args.dry_run:
            try:
                shutil.rmtree(run.path)
            except OSError as exc:
                progress(f"nanscope runs: could not remove {clean(shown_path(run.path))} "
                         f"({exc.strerror or exc})")  # fmt: skip
                continue
        freed += run.size
        say(f"{'would remove' if args.dry_run else 'removed'} {clean(shown_path(run.path))}")
    verb = "would free" if args.dry_run else "freed"
    progress(f"nanscope runs: {len(doomed)} of {len(runs)} runs in {clean(shown_path(root))} "
             f"{'would go' if args.dry_run else 'removed'}; {verb} {_size(freed)}")  # fmt: skip
    return 0


def _list(root: Path, json_path: str | None) -> int:
    runs = find_runs(root)
    if json_path:
        items: list[dict[str, Any]] = [
            {"path": str(r.path), "modified": r.modified, "size": r.size, "verdict": r.verdict,
             "cause": r.cause, "step": r.step}
            for r in runs
        ]  # fmt: skip
        write_output(json.dumps({"root": str(root), "runs": items}, indent=2) + "\n", json_path)
        if json_path == "-":
            return 0
    if not runs:
        say(f"no runs in {clean(shown_path(root))}")
        return 0
    rows = [
        [r.path.name, time.strftime("%Y-%m-%d %H:%M", time.localtime(r.modified)),
         f"{r.verdict}: {r.cause}" if r.cause not in ("", r.verdict) else r.verdict,
         "" if r.step is None else str(r.step), _size(r.size)]
        for r in runs
    ]  # fmt: skip
    headers = ["run", "last written", "outcome", "update", "size"]
    for line, _ in table(headers, rows, columns(sys.stdout), right={3, 4}):
        say(line)
    progress(f"nanscope runs: {len(runs)} runs in {clean(shown_path(root))}")
    return 0
