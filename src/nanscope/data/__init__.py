"""Scan data before it reaches the model: NaN/inf/null, unscaled and constant columns, extreme
rows, broken targets, duplicated columns (checks ``S001``..``S011``).

>>> from nanscope.data import scan
>>> report = scan("ads.parquet", target="clicked")   # doctest: +SKIP
>>> [f.code for f in report.findings]                # doctest: +SKIP
['S001', 'S004', 'S006']

Polars is imported when :func:`scan` is first called, never at ``import nanscope``.
"""

from __future__ import annotations

from typing import Any

from nanscope.data._model import SCHEMA, ColumnStats, Finding, ScanReport

__all__ = ["SCHEMA", "ColumnStats", "Finding", "ScanReport", "check_codes", "render", "scan"]


def scan(obj: Any, target: str | int | None = None, **kwargs: Any) -> ScanReport:
    """Scan ``obj`` (path, array, frame, torch Dataset); see ``nanscope.data._engine.scan``."""
    from nanscope._extras import needs

    with needs("nanscope.scan"):
        from nanscope.data._engine import scan as _scan
    return _scan(obj, target, **kwargs)


def check_codes() -> dict[str, str]:
    """``{code: name}`` of every scan check."""
    from nanscope.data.checks import CHECKS

    return {m.CODE: m.NAME for m in CHECKS}


def render(report: ScanReport, *, color: bool | None = None, width: int | None = None) -> str:
    """The terminal report as a string (rich tables with ``color``, plain text without)."""
    from nanscope.data._report import render as _render

    return _render(report, color=color, width=width)
