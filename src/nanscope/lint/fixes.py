"""Safe fixes: the edits a finding carries, applied to the source, and the helpers rules build
them with.

A fix is safe when it keeps the program's meaning where it was finite and only removes the hazard:
``log(softmax(x))`` -> ``log_softmax(x)``, ``BCELoss`` on ``sigmoid(z)`` -> ``BCEWithLogitsLoss``
on ``z``, an epsilon added to a norm or a standard deviation that is divided by, or under a square
root, and a zero ``eps`` given to an optimizer removed. :func:`fix_source` applies them, lints the
result again and repeats (a fix can reveal another), and keeps a round only when its result
parses.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Iterable

from nanscope.lint._types import Edit, LintFinding

__all__ = [
    "apply_edits",
    "fix_source",
    "insert_after",
    "offset_of",
    "plus_epsilon",
    "remove_keyword",
    "renamed_call",
    "replace",
    "unified_diff",
]

#: the rounds of fix-and-lint-again before giving up (a fix that keeps finding more)
MAX_ROUNDS = 10


def replace(node: ast.AST, text: str) -> Edit:
    """Replace the source of ``node`` with ``text``."""
    return Edit(
        node.lineno,  # type: ignore[attr-defined]
        node.col_offset,  # type: ignore[attr-defined]
        node.end_lineno or node.lineno,  # type: ignore[attr-defined]
        node.end_col_offset or 0,  # type: ignore[attr-defined]
        text,
    )


def insert_after(node: ast.AST, text: str) -> Edit:
    """Insert ``text`` right after ``node``."""
    line = node.end_lineno or node.lineno  # type: ignore[attr-defined]
    col = node.end_col_offset or 0  # type: ignore[attr-defined]
    return Edit(line, col, line, col, text)


#: nodes whose source can take `` + eps`` after it without parentheses
_TIGHT = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)
_TIGHT_OPS = (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult, ast.Add, ast.Sub)


def plus_epsilon(node: ast.expr, source: str, eps: str, *, operand: bool) -> Edit | None:
    """An edit making ``node`` into ``node + eps``, parenthesised where needed: ``operand`` says
    that the result stands inside a larger expression (a divisor, a receiver)."""
    text = ast.get_source_segment(source, node)
    if text is None:
        return None
    tight = isinstance(node, _TIGHT) or (
        isinstance(node, ast.BinOp) and isinstance(node.op, _TIGHT_OPS)
    )
    inner = text if tight or isinstance(node, ast.UnaryOp) else f"({text})"
    if operand and not _parenthesised(node, source):
        return replace(node, f"({inner} + {eps})")
    return replace(node, f"{inner} + {eps}")


def _parenthesised(node: ast.AST, source: str) -> bool:
    """Whether ``node``'s source stands right inside a pair of grouping parentheses."""
    lines = source.splitlines(keepends=True)
    start = offset_of(lines, node.lineno, node.col_offset)  # type: ignore[attr-defined]
    end = offset_of(lines, node.end_lineno or node.lineno, node.end_col_offset or 0)  # type: ignore[attr-defined]
    before = source[:start].rstrip()
    after = source[end:].lstrip()
    return before.endswith("(") and after.startswith(")")


def renamed_call(call: ast.Call, new_name: str, source: str) -> str | None:
    """The source of ``call`` with its function's last name replaced: ``F.softmax(x, -1)`` ->
    ``F.log_softmax(x, -1)``. None when the function is not an attribute."""
    func = call.func
    text = ast.get_source_segment(source, call)
    func_text = ast.get_source_segment(source, func)
    if (
        not isinstance(func, ast.Attribute)
        or text is None
        or func_text is None
        or not text.startswith(func_text)
        or not func_text.endswith(func.attr)
    ):
        return None
    return func_text[: -len(func.attr)] + new_name + text[len(func_text) :]


def remove_keyword(call: ast.Call, kw: ast.keyword, source: str) -> Edit | None:
    """An edit removing ``kw`` (and the comma before it) from ``call``'s arguments."""
    lines = source.splitlines(keepends=True)
    end = offset_of(lines, kw.end_lineno or kw.lineno, kw.end_col_offset or 0)
    start = offset_of(lines, kw.lineno, kw.col_offset)
    cut = start
    while cut > 0 and source[cut - 1] in " \t\r\n":
        cut -= 1
    if cut > 0 and source[cut - 1] == ",":
        start = cut - 1
    else:  # the first argument: take the comma after it instead
        after = end
        while after < len(source) and source[after] in " \t":
            after += 1
        if after < len(source) and source[after] == ",":
            end = after + 1
            while end < len(source) and source[end] in " \t":
                end += 1
    line, col = _position(lines, start)
    end_line, end_col = _position(lines, end)
    return Edit(line, col, end_line, end_col, "")


def offset_of(lines: list[str], line: int, col: int) -> int:
    """The string index of (``line``, UTF-8 byte ``col``) in the source split into ``lines``
    (with their line ends)."""
    before = sum(len(text) for text in lines[: line - 1])
    if line - 1 >= len(lines):
        return before
    text = lines[line - 1]
    return before + len(text.encode("utf-8")[:col].decode("utf-8", errors="ignore"))


def _position(lines: list[str], offset: int) -> tuple[int, int]:
    for number, text in enumerate(lines, start=1):
        if offset <= len(text):
            return number, len(text[:offset].encode("utf-8"))
        offset -= len(text)
    return len(lines) + 1, 0


def apply_edits(source: str, groups: Iterable[Iterable[Edit]]) -> tuple[str, int]:
    """``source`` with the groups of edits (one group per finding) applied, each group whole or
    not at all: a group with an edit overlapping one already taken waits for the next round.
    Returns the new source and how many groups were applied."""
    lines = source.splitlines(keepends=True)
    taken: list[tuple[int, int, str]] = []
    applied = 0
    for group in groups:
        spans = [
            (
                offset_of(lines, e.line, e.col),
                offset_of(lines, e.end_line, e.end_col),
                e.text,
            )
            for e in group
        ]
        if not spans or any(_overlaps(span, other) for span in spans for other in taken):
            continue
        taken.extend(spans)
        applied += 1
    out = source
    for start, end, text in sorted(taken, key=lambda s: (s[0], s[1]), reverse=True):
        out = out[:start] + text + out[end:]
    return out, applied


def _overlaps(a: tuple[int, int, str], b: tuple[int, int, str]) -> bool:
    if a[0] == a[1] == b[0] == b[1]:
        return True  # two insertions at one point
    return a[0] < b[1] and b[0] < a[1]


def fix_source(
    source: str, lint: Callable[[str], list[LintFinding]]
) -> tuple[str, int, list[LintFinding]]:
    """Apply the safe fixes of ``lint(source)`` until none is left: the fixed source, how many
    findings were fixed, and the findings of the fixed source. A round whose result does not
    parse is dropped (and the rounds stop)."""
    findings = lint(source)
    fixed = 0
    for _ in range(MAX_ROUNDS):
        groups = [f.edits for f in findings if f.edits]
        if not groups:
            break
        candidate, applied = apply_edits(source, groups)
        if not applied or candidate == source:
            break
        try:
            ast.parse(candidate)
        except SyntaxError:
            break
        fixed += applied
        source, findings = candidate, lint(candidate)
    return source, fixed, findings


def unified_diff(before: str, after: str, path: str) -> str:
    """The change as a unified diff, ``--- path`` / ``+++ path``."""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=path,
            tofile=path,
        )
    )
