"""``nanscope lint PATH... [--select CODES] [--ignore CODES] [--json PATH]``.

Prints one ``path:line:col: L###  message`` line per finding and a summary line. Exit codes:
0 no findings, 1 findings, 2 usage or input error (raised as ``UsageError`` / ``InputError`` and
turned into one line on stderr by the dispatcher).
"""

from __future__ import annotations

import argparse
import json
import sys

from nanscope.commands.base import CommandParser
from nanscope.errors import InputError
from nanscope.lint._engine import lint_paths
from nanscope.lint.registry import RULES, SYNTAX_ERROR_CODE

__all__ = ["main"]



def _parser() -> CommandParser:
    codes = "\n".join(f"  {code}  {rule.name}" for code, rule in RULES.items())
    parser = CommandParser(
        prog="nanscope lint",
        description="Lint training code for the numerical hazards that make a loss go NaN.",
        epilog=f"rules:\n  {SYNTAX_ERROR_CODE}  syntax-error (file does not parse)\n{codes}\n\n"
        "Suppress a line with '# nanscope: noqa' or '# nanscope: noqa: L001,L003'.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    parser.add_argument(
        "--select", metavar="CODES", help="comma-separated codes or prefixes to run (default: all)"
    )
    parser.add_argument(
        "--ignore", metavar="CODES", help="comma-separated codes or prefixes to skip"
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        dest="json_path",
        help="write the findings as JSON to PATH ('-' for stdout)",
    )
    return parser


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    report = lint_paths(args.paths, select=args.select, ignore=args.ignore)
    for skipped in report.skipped:
        print(f"nanscope lint: skipped {skipped} (not a Python file)", file=sys.stderr)
    payload = [
        {
            "code": f.code,
            "name": f.name,
            "path": f.path,
            "line": f.line,
            "col": f.col,
            "end_line": f.end_line,
            "end_col": f.end_col,
            "message": f.message,
            "fix": f.fix,
        }
        for f in report.findings
    ]
    if args.json_path is not None:
        text = json.dumps(payload, indent=2)
        if args.json_path == "-":
            print(text)
            return 1 if report.findings else 0
        try:
            with open(args.json_path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            raise InputError(
                f"{args.json_path}: cannot write JSON ({exc.strerror or exc})"
            ) from exc
    for finding in report.findings:
        print(finding.format())
    if report.findings:
        print(
            f"Found {_plural(len(report.findings), 'problem')} in "
            f"{_plural(report.files_with_findings, 'file')} "
            f"({_plural(len(report.files), 'file')} checked)"
        )
        return 1
    if not report.files:
        print("No Python files found")
        return 0
    print(f"All checks passed ({_plural(len(report.files), 'file')} checked)")
    return 0
