"""The terminal report: verdict, cause, update, evidence table, a loss sparkline, actions.

Rendered with rich when writing to a terminal; plain text (same content, no colour) otherwise or
with ``color=False``. :func:`render` returns the text so tests can compare it.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.formatting import number as num
from nanscope.formatting import row as row_text
from nanscope.trace import Trace

__all__ = ["print_report", "render", "sparkline"]

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


def _plain(diagnosis: Diagnosis, trace: Trace | None) -> str:
    lines = [f"nanscope: {diagnosis.headline()}"]
    if diagnosis.first_nonfinite:
        fn = diagnosis.first_nonfinite
        lines.append(f"first non-finite: {fn.get('what')} at {_unit(diagnosis)} {fn.get('step')}")
    if trace is not None and len(trace):
        lines.append(f"loss per {_unit(diagnosis)}: {sparkline(trace.column('loss'))}")
    if diagnosis.evidence:
        lines.append("evidence:")
        for item in diagnosis.evidence:
            lines.append(f"  [{item.rule}] {item.text}")
    if diagnosis.located:
        loc = diagnosis.located
        src = loc.get("source") or {}
        where = ", ".join(
            f"{k} {v}" for k, v in (("phase", loc.get("phase")), ("op", loc.get("op")),
                                    ("module", loc.get("module"))) if v
        )  # fmt: skip
        if src.get("file"):
            where += f", {src['file']}:{src.get('line')}"
        lines.append(f"where: {where}")
    if diagnosis.rows:
        lines.append("rows:")
        for row in diagnosis.rows[:5]:
            lines.append(f"  {row_text(row)} ({row.get('why')}, update {row.get('step')})")
    if diagnosis.contributing:
        lines.append("contributing:")
        for note in diagnosis.contributing:
            lines.append(f"  {note.get('text')}")
    if diagnosis.alternatives:
        alts = ", ".join(f"{a['cause']} ({a['confidence']:.2f})" for a in diagnosis.alternatives)
        lines.append(f"alternatives: {alts}")
    experiment = diagnosis.extra.get("experiment")
    if isinstance(experiment, dict) and experiment.get("text"):
        lines.append(f"experiment: {experiment['text']}")
    for entry in diagnosis.confirmation:
        lines.append(f"confirm [{entry.get('change')}]: {entry.get('text')}")
    for entry in diagnosis.extra.get("rollbacks") or []:
        lines.append(f"rolled back: update {entry.get('step')}: {entry.get('why')}")
    if diagnosis.actions:
        lines.append("what to do:")
        for i, action in enumerate(diagnosis.actions, 1):
            lines.append(f"  {i}. {action}")
    if diagnosis.run.get("dir"):
        lines.append(f"run: {diagnosis.run['dir']}")
    return "\n".join(lines) + "\n"


def _rich(diagnosis: Diagnosis, trace: Trace | None, file: IO[str], width: int | None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file, width=width, highlight=False, soft_wrap=False)
    style = _VERDICT_STYLE.get(diagnosis.verdict, "bold")
    title = Text("nanscope  ", style="bold")
    title.append(diagnosis.headline(), style=style)
    console.print(title)
    if diagnosis.first_nonfinite:
        fn = diagnosis.first_nonfinite
        console.print(
            f"first non-finite: [bold]{fn.get('what')}[/] at {_unit(diagnosis)} {fn.get('step')}"
        )
    if trace is not None and len(trace):
        line = Text(f"loss per {_unit(diagnosis)}  ")
        for ch in sparkline(trace.column("loss")):
            line.append(ch, style="red" if ch == "×" else "cyan")
        console.print(line)
    if diagnosis.evidence:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("rule", style="dim", no_wrap=True)
        table.add_column("evidence")
        for item in diagnosis.evidence:
            table.add_row(item.rule, Text(item.text))
        console.print(table)
    if diagnosis.located:
        loc = diagnosis.located
        src = loc.get("source") or {}
        where = Text("where: ", style="bold")
        for key in ("phase", "op", "module"):
            if loc.get(key):
                where.append(f"{key} ", style="dim")
                where.append(f"{loc[key]}  ")
        if src.get("file"):
            where.append(f"{src['file']}:{src.get('line')}")
        console.print(where)
    if diagnosis.rows:
        table = Table(show_header=True, header_style="bold", box=None, title=None)
        for col in ("update", "source", "batch row", "dataset row", "column", "value", "why"):
            table.add_column(col)
        for row in diagnosis.rows[:8]:
            table.add_row(
                str(row.get("step", "")),
                str(row.get("source", "")),
                str(row.get("batch_row", "")),
                str(row.get("dataset_row", "")),
                str(row.get("column", "")),
                num(row.get("value")),
                str(row.get("why", "")) + (f" z={num(row['z'])}" if row.get("z") else ""),
            )
        console.print(table)
    for note in diagnosis.contributing:
        console.print(Text("contributing: ", style="bold") + Text(str(note.get("text"))))
    if diagnosis.alternatives:
        alts = ", ".join(f"{a['cause']} ({a['confidence']:.2f})" for a in diagnosis.alternatives)
        console.print(Text("alternatives: ", style="dim") + Text(alts))
    experiment = diagnosis.extra.get("experiment")
    if isinstance(experiment, dict) and experiment.get("text"):
        console.print(Text("experiment: ", style="bold") + Text(str(experiment["text"])))
    for entry in diagnosis.confirmation:
        label = Text(f"confirm [{entry.get('change')}]: ", style="bold")
        console.print(label + Text(str(entry.get("text"))))
    for entry in diagnosis.extra.get("rollbacks") or []:
        what = f"update {entry.get('step')}: {entry.get('why')}"
        console.print(Text("rolled back: ", style="bold yellow") + Text(what))
    if diagnosis.actions:
        console.print(Text("what to do", style="bold"))
        for i, action in enumerate(diagnosis.actions, 1):
            console.print(Text(f"  {i}. ") + Text(action))
    if diagnosis.run.get("dir"):
        console.print(Text(f"run: {diagnosis.run['dir']}", style="dim"))


def render(
    diagnosis: Diagnosis, trace: Trace | None = None, *, color: bool = False, width: int = 100
) -> str:
    """The report as a string (plain text unless ``color``)."""
    if not color:
        return _plain(diagnosis, trace)
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
    if color:
        _rich(diagnosis, trace, stream, None)
    else:
        stream.write(_plain(diagnosis, trace))
