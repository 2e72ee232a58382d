"""Lint one source text: parse once, walk once, dispatch the recorded nodes to the rules.

The engine knows nothing about any particular hazard. It parses the module, builds a
:class:`~nanscope.lint.inference.FileContext` (one walk that records the nodes each rule asked for),
hands every recorded node to the rules subscribed to its type, turns their hits into
:class:`~nanscope.lint._types.LintFinding` records and drops the ones a ``# nanscope: noqa``
comment suppresses.
"""

from __future__ import annotations

import ast
import gc
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nanscope.errors import InputError, UsageError
from nanscope.lint._files import PYTHON_SUFFIXES, iter_python_files
from nanscope.lint._types import LintFinding, Rule
from nanscope.lint.inference import FileContext
from nanscope.lint.registry import RULES, SYNTAX_ERROR_CODE

__all__ = ["LintReport", "lint_file", "lint_near", "lint_paths", "lint_source", "select_rules"]

_NOQA = re.compile(
    r"#\s*nanscope:\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:\s*,\s*[A-Za-z]+[0-9]+)*))?", re.I
)


def _split_codes(text: str | Sequence[str] | None) -> list[str]:
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip().upper() for item in items if item.strip()]


def select_rules(
    select: str | Sequence[str] | None = None, ignore: str | Sequence[str] | None = None
) -> list[type[Rule]]:
    """The rule classes left after ``select`` and ``ignore`` (codes or code prefixes, ``ALL``).

    Raises :class:`~nanscope.errors.UsageError` for a code that matches no rule.
    """
    known = [SYNTAX_ERROR_CODE, *RULES]
    chosen_codes = _split_codes(select) or ["ALL"]
    ignored = _split_codes(ignore)
    for code in [*chosen_codes, *ignored]:
        if code != "ALL" and not any(k.startswith(code) for k in known):
            raise UsageError(
                f"unknown rule code '{code}' (known: {', '.join(known)}; prefixes like L00 work)"
            )

    def matches(code: str, patterns: list[str]) -> bool:
        return any(p == "ALL" or code.startswith(p) for p in patterns)

    return [
        rule
        for code, rule in RULES.items()
        if matches(code, chosen_codes) and not matches(code, ignored)
    ]


def _syntax_enabled(select: str | Sequence[str] | None, ignore: str | Sequence[str] | None) -> bool:
    chosen = _split_codes(select) or ["ALL"]
    ignored = _split_codes(ignore)
    code = SYNTAX_ERROR_CODE
    return any(p == "ALL" or code.startswith(p) for p in chosen) and not any(
        p == "ALL" or code.startswith(p) for p in ignored
    )


def _noqa_codes(line: str) -> set[str] | None:
    """None: no noqa on this line; empty set: blanket noqa; else the suppressed codes."""
    if "noqa" not in line.lower():
        return None
    match = _NOQA.search(line)
    if match is None:
        return None
    codes = match.group("codes")
    return set(_split_codes(codes)) if codes else set()


def _suppressed(code: str, lines: Sequence[str], *line_numbers: int) -> bool:
    for number in line_numbers:
        if 1 <= number <= len(lines):
            codes = _noqa_codes(lines[number - 1])
            if codes is not None and (not codes or code in codes):
                return True
    return False


def lint_source(
    source: str,
    path: str = "<string>",
    rules: Iterable[type[Rule]] | None = None,
    check_syntax: bool = True,
) -> list[LintFinding]:
    """Lint Python ``source``; ``path`` is only used in the findings.

    A source that does not parse gives one finding with code ``L000`` (when ``check_syntax``).
    """
    rule_classes = list(RULES.values()) if rules is None else list(rules)
    size = len(source.encode("utf-8", errors="replace"))
    if size > MAX_SOURCE_BYTES:
        if not check_syntax:
            return []
        return [_too_large(path, size)]
    lines = source.splitlines()
    try:
        tree = ast.parse(source, filename=path)
    except (RecursionError, MemoryError):
        if not check_syntax:
            return []
        return [_not_linted(path, "could not parse: an expression is nested too deeply for "
                            "Python's parser; the rules did not run on it",
                            "split the deeply nested expression")]  # fmt: skip
    except (SyntaxError, ValueError) as exc:
        if not check_syntax:
            return []
        line = getattr(exc, "lineno", None) or 1
        col = getattr(exc, "offset", None) or 1
        msg = getattr(exc, "msg", None) or str(exc)
        finding = LintFinding(
            code=SYNTAX_ERROR_CODE,
            name="syntax-error",
            path=path,
            line=line,
            col=col,
            message=f"file does not parse ({type(exc).__name__}: {msg}); the other rules did not "
            "run on it: fix the syntax",
            fix="fix the syntax error so the file can be linted",
        )
        return [finding]
    depth = _depth(tree, MAX_DEPTH)
    if depth > MAX_DEPTH:
        if not check_syntax:
            return []
        return [_not_linted(path, f"could not analyse: the syntax tree is nested more than "
                            f"{MAX_DEPTH} levels deep; the rules did not run on it",
                            "split the deeply nested expression")]  # fmt: skip
    instances = [cls() for cls in rule_classes]
    by_type: dict[type[ast.AST], list[Rule]] = {}
    for rule in instances:
        for node_type in rule.node_types:
            by_type.setdefault(node_type, []).append(rule)
    limit = sys.getrecursionlimit()
    if limit < 20000:
        sys.setrecursionlimit(20000)
    # the walk allocates many small objects that are never cyclic garbage: pausing the cyclic
    # collector roughly halves the time on a large file
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _lint_tree(tree, lines, path, instances, by_type)
    except RecursionError:
        return [
            LintFinding(
                SYNTAX_ERROR_CODE,
                "syntax-error",
                path,
                1,
                1,
                "file is nested too deeply to analyse; the rules did not run on it",
                "split the deeply nested expression",
            )
        ]
    finally:
        sys.setrecursionlimit(limit)
        if gc_was_enabled:
            gc.enable()


