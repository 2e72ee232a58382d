"""The terminal report: verdict, cause, update, evidence table, a loss sparkline, actions.

Rendered with rich when writing to a terminal; plain text (same content, no colour) otherwise or
with ``color=False``. Either way each paragraph is wrapped to the terminal's width (``$COLUMNS``)
at spaces only, its later lines under its text (a hanging indent); written to a file or a pipe,
paragraphs stay on one line. :func:`render` returns the text so tests can compare it.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from nanscope._console import columns, shown_path, wrap
from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.formatting import lr as lr_text
from nanscope.formatting import row as row_text
from nanscope.trace import Trace

__all__ = ["print_report", "recovery_text", "render", "shown_path", "sparkline"]

_BARS = "▁▂▃▄▅▆▇█"
_VERDICT_STYLE = {
    "healthy": "bold green",
    "diverging": "bold yellow",
    "nonfinite": "bold red",
    "suspect": "bold yellow",
    "unobserved": "bold magenta",
    "interrupted": "bold yellow",
    "crashed": "bold red",
}


def sparkline(values: Sequence[float] | np.ndarray, width: int = 60) -> str:
    """One line of block characters for a loss curve; ``×`` marks non-finite updates.

    Positive curves use a log scale (divergence is geometric); each character covers
    ``len(values) / width`` updates and shows the largest of them.
    """
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return ""
    buckets = np.array_split(np.arange(data.size), min(width, data.size))
    finite = data[np.isfinite(data)]
    use_log = finite.size > 0 and bool(np.all(finite > 0))
    scaled = np.log10(np.where(np.isfinite(data) & (data > 0), data, np.nan)) if use_log else data
    good = scaled[np.isfinite(scaled)]
    lo, hi = (float(good.min()), float(good.max())) if good.size else (0.0, 1.0)
    span = hi - lo if hi > lo else 1.0
    out = []
    for bucket in buckets:
        chunk = data[bucket]
        if not np.all(np.isfinite(chunk)):
            out.append("×")
            continue
        value = float(np.max(scaled[bucket]))
        level = round((value - lo) / span * (len(_BARS) - 1))
        out.append(_BARS[max(0, min(len(_BARS) - 1, level))])
    return "".join(out)


def _unit(diagnosis: Diagnosis) -> str:
    return "epoch" if diagnosis.granularity == "epoch" else "update"


@dataclass
class _Line:
    """One paragraph of the report: a label (``  1. ``, ``  [D001] ``) and its text, wrapped
    under the text's first word."""

    label: str
    text: str = ""
    label_style: str = ""
    text_style: str = ""


