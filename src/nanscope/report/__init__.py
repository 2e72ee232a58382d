"""Reports: the terminal report (rich or plain) and the self-contained HTML page with plots."""

from __future__ import annotations

from typing import Any

from nanscope.report.terminal import print_report, render, sparkline

__all__ = [
    "diagnosis_fragment",
    "print_report",
    "render",
    "render_report",
    "sparkline",
    "write_report",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    # the HTML side pulls in matplotlib only when used
    if name in ("write_report", "render_report", "diagnosis_fragment"):
        from nanscope.report import html

        return getattr(html, name)
    raise AttributeError(name)
