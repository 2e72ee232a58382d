"""``nanscope lint PATH... [options]``: the linter's command line, with ruff's conventions.

Prints each finding as ``path:line:col: L### [*] message`` with its fix on an indented second line
(``--output-format`` for the others: concise, grouped, json, github, sarif), then a summary line.
``-`` reads the source from standard input (``--stdin-filename`` names it). ``--fix`` applies the
safe fixes (``[*]``) in place, ``--diff`` prints them as a diff instead. Exit codes: 0 no
findings (or ``--exit-zero``), 1 findings (``--diff``: changes to make), 2 usage or input error
(raised as ``UsageError`` / ``InputError`` and turned into one line on stderr by the
dispatcher).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from nanscope.commands.base import CommandParser, write_output
from nanscope.errors import InputError, UsageError
from nanscope.lint._engine import LintReport, lint_paths, lint_source
from nanscope.lint._types import LintFinding, Rule
from nanscope.lint.fixes import fix_source, unified_diff
from nanscope.lint.output import FORMATS, render, statistics
from nanscope.lint.registry import RULES, SYNTAX_ERROR_CODE

__all__ = ["main"]


#: the on/off options, as ruff names them
_SWITCHES = (
    ("--statistics", "print the number of findings per code"),
    ("--exit-zero", "exit 0 even when there are findings"),
    ("--fix", "apply the safe fixes ([*]) in place"),
    ("--diff", "print the safe fixes as a diff; change nothing"),
    ("--isolated", "read no [tool.nanscope.lint] configuration"),
    ("--force-exclude", "apply 'exclude' to files named on the command line too (pre-commit)"),
)


def _parser() -> CommandParser:
    codes = "\n".join(f"  {code}  {rule.name}" for code, rule in RULES.items())
    parser = CommandParser(
        prog="nanscope lint",
        description="Lint training code for the numerical hazards that make a loss go NaN.",
        epilog=f"rules:\n  {SYNTAX_ERROR_CODE}  syntax-error (file does not parse)\n{codes}\n\n"
        "Suppress a line with '# noqa', '# noqa: L003' or '# nanscope: noqa: L001,L003'; a\n"
        "'# nanscope: noqa' line of its own exempts the whole file. Configure select, ignore,\n"
        "extend-select, exclude and per-file-ignores in [tool.nanscope.lint] of pyproject.toml.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="files or directories ('-' for standard input)"
    )
    parser.add_argument(
        "--select", metavar="CODES", help="comma-separated codes or prefixes to run (default: all)"
    )
    parser.add_argument(
        "--extend-select", metavar="CODES", help="codes or prefixes to run on top of the selection"
    )
    parser.add_argument(
        "--ignore", metavar="CODES", help="comma-separated codes or prefixes to skip"
    )
    parser.add_argument(
        "--output-format",
        choices=FORMATS,
        default="text",
        help="how findings are printed (default: text)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        dest="json_path",
        help="also write the findings as JSON to PATH ('-': print JSON instead of text)",
    )
    parser.add_argument(
        "--stdin-filename",
        metavar="PATH",
        help="the name of the source read from '-' (for its configuration and the findings)",
    )
    for flag, text in _SWITCHES:
        parser.add_argument(flag, action="store_true", help=text)
    return parser


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _read_stdin() -> str:
    try:
        return sys.stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"standard input: cannot read ({exc})") from exc


def _apply_fixes(report: LintReport) -> tuple[dict[str, str], int]:
    """The fixed source of every file that has a safe fix, and how many findings were fixed."""
    fixed_sources: dict[str, str] = {}
    total = 0
    for shown in {f.path for f in report.findings if f.fixable}:
        source = report.sources[shown]
        rules = report.rules.get(shown)

        def lint(
            text: str, shown: str = shown, rules: list[type[Rule]] | None = rules
        ) -> list[LintFinding]:
            return lint_source(text, shown, rules, check_syntax=False)

        new, count, _ = fix_source(source, lint)
        if new != source:
            fixed_sources[shown] = new
            total += count
    return fixed_sources, total


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    from_stdin = "-" in args.paths
    paths = [p for p in args.paths if p != "-"]
    if args.stdin_filename and not from_stdin:
        raise UsageError("--stdin-filename names the source read from '-': add '-' as a PATH")
    if args.fix and args.diff:
        raise UsageError("--fix and --diff do not go together: --diff shows what --fix would do")
    stdin = (_read_stdin(), args.stdin_filename or "-") if from_stdin else None

    def lint_all(source: tuple[str, str] | None) -> LintReport:
        return lint_paths(
            paths,
            select=args.select,
            ignore=args.ignore,
            extend_select=args.extend_select,
            isolated=args.isolated,
            force_exclude=args.force_exclude,
            stdin=source,
        )

    report = lint_all(stdin)
    for skipped in report.skipped:
        print(f"nanscope lint: skipped {skipped} (not a Python file)", file=sys.stderr)

    fixed_count = 0
    if args.fix or args.diff:
        fixed_sources, fixed_count = _apply_fixes(report)
        if args.diff:
            for shown in report.files:
                if shown in fixed_sources:
                    sys.stdout.write(
                        unified_diff(report.sources[shown], fixed_sources[shown], shown)
                    )
            if fixed_sources:
                print(
                    f"Would fix {_plural(fixed_count, 'problem')} in "
                    f"{_plural(len(fixed_sources), 'file')}",
                    file=sys.stderr,
                )
            return 1 if fixed_sources else 0
        stdin_fixed: str | None = None
        for shown, new in fixed_sources.items():
            location = report.locations.get(shown)
            if location is None:
                stdin_fixed = new
                continue
            try:
                Path(location).write_text(new, encoding="utf-8")
            except OSError as exc:
                raise InputError(f"{shown}: cannot write the fix ({exc.strerror or exc})") from exc
        if fixed_sources:
            report = lint_all(
                (stdin_fixed, stdin[1]) if stdin and stdin_fixed is not None else stdin
            )
        if stdin is not None:
            # the fixed source goes to stdout (an editor replaces its buffer with it); the
            # findings left go to stderr
            sys.stdout.write(stdin_fixed if stdin_fixed is not None else stdin[0])
            return _finish(report, args, fixed_count, sys.stderr)
    return _finish(report, args, fixed_count, sys.stdout)


def _finish(report: LintReport, args: argparse.Namespace, fixed: int, stream: TextIO) -> int:
    findings = report.findings
    fmt = args.output_format
    if args.json_path == "-":
        fmt = "json"
    elif args.json_path is not None:
        write_output(json.dumps([f.to_dict() for f in findings], indent=2) + "\n", args.json_path)
    status = 1 if findings and not args.exit_zero else 0
    if args.statistics:
        if findings:
            print(statistics(findings), file=stream)
        return status
    body = render(findings, fmt)
    if fmt in ("json", "sarif"):
        print(body, file=stream)
        return status
    if body:
        print(body, file=stream)
    if fmt == "github":
        return status
    print(_summary(report, fixed), file=stream)
    return status


def _summary(report: LintReport, fixed: int) -> str:
    findings = report.findings
    checked = _plural(len(report.files), "file")
    if not report.files:
        return "No Python files found"
    if not findings:
        head = f"Fixed {_plural(fixed, 'problem')}; all" if fixed else "All"
        return f"{head} checks passed ({checked} checked)"
    lines = [
        f"Found {_plural(len(findings), 'problem')} in "
        f"{_plural(report.files_with_findings, 'file')} ({checked} checked"
        + (f", {fixed} fixed)" if fixed else ")")
    ]
    fixable = sum(1 for f in findings if f.fixable)
    if fixable:
        lines.append(f"[*] {fixable} fixable with the --fix option")
    return "\n".join(lines)
