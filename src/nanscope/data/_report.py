"""The terminal report: findings first, then one row per column; in colour or plain text.

Sized to the terminal (``width``, see :mod:`nanscope._console`): each finding is a paragraph
wrapped at spaces under its message, and the column table, when it is wider than the terminal,
is printed as two tables (the counts, then the statistics), each with the column names. With no
width (a file, a pipe) nothing is wrapped or split.
"""

from __future__ import annotations

import math

from nanscope._console import rich_text, wrap
from nanscope._messages import clean
from nanscope.data._model import ColumnStats, Finding, ScanReport

__all__ = ["render"]

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}

#: one output line: its pieces of text and the style of each ("" for none)
_Segments = list[tuple[str, str]]


def _n(x: float) -> str:
    if isinstance(x, int):
        return f"{x:,}"
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    ax = abs(x)
    if ax != 0 and (ax >= 1e6 or ax < 1e-3):
        return f"{x:.3g}"
    return f"{x:.4g}"


def _summary(report: ScanReport) -> str:
    c = report.counts()
    ncol = len(report.columns)
    head = f"{report.source}: {report.n_rows:,} rows x {ncol} columns"
    if report.target:
        head += f", target `{report.target}`"
    if not report.findings:
        return head + " -- clean"
    parts = [f"{v} {k}{'s' if v != 1 else ''}" for k, v in c.items() if v]
    return head + " -- " + ", ".join(parts)


def _col_cells(c: ColumnStats) -> list[str]:
    if not c.numeric:
        return [clean(c.name, 60), c.dtype, "skipped", "", "", "", "", "", "", ""]
    return [
        clean(c.name, 60) + (" (target)" if c.is_target else ""),
        c.dtype,
        f"{c.n_null:,}" if c.n_null else "0",
        f"{c.n_nan:,}" if c.n_nan else "0",
        f"{c.n_inf:,}" if c.n_inf else "0",
        _n(c.min),
        _n(c.max),
        _n(c.mean),
        _n(c.std),
        _n(c.median) + ("" if c.robust_exact else "~"),
    ]


_COL_HEAD = ["column", "dtype", "null", "nan", "inf", "min", "max", "mean", "std", "median"]
#: the two halves of the column table on a narrow terminal (each keeps the name)
_COUNTS = [0, 1, 2, 3, 4]
_STATS = [0, 5, 6, 7, 8, 9]


def render(report: ScanReport, *, color: bool | None = None, width: int | None = None) -> str:
    """The report as text at ``width`` columns (``None``: no limit), with ANSI colours when
    ``color``."""
    lines = _lines(report, width)
    if not color:
        return "\n".join("".join(text for text, _ in line).rstrip() for line in lines) + "\n"
    from rich.text import Text

    texts = []
    for line in lines:
        text = Text()
        for piece, style in line:
            text.append(piece, style=style or None)
        texts.append(text)
    return rich_text(*texts, width=None, color=True)


def _lines(report: ScanReport, width: int | None) -> list[_Segments]:
    out: list[_Segments] = []
    for i, line in enumerate(wrap(_summary(report), width, "nanscope scan: ")):
        out.append([(line, "bold")] if i else [("nanscope scan: ", "bold"), (line[15:], "bold")])
    out.append([])
    for note in report.notes:
        out.extend([[(line, "")] for line in wrap(clean(note, 2000), width, "note: ")])
        out.append([])
    if report.findings:
        out.append([("findings", "bold")])
        for f in report.findings:
            out.extend(_finding(f, width))
        out.append([])
    rows = [_COL_HEAD] + [_col_cells(c) for c in report.columns.values()]
    flagged = {clean(f.column, 60) for f in report.findings if f.severity != "info" and f.column}
    styles = [""] + ["yellow" if clean(c.name, 60) in flagged else ""
                     for c in report.columns.values()]  # fmt: skip
    widths = [max(len(row[j]) for row in rows) for j in range(len(_COL_HEAD))]
    whole = 2 + sum(widths) + 2 * (len(widths) - 1)
    parts = [list(range(len(_COL_HEAD)))] if width is None or whole <= width else [_COUNTS, _STATS]
    for k, part in enumerate(parts):
        if k:
            out.append([])
        out.append([("columns" + ("" if len(parts) == 1 else f" ({k + 1}/2)"), "bold")])
        for row, style in zip(rows, styles):
            cells = [row[j].ljust(widths[j]) if j < 2 else row[j].rjust(widths[j]) for j in part]
            text = "  " + "  ".join(cells)
            out.append([(text.rstrip(), "bold" if row is rows[0] else style)])
    if any(not c.robust_exact for c in report.columns.values()):
        out.append([])
        text = "~ median from an evenly strided sample; counts, min, max, mean, std exact"
        out.extend([[(line, "dim")] for line in wrap(text, width, "  ")])
    return out


def _finding(f: Finding, width: int | None) -> list[_Segments]:
    """``  error   S001 column `ctr` has 2 NaN values ...`` and its fix, wrapped under the text."""
    label = f"  {f.severity:<7} {f.code} "
    lines: list[_Segments] = []
    for i, line in enumerate(wrap(f.message, width, label)):
        if i:
            lines.append([(line, "")])
        else:
            lines.append([(f"  {f.severity:<7}", _STYLE[f.severity]), (line[9:], "")])
    indent = " " * len(label)
    lines.extend([[(line, "dim")] for line in wrap(f.fix, width, indent + "fix: ")])
    return lines
