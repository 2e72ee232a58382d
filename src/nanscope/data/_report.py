"""The terminal report: findings first, then one row per column. Rich, or plain text."""

from __future__ import annotations

import io
import math

from nanscope._messages import clean
from nanscope.data._model import ColumnStats, Finding, ScanReport

__all__ = ["render"]

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


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


def _rows(f: Finding) -> str:
    if not f.rows:
        return ""
    shown = ", ".join(str(r) for r in f.rows[:5])
    return shown + (", ..." if f.count > 5 or len(f.rows) > 5 else "")


def _summary(report: ScanReport) -> str:
    c = report.counts()
    ncol = len(report.columns)
    head = f"nanscope scan: {report.source}: {report.n_rows:,} rows x {ncol} columns"
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


def render(report: ScanReport, *, color: bool | None = None, width: int | None = None) -> str:
    if color:
        return _render_rich(report, width or 120)
    return _render_plain(report)


def _render_plain(report: ScanReport) -> str:
    lines = [_summary(report), ""]
    for note in report.notes:
        lines.extend([f"note: {note}", ""])
    if report.findings:
        lines.append("findings:")
        for f in report.findings:
            lines.append(f"  {f.severity:<7} {f.code} {f.message}")
            lines.append(f"          fix: {f.fix}")
        lines.append("")
    cells = [_COL_HEAD] + [_col_cells(c) for c in report.columns.values()]
    widths = [max(len(row[j]) for row in cells) for j in range(len(_COL_HEAD))]
    for row in cells:
        lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    if any(not c.robust_exact for c in report.columns.values()):
        lines.append("")
        lines.append("  ~ median from an evenly strided sample; counts, min, max, mean, std exact")
    return "\n".join(lines) + "\n"


def _render_rich(report: ScanReport, width: int) -> str:
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system="standard")
    console.print(_summary(report), style="bold", highlight=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    if report.findings:
        ft = Table(title="findings", title_justify="left", show_lines=False)
        for h in ("severity", "code", "column", "message", "rows", "fix"):
            ft.add_column(h, overflow="fold")
        for f in report.findings:
            ft.add_row(
                f"[{_STYLE[f.severity]}]{f.severity}[/]",
                f.code,
                f.column or "",
                f.message,
                _rows(f),
                f.fix,
            )
        console.print(ft, highlight=False)
    ct = Table(title="columns", title_justify="left")
    for h in _COL_HEAD:
        ct.add_column(h, justify="left" if h in ("column", "dtype") else "right")
    flagged = {f.column for f in report.findings if f.severity != "info"}
    for c in report.columns.values():
        ct.add_row(*_col_cells(c), style="yellow" if c.name in flagged else None)
    console.print(ct, highlight=False)
    if any(not c.robust_exact for c in report.columns.values()):
        console.print("~ median from an evenly strided sample; counts, min, max, mean, std exact")
    return buf.getvalue()
