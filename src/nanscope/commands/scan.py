"""``nanscope scan DATA [--target COL] [--json PATH] [--no-color]``.

Exit codes: 0 clean (info findings at most), 1 a warning or an error found, 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import json
import sys

from nanscope._console import columns
from nanscope.commands.base import CommandParser, write_output

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="nanscope scan",
        description="Scan a data file (CSV, Parquet, Arrow/Feather, NPY/NPZ or a directory) for "
        "what makes a fit go NaN: NaN/inf/null values, unscaled or constant columns, extreme "
        "rows, broken targets, duplicated columns.",
    )
    p.add_argument("data", help="a data file or a directory of data files")
    p.add_argument("--target", help="the target column (enables the target checks)")
    p.add_argument("--loss", choices=["log", "ce", "mse"], help="the loss the target feeds")
    p.add_argument("--num-classes", type=int, help="number of classes (labels 0..K-1)")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON ('-' for stdout)")
    p.add_argument("--no-color", action="store_true", help="plain text, no colours")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.add_argument("--max-rows", type=int, default=10, help="row indices listed per finding")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from nanscope.data import render, scan

    report = scan(
        args.data,
        args.target,
        loss=args.loss,
        num_classes=args.num_classes,
        max_rows=args.max_rows,
        progress=False if args.no_progress or args.quiet else None,
    )
    if args.json:
        write_output(json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n", args.json)
    if args.json != "-":
        color = sys.stdout.isatty() and not args.no_color
        sys.stdout.write(render(report, color=color, width=columns(sys.stdout)))
    return report.exit_code