def _lines(diagnosis: Diagnosis, trace: Trace | None, width: int | None) -> list[_Line]:
    style = _VERDICT_STYLE.get(diagnosis.verdict, "bold")
    out = [_Line("nanscope: ", diagnosis.headline(), "bold", style)]
    runs = [r for r in diagnosis.extra.get("runs") or [] if isinstance(r, Mapping)]
    if len(runs) > 1:
        out.append(_Line(f"{len(runs)} runs in this script, the worst first (this report is "
                         "the first's):", label_style="bold"))  # fmt: skip
        for i, run in enumerate(runs, 1):
            what = ", ".join(str(run[k]) for k in ("model", "optimizer") if run.get(k))
            if run.get("lr") is not None:
                what += f" lr {lr_text(run['lr'])}"
            where = shown_path(run["dir"]) if run.get("dir") else ""
            tail = "; ".join(t for t in (what, where) if t)
            out.append(_Line(f"  {i}. ", str(run.get("headline")) + (f" ({tail})" if tail else "")))
    unit = _unit(diagnosis)
    if diagnosis.first_nonfinite:
        fn = diagnosis.first_nonfinite
        out.append(_Line("first non-finite: ", f"{fn.get('what')} at {unit} {fn.get('step')}"))
    if trace is not None and len(trace):
        label = f"loss per {unit}: "
        room = 60 if width is None else max(10, min(60, width - len(label)))
        out.append(_Line(label, sparkline(trace.column("loss"), width=room), "", "cyan"))
    if diagnosis.evidence:
        out.append(_Line("evidence:", label_style="bold"))
        for item in diagnosis.evidence:
            out.append(_Line(f"  [{item.rule}] ", item.text, "dim"))
    if diagnosis.located:
        loc = diagnosis.located
        src = loc.get("source") or {}
        parts = [f"{k} {loc[k]}" for k in ("phase", "op", "module") if loc.get(k)]
        if src.get("file"):
            parts.append(f"{shown_path(src['file'])}:{src.get('line')}")
        out.append(_Line("where: ", ", ".join(parts), "bold"))
    if diagnosis.rows:
        out.append(_Line("rows:", label_style="bold"))
        for row in diagnosis.rows[:5]:
            why = f" ({row.get('why')}, {unit} {row.get('step')})"
            out.append(_Line("  ", row_text(row) + why))
        if len(diagnosis.rows) > 5:
            out.append(_Line("  ", f"... {len(diagnosis.rows)} rows in all (see --json)"))
    if diagnosis.contributing:
        out.append(_Line("contributing:", label_style="bold"))
        for note in diagnosis.contributing:
            out.append(_Line("  ", str(note.get("text"))))
    if diagnosis.alternatives:
        alts = ", ".join(f"{a['cause']} ({a['confidence']:.2f})" for a in diagnosis.alternatives)
        out.append(_Line("alternatives: ", alts, "dim"))
    experiment = diagnosis.extra.get("experiment")
    if isinstance(experiment, dict) and experiment.get("text"):
        out.append(_Line("experiment: ", str(experiment["text"]), "bold"))
    for entry in diagnosis.confirmation:
        out.append(_Line(f"confirm [{entry.get('change')}]: ", str(entry.get("text")), "bold"))
    recoveries = list(diagnosis.extra.get("rollbacks") or [])
    for entry in recoveries[:5]:
        out.append(_Line("recovered: ", recovery_text(entry), "bold yellow"))
    if len(recoveries) > 5:
        out.append(_Line("recovered: ", f"... {len(recoveries)} recoveries in all (see --json)"))
    if diagnosis.actions:
        out.append(_Line("what to do:", label_style="bold"))
        for i, action in enumerate(diagnosis.actions, 1):
            out.append(_Line(f"  {i}. ", action))
    if diagnosis.run.get("dir"):
        out.append(_Line("run: ", shown_path(diagnosis.run["dir"]), "dim", "dim"))
    return out


def recovery_text(entry: Mapping[str, Any]) -> str:
    """One recovery of the rollback policy in words: ``update 31: skipped its batch, which holds
    batch row 4 (dataset row 300), column 2 = nan; weights and lr unchanged``; an lr cut says
    why (the detector's words)."""
    what = entry.get("action") or "rolled back"
    why = entry.get("why") if not entry.get("rows") else None
    return f"{_unit_word(entry)} {entry.get('step')}: {what}" + (f" ({why})" if why else "")


def _unit_word(entry: Mapping[str, Any]) -> str:
    return "epoch" if entry.get("granularity") == "epoch" else "update"


def _plain(diagnosis: Diagnosis, trace: Trace | None, width: int | None = None) -> str:
    lines: list[str] = []
    for line in _lines(diagnosis, trace, width):
        lines.extend(wrap(line.text, width, line.label) if line.text else [line.label])
    return "\n".join(lines) + "\n"


def _rich(diagnosis: Diagnosis, trace: Trace | None, file: IO[str], width: int | None) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file, width=width, highlight=False, soft_wrap=True)
    fit = width or console.width
    for line in _lines(diagnosis, trace, fit):
        wrapped = wrap(line.text, fit, line.label) if line.text else [line.label]
        first = Text(line.label, style=line.label_style)
        first.append(wrapped[0][len(line.label):], style=line.text_style)
        console.print(first)
        for more in wrapped[1:]:
            console.print(Text(more, style=line.text_style))


def render(
    diagnosis: Diagnosis,
    trace: Trace | None = None,
    *,
    color: bool = False,
    width: int | None = None,
) -> str:
    """The report as a string (plain text unless ``color``), wrapped to ``width`` columns with
    hanging indents (``None``: paragraphs stay on one line)."""
    if not color:
        return _plain(diagnosis, trace, width)
    buffer = io.StringIO()
    _rich(diagnosis, trace, buffer, width)
    return buffer.getvalue()


def print_report(
    diagnosis: Diagnosis,
    trace: Trace | None = None,
    *,
    file: IO[str] | None = None,
    color: bool | None = None,
) -> None:
    """Print the report; colour only on a terminal (and never when ``NO_COLOR`` is set)."""
    import os

    stream: Any = file if file is not None else sys.stderr
    if color is None:
        color = bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")
    width = columns(stream)
    if color:
        _rich(diagnosis, trace, stream, width)
    else:
        stream.write(_plain(diagnosis, trace, width))