#: the largest source linted: bigger files (generated code, a data blob saved as .py) get one
#: finding instead of minutes and gigabytes
MAX_SOURCE_BYTES = 1 << 20
#: the deepest syntax tree the (recursive) rules walk
MAX_DEPTH = 1000


def _too_large(path: str, size: int) -> LintFinding:
    return _not_linted(
        path,
        f"file is {size / 2**20:.1f} MiB, over the {MAX_SOURCE_BYTES / 2**20:g} MiB limit; "
        "the rules did not run on it",
        "lint the training code itself, not generated code or data saved as .py",
    )


def _not_linted(path: str, message: str, fix: str) -> LintFinding:
    return LintFinding(SYNTAX_ERROR_CODE, "syntax-error", path, 1, 1, message, fix)


def _depth(tree: ast.AST, limit: int) -> int:
    """The nesting depth of ``tree`` without recursion; stops counting past ``limit``."""
    deepest = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        for child in ast.iter_child_nodes(node):
            stack.append((child, depth + 1))
    return deepest


def _lint_tree(
    tree: ast.Module,
    lines: Sequence[str],
    path: str,
    instances: list[Rule],
    by_type: dict[type[ast.AST], list[Rule]],
) -> list[LintFinding]:
    ctx = FileContext(tree, frozenset(by_type))
    findings: dict[tuple[str, int, int], LintFinding] = {}
    for node, site in ctx.sites:
        for rule in by_type[type(node)]:
            for hit in rule.check(node, site, ctx):
                line = getattr(hit.node, "lineno", 1)
                col = getattr(hit.node, "col_offset", 0) + 1
                end_line = getattr(hit.node, "end_lineno", None)
                key = (rule.code, line, col)
                if key in findings or _suppressed(rule.code, lines, line, end_line or line):
                    continue
                fix = hit.fix or rule.fix
                findings[key] = LintFinding(
                    code=rule.code,
                    name=rule.name,
                    path=path,
                    line=line,
                    col=col,
                    message=f"{hit.message}; {fix}" if fix else hit.message,
                    fix=fix,
                    end_line=end_line,
                    end_col=(getattr(hit.node, "end_col_offset", None) or 0) + 1
                    if end_line
                    else None,
                )
    return sorted(findings.values(), key=lambda f: (f.line, f.col, f.code))


def read_source(path: Path) -> str:
    """Read a Python file as text: UTF-8 (with BOM), falling back to latin-1."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def lint_file(
    path: str | Path, rules: Iterable[type[Rule]] | None = None, display_path: str | None = None
) -> list[LintFinding]:
    """Lint one file. Raises ``OSError`` when it cannot be read."""
    p = Path(path)
    return lint_source(read_source(p), display_path or str(path), rules)


def lint_near(path: str, line: int, radius: int = 30) -> list[LintFinding]:
    """Findings in ``path`` within ``radius`` lines of ``line``, nearest first.

    Used by the reports when a diagnosis locates the failing op at a source line. A file that
    cannot be read (or is not Python) gives an empty list: the report still renders.
    """
    p = Path(path)
    if not p.is_file():
        return []
    try:
        findings = lint_file(p)
    except OSError:
        return []
    near = [f for f in findings if abs(f.line - line) <= radius and f.code != SYNTAX_ERROR_CODE]
    return sorted(near, key=lambda f: (abs(f.line - line), f.line, f.col))


@dataclass
class LintReport:
    """The result of linting some paths: the findings, and which files were looked at."""

    findings: list[LintFinding] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def files_with_findings(self) -> int:
        return len({f.path for f in self.findings})


def lint_paths(
    paths: Sequence[str | Path],
    select: str | Sequence[str] | None = None,
    ignore: str | Sequence[str] | None = None,
) -> LintReport:
    """Lint files and directories (walked, honouring ``.gitignore``; non-Python files skipped).

    Raises :class:`~nanscope.errors.UsageError` for an unknown code and
    :class:`~nanscope.errors.InputError` for a path that does not exist.
    """
    rules = select_rules(select, ignore)
    check_syntax = _syntax_enabled(select, ignore)
    report = LintReport()
    targets: list[tuple[Path, str]] = []
    for given in paths:
        p = Path(given)
        if p.is_dir():
            root = p.resolve()
            for found in iter_python_files(p):
                targets.append((found, str(Path(given) / found.relative_to(root))))
        elif p.is_file():
            if p.suffix in PYTHON_SUFFIXES:
                targets.append((p, str(given)))
            else:
                report.skipped.append(str(given))
        else:
            raise InputError(f"{given}: no such file or directory")
    for path, shown in targets:
        try:
            size = path.stat().st_size
            if size > MAX_SOURCE_BYTES:
                report.files.append(shown)
                if check_syntax:
                    report.findings.append(_too_large(shown, size))
                continue
            source = read_source(path)
        except OSError as exc:
            raise InputError(f"{shown}: cannot read ({exc.strerror or exc})") from exc
        report.files.append(shown)
        report.findings.extend(lint_source(source, shown, rules, check_syntax=check_syntax))
    return report
