"""The HTML report: one self-contained page per run, and a small fragment for Jupyter.

::

    from nanscope.report.html import write_report
    write_report(trace, diagnosis, "report.html", png_dir="plots/")

The page holds everything it shows: the styles inline, the plots as ``data:`` images (SVG), no
script at all, and a Content-Security-Policy that forbids fetching anything -- it opens the same
from a laptop, an e-mail attachment or an air-gapped cluster. Order, top to bottom: the verdict and
cause (coloured by verdict), the evidence with its numbers, the actions in order, the per-update
plots (aligned on one x axis, non-finite updates marked where they happened), where it happened
(op, module, source line with the code around it), the bad input rows, lint and data-scan
findings, the learning-rate sweep, rollbacks, messages from the log, and the run's files.

Every string that comes from a log, a script, a data file or a diagnosis goes through
:func:`html.escape` before it reaches the page; the page never contains a ``<script>`` element.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from nanscope import formatting
from nanscope.diagnose.diagnosis import VERDICTS, Diagnosis, set_html_renderer
from nanscope.diagnose.verdict import Verdict, is_failure, is_inconclusive
from nanscope.report import plots as _plots
from nanscope.trace import Trace

__all__ = ["diagnosis_fragment", "render_report", "write_report"]

#: lines of source shown either side of the located line
SNIPPET_RADIUS = 6
#: source files larger than this are not read for the snippet
MAX_SOURCE_BYTES = 4 * 1024 * 1024
#: rows of a table shown before "... N more"
MAX_TABLE_ROWS = 50

_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
    "form-action 'none'"
)


# ---------------------------------------------------------------------------- small helpers


def _e(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def fmt_number(value: Any) -> str:
    """A number as people read it (:func:`nanscope.formatting.number`)."""
    return formatting.number(value, none="")


_CODE = re.compile(r"`([^`\n]+)`")


def _text(value: Any) -> str:
    """Escape prose and show its ``backtick`` spans as code."""
    escaped = _e(value)
    return _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escaped)


def _cell(value: Any) -> str:
    """One table cell's content (escaped): numbers readable, mappings as name/value pairs, a list
    of mappings one per line; never a Python repr."""
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _e(fmt_number(value))
    if isinstance(value, Mapping):
        return _kv(value)
    if isinstance(value, (list, tuple)):
        items = list(value)
        if any(isinstance(v, Mapping) for v in items):
            shown = [f'<div class="item">{_cell(v)}</div>' for v in items[:12]]
            if len(items) > 12:
                shown.append(f'<div class="note">... ({len(items)} in all)</div>')
            return "".join(shown)
        return _e(formatting.value(items))
    if isinstance(value, str):
        return _text(value)
    return _e(formatting.value(value))


def _kv(data: Mapping[str, Any]) -> str:
    parts = []
    for key, value in data.items():
        if value is None:
            continue
        inner = _cell(value)
        if isinstance(value, (Mapping, list, tuple)) and value:
            parts.append(f'<div class="kv"><span class="key">{_e(key)}</span> {inner}</div>')
        else:
            parts.append(f'<span class="pair"><span class="key">{_e(key)}</span> {inner}</span>')
    return " ".join(parts)


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    rows = list(rows)
    out = [f'<table class="{_e(cls)}"><thead><tr>']
    out.extend(f"<th>{_e(h)}</th>" for h in headers)
    out.append("</tr></thead><tbody>")
    for row in rows[:MAX_TABLE_ROWS]:
        out.append("<tr>")
        for value in row:
            klass = ' class="num"' if _is_num(value) else ""
            out.append(f"<td{klass}>{_cell(value)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    if len(rows) > MAX_TABLE_ROWS:
        out.append(f'<p class="note">... {len(rows) - MAX_TABLE_ROWS} more rows not shown</p>')
    return "".join(out)


def _kv_table(rows: Iterable[tuple[str, Any]], cls: str = "") -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_cell(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv {_e(cls)}"><tbody>{body}</tbody></table>'


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{_e(sid)}"><h2>{_e(title)}</h2>{body}</section>'


def _as_dict(diagnosis: Diagnosis | Mapping[str, Any] | None) -> dict[str, Any]:
    if diagnosis is None:
        return {}
    if isinstance(diagnosis, Diagnosis):
        return diagnosis.to_dict()
    if isinstance(diagnosis, Mapping):
        return dict(diagnosis)
    to_dict = getattr(diagnosis, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise TypeError(f"diagnosis must be a Diagnosis or a dict, got {type(diagnosis).__name__}")


def _verdict_class(verdict: Any) -> str:
    return str(verdict) if verdict in VERDICTS else "unknown"


def _unit(d: Mapping[str, Any]) -> str:
    return "epoch" if d.get("granularity") == "epoch" else "update"


def _css() -> str:
    try:
        return (resources.files("nanscope.report") / "assets" / "report.css").read_text("utf-8")
    except (OSError, ModuleNotFoundError):  # pragma: no cover - a broken install
        return "body{font-family:sans-serif;margin:24px}table{border-collapse:collapse}"


def _located_text(located: Mapping[str, Any]) -> str:
    parts = []
    if located.get("phase"):
        parts.append(f"{located['phase']} pass")
    if located.get("op"):
        parts.append(f"op {located['op']}")
    if located.get("module"):
        parts.append(f"in {located['module']}")
    source = located.get("source") or {}
    if isinstance(source, Mapping) and source.get("file"):
        parts.append(f"at {source['file']}:{source.get('line', '?')}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------- sections


#: what the verdict box says instead of the cause ``unknown`` for the verdicts that are no finding
_VERDICT_WORDS = {
    "unobserved": "nothing was watched: no update recorded",
    "interrupted": "stopped from outside before a verdict: no failure found until then",
    "crashed": "the script ended with its own exception: no failure found before it",
}


def _verdict_box(d: Mapping[str, Any]) -> str:
    verdict = d.get("verdict") or "unknown"
    cause = d.get("cause") or "unknown"
    unit = _unit(d)
    bits = []
    if verdict == Verdict.INTERRUPTED and d.get("step") is not None:
        bits.append(f"stopped from outside after {unit} {d['step']}")
    elif verdict == Verdict.CRASHED and d.get("step") is not None:
        bits.append(f"the script raised after {unit} {d['step']}")
    elif d.get("step") is not None and is_failure(verdict):
        bits.append(f"detected at {unit} {d['step']}")
    fn = d.get("first_nonfinite")
    if isinstance(fn, Mapping) and fn.get("step") is not None:
        bits.append(f"first non-finite {fn.get('what', 'value')} at {unit} {fn['step']}")
    if d.get("confidence") is not None and not is_inconclusive(verdict):
        bits.append(f"confidence {fmt_number(d.get('confidence'))}")
    located = d.get("located")
    if isinstance(located, Mapping):
        text = _located_text(located)
        if text:
            bits.append(text)
    summary = d.get("summary") or {}
    line = ""
    if isinstance(summary, Mapping) and summary.get("updates") is not None:
        parts = [f"{summary['updates']} {unit}s recorded"]
        if summary.get("first_loss") is not None:
            parts.append(f"first loss {fmt_number(summary['first_loss'])}")
        if summary.get("best_loss") is not None:
            parts.append(f"best {fmt_number(summary['best_loss'])}")
        if summary.get("last_finite_loss") is not None:
            parts.append(f"last finite {fmt_number(summary['last_finite_loss'])}")
        if summary.get("nonfinite_updates"):
            parts.append(f"{summary['nonfinite_updates']} non-finite")
        line = f'<div class="data">{_e("; ".join(parts))}</div>'
    return (
        f'<div class="verdict verdict-{_verdict_class(verdict)}" id="verdict" '
        f'data-verdict="{_e(verdict)}" data-cause="{_e(cause)}">'
        f'<div class="label">{_e(verdict)}</div>'
        + (
            f'<div class="cause words">{_e(_VERDICT_WORDS[str(verdict)])}</div>'
            if str(verdict) in _VERDICT_WORDS
            else f'<div class="cause">{_e(cause)}</div>'
        )
        + f'<div class="where">{_e(" · ".join(bits))}</div>{line}</div>'
    )


def _evidence(d: Mapping[str, Any]) -> str:
    items = [e for e in d.get("evidence") or [] if isinstance(e, Mapping)]
    if not items:
        return ""
    rows = [(e.get("rule", ""), e.get("text", ""), e.get("data") or {}) for e in items]
    body = _table(("rule", "evidence", "numbers"), rows, "evidence")
    extra = []
    alternatives = [a for a in d.get("alternatives") or [] if isinstance(a, Mapping)]
    if alternatives:
        extra.append("<h3>Alternatives</h3>")
        extra.append(
            _table(
                ("cause", "confidence"),
                [(a.get("cause"), a.get("confidence")) for a in alternatives],
            )
        )
    contributing = [c for c in d.get("contributing") or [] if isinstance(c, Mapping)]
    if contributing:
        extra.append("<h3>Contributing</h3>")
        extra.append(
            _table(
                ("rule", "finding", "numbers"),
                [
                    (c.get("rule", c.get("cause", "")), c.get("text", ""), c.get("data") or {})
                    for c in contributing
                ],
            )
        )
    return _section("evidence", "Evidence", body + "".join(extra))


def _actions(d: Mapping[str, Any]) -> str:
    actions = [a for a in d.get("actions") or [] if a]
    if not actions:
        return ""
    items = "".join(f"<li>{_text(a)}</li>" for a in actions)
    return _section("actions", "What to do, in order", f'<ol class="actions">{items}</ol>')


def _plots_section(
    trace: Trace | None, d: Mapping[str, Any], panels: list[_plots.Panel] | None
) -> str:
    if trace is None or len(trace) == 0:
        return ""
    unit = "epoch" if trace.granularity == "epoch" else "update"
    flat: list[tuple[str, float]] = []
    if panels is None:
        panels = _plots.build_panels(trace, d, flat=flat)
    flat_note = ""
    if flat:
        flat_note = '<p class="data" id="flat">' + _e(
            "; ".join(f"{title} {fmt_number(v)} at every {unit} measured" for title, v in flat)
        ) + " (not plotted: a flat line says nothing more)</p>"
    if len(trace) < _plots.MIN_UPDATES:
        return _section(
            "plots",
            "Per-update plots",
            f'<p class="note">one {unit} recorded: nothing to plot over time</p>',
        )
    if not panels:
        return _section(
            "plots", "Per-update plots", '<p class="note">nothing to plot</p>' + flat_note
        )
    if not _plots.have_matplotlib():
        return _section(
            "plots",
            "Per-update plots",
            '<p class="note">The plots need matplotlib: pip install "nanscope[plots]".</p>',
        )
    out = []
    for panel in panels:
        meta = panel.to_dict()
        marks = ",".join(str(m.step) for m in panel.marks)
        try:
            svg = _plots.render(panel, "svg")
        except Exception as exc:  # a plot must never cost the report
            out.append(
                f'<p class="note">plot {_e(panel.key)} failed: {_e(type(exc).__name__)}: '
                f"{_e(exc)}</p>"
            )
            continue
        data = base64.b64encode(svg).decode("ascii")
        caption = ""
        if panel.marks:
            caption = "non-finite at " + ", ".join(
                f"{unit} {m.step}" + (f"-{m.last}" if m.span > 1 else "") + f" ({m.label})"
                for m in panel.marks[:6]
            )
        out.append(
            f'<figure class="plot" id="plot-{_e(panel.key)}" data-key="{_e(panel.key)}" '
            f'data-marks="{_e(marks)}" data-detect-step="{_e(panel.detect_step or "")}" '
            f'data-plot="{_e(json.dumps(meta, allow_nan=False))}">'
            f'<img id="img-{_e(panel.key)}" alt="{_e(panel.title)}" '
            f'src="data:image/svg+xml;base64,{data}">'
            + (f"<figcaption>{_e(caption)}</figcaption>" if caption else "")
            + "</figure>"
        )
    legend = (
        '<p class="data">Solid red lines: non-finite values, labelled where they happened. '
        "Dashed line: the update where nanscope detected the failure. "
        "All plots share the x axis.</p>"
    )
    return _section(
        "plots",
        "Per-update plots",
        legend + '<div class="plots">' + "".join(out) + "</div>" + flat_note,
    )


def _read_snippet(file: str, line: int) -> list[tuple[int, str]] | None:
    path = Path(file)
    try:
        if not path.is_file() or path.stat().st_size > MAX_SOURCE_BYTES:
            return None
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return None
    lo, hi = max(1, line - SNIPPET_RADIUS), min(len(lines), line + SNIPPET_RADIUS)
    return [(n, lines[n - 1]) for n in range(lo, hi + 1)]


def _source_of(d: Mapping[str, Any]) -> tuple[str, int] | None:
    located = d.get("located")
    if not isinstance(located, Mapping):
        return None
    source = located.get("source")
    if not isinstance(source, Mapping) or not source.get("file"):
        return None
    try:
        line = int(source.get("line") or 0)
    except (TypeError, ValueError):
        line = 0
    return str(source["file"]), line


def _located(d: Mapping[str, Any]) -> str:
    located = d.get("located")
    if not isinstance(located, Mapping) or not located:
        return ""
    rows = []
    for key in ("phase", "op", "module", "dtype"):
        if located.get(key) is not None:
            rows.append((key, located[key]))
    src = _source_of(d)
    if src:
        rows.append(("source", f"{src[0]}:{src[1] or '?'}"))
    for key, value in located.items():
        if key not in ("phase", "op", "module", "dtype", "source") and value is not None:
            rows.append((key, value))
    body = _kv_table(rows, "located")
    if src and src[1]:
        snippet = _read_snippet(*src)
        if snippet:
            lines = []
            for number, text in snippet:
                hit = ' class="hit"' if number == src[1] else ""
                lines.append(f'<span{hit}><span class="ln">{number:>5}</span>{_e(text)}</span>')
            body += f'<pre class="snippet" id="snippet">{"".join(lines)}</pre>'
        else:
            body += '<p class="note">the source file is not readable here</p>'
    return _section("located", "Where it happened", body)


def _confirmation(d: Mapping[str, Any]) -> str:
    """The failing update rerun changed one way at a time (``confirmation``), one row each."""
    entries = [c for c in d.get("confirmation") or [] if isinstance(c, Mapping)]
    if not entries:
        return ""
    rows = []
    for c in entries:
        if not c.get("ran"):
            outcome = "not run"
        elif c.get("finite"):
            outcome = "finite"
        else:
            outcome = "still non-finite"
        rows.append((c.get("change"), outcome, c.get("loss"), c.get("text")))
    table = _table(("rerun with", "outcome", "loss", "what it shows"), rows, "confirmation")
    return _section("confirmation", "The failing update, rerun", table)


def _rows(d: Mapping[str, Any]) -> str:
    rows = [r for r in d.get("rows") or [] if isinstance(r, Mapping)]
    if not rows:
        return ""
    order = ["step", "source", "batch_row", "dataset_row", "column", "value", "z", "why"]
    keys = [k for k in order if any(k in r for r in rows)]
    keys += sorted({k for r in rows for k in r} - set(keys))
    table = _table(keys, [[r.get(k) for k in keys] for r in rows], "rows")
    return _section("rows", "Bad input rows", table)


def _lint_findings(d: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The lint findings the diagnosis holds (``nanscope run`` puts them there); the page runs
    no linter itself."""
    given = d.get("lint")
    if not isinstance(given, list):
        return []
    return [dict(f) for f in given if isinstance(f, Mapping)]


def _lint(d: Mapping[str, Any]) -> str:
    found = _lint_findings(d)
    if not found:
        return ""
    rows = [
        (f.get("code"), f"{f.get('path', '')}:{f.get('line', '')}", f.get("message"), f.get("fix"))
        for f in found
    ]
    return _section(
        "lint",
        "Lint findings near the source line",
        _table(("code", "where", "problem", "fix"), rows, "lint"),
    )


def _scan(d: Mapping[str, Any]) -> str:
    scan = d.get("scan")
    if not scan:
        return ""
    head = ""
    findings: list[Any]
    if isinstance(scan, Mapping):
        findings = list(scan.get("findings") or [])
        bits = []
        for key in ("source", "n_rows", "target"):
            if scan.get(key) is not None:
                bits.append(f"{key} {scan[key]}")
        if bits:
            head = f'<p class="data">{_e("; ".join(bits))}</p>'
    elif isinstance(scan, list):
        findings = scan
    else:
        return _section("scan", "Data scan", f"<p>{_e(scan)}</p>")
    items = [f for f in findings if isinstance(f, Mapping)]
    if not items:
        return _section("scan", "Data scan", head + '<p class="good">no findings</p>')
    rows = [
        (
            f.get("code"),
            f.get("severity"),
            f.get("column"),
            f.get("count"),
            f.get("rows"),
            f.get("message"),
            f.get("fix"),
        )
        for f in items
    ]
    table = _table(
        ("code", "severity", "column", "rows affected", "first rows", "finding", "fix"),
        rows,
        "scan",
    )
    return _section("scan", "Data scan", head + table)


_SWEEP_KEYS = {
    "factor": ("factor",),
    "lr": ("lr", "learning_rate"),
    "outcome": ("outcome", "verdict", "status", "result"),
    "diverged_at": ("diverged_at", "at_update", "stopped_at"),
    "updates": ("updates",),
    "final loss": ("final_loss", "final loss", "last_loss", "loss"),
    "best loss": ("best_loss", "best loss"),
}


def _sweep(d: Mapping[str, Any]) -> str:
    """The tenfold learning-rate sweep (``experiment`` in the diagnosis), one row per factor."""
    experiment = d.get("experiment")
    if not experiment:
        return ""
    head = []
    results: Any = experiment
    recommended = None
    if isinstance(experiment, Mapping):
        results = experiment.get("results") or experiment.get("runs") or []
        recommended = experiment.get("recommended_factor")
        if experiment.get("text"):
            head.append(f"<p>{_e(experiment['text'])}</p>")
        bits = [
            f"{k} {fmt_number(experiment[k])}"
            for k in ("base_lr", "recommended_lr", "updates", "error")
            if experiment.get(k) is not None
        ]
        if bits:
            head.append(f'<p class="data">{_e("; ".join(bits))}</p>')
    items = [r for r in results if isinstance(r, Mapping)] if isinstance(results, list) else []
    if not items:
        body = "".join(head) or '<p class="note">no results</p>'
        return _section("sweep", "Learning-rate sweep", body)
    keys = [k for k, names in _SWEEP_KEYS.items() if any(n in r for r in items for n in names)]
    for must in ("factor", "lr", "outcome", "diverged_at", "final loss"):
        if must not in keys:
            keys.append(must)
    keys = [k for k in _SWEEP_KEYS if k in keys]
    rows = []
    for item in items:
        row: list[Any] = []
        for key in keys:
            names = _SWEEP_KEYS[key]
            row.append(next((item[n] for n in names if item.get(n) is not None), None))
        is_best = recommended is not None and item.get("factor") == recommended
        row.append("use this" if is_best else "")
        rows.append(row)
    table = _table([*keys, ""], rows, "sweep")
    return _section("sweep", "Learning-rate sweep", "".join(head) + table)


def _rollback_rows(trace: Trace | None, d: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """One row per recovery: the diagnosis's list, else what the trace's records say (each
    recovery once, though its record marks it twice: an event and ``extra.rollback``)."""
    from nanscope.report.terminal import recovery_text

    entries = [item for item in d.get("rollbacks") or [] if isinstance(item, Mapping)]
    if not entries and trace is not None:
        for record in trace.records:
            extra = record.get("extra")
            if isinstance(extra, Mapping) and isinstance(extra.get("rollback"), Mapping):
                entries.append({"step": record.get("step"), **extra["rollback"]})
            elif "rollback" in (record.get("events") or []):
                entries.append({"step": record.get("step")})
    return [(e.get("step"), recovery_text(e).split(": ", 1)[-1] if e.get("action") else
             _detail(e)) for e in entries]  # fmt: skip


def _detail(item: Mapping[str, Any]) -> str:
    """A recovery some other writer described: its fields as ``key=value``."""
    text = "; ".join(f"{k}={fmt_number(v)}" for k, v in item.items() if k != "step")
    return text or "rolled back"


def _rollbacks(trace: Trace | None, d: Mapping[str, Any]) -> str:
    rows = _rollback_rows(trace, d)
    if not rows:
        return ""
    return _section(
        "rollbacks", f"Rollbacks ({len(rows)})", _table(("update", "what"), rows, "rollbacks")
    )


def _messages(trace: Trace | None, d: Mapping[str, Any]) -> str:
    messages = [m for m in d.get("messages") or [] if isinstance(m, Mapping)]
    if not messages and trace is not None:
        messages = [m for m in trace.meta.get("messages") or [] if isinstance(m, Mapping)]
    if not messages:
        return ""
    rows = [(m.get("line"), m.get("kind"), m.get("text")) for m in messages]
    return _section(
        "messages", "Messages from the log", _table(("line", "kind", "text"), rows, "messages")
    )


def _run(trace: Trace | None, d: Mapping[str, Any]) -> str:
    rows = []
    run = d.get("run") or {}
    if isinstance(run, Mapping):
        for key in ("id", "dir", "trace", "last_good"):
            if run.get(key):
                rows.append((key, run[key]))
    if trace is not None:
        for key in ("name", "format", "source", "granularity", "policy"):
            if trace.meta.get(key) is not None:
                rows.append((key, trace.meta[key]))
        rows.append(("records", len(trace)))
    if not rows:
        return ""
    return _section("run", "Run", _kv_table(rows, "run"))


def _script_name(trace: Trace | None, d: Mapping[str, Any]) -> str | None:
    """The run's script (``train.py``, ``-m pkg.train``) from the diagnosis or the trace meta."""
    run = d.get("run") or {}
    meta: Mapping[str, Any] = trace.meta if trace is not None else {}
    for holder in (run, meta):
        if isinstance(holder, Mapping):
            for key in ("script", "module"):
                value = holder.get(key)
                if isinstance(value, str) and value:
                    return os.path.basename(value) if key == "script" else f"-m {value}"
    argv = meta.get("argv")
    if isinstance(argv, list) and argv and isinstance(argv[0], str):
        first = argv[0]
        if first.endswith(".py") and os.path.basename(first) not in ("pytest", "__main__.py"):
            return os.path.basename(first)
    return None


def _title(trace: Trace | None, d: Mapping[str, Any]) -> str:
    name = _script_name(trace, d)
    if name is None:
        run = d.get("run") or {}
        meta: Mapping[str, Any] = trace.meta if trace is not None else {}
        name = meta.get("run_id") or (run.get("id") if isinstance(run, Mapping) else None)
    return f"nanscope report: {name}" if name else "nanscope report"


# ---------------------------------------------------------------------------- public API


def render_report(
    trace: Trace | None,
    diagnosis: Diagnosis | Mapping[str, Any] | None,
    *,
    title: str | None = None,
    plots: bool = True,
) -> str:
    """The whole page as one string (self-contained HTML, no script, nothing fetched).

    ``plots=False`` leaves the pictures out (a quick page without matplotlib time).
    """
    d = _as_dict(diagnosis)
    page_title = title or _title(trace, d)
    from nanscope._version import __version__

    meta_bits = [f"nanscope {__version__}"]
    if trace is not None:
        unit = "epochs" if trace.granularity == "epoch" else "updates"
        meta_bits.append(f"{len(trace)} {unit}")
        if trace.meta.get("format"):
            meta_bits.append(f"read from a {trace.meta['format']} log")
    body = [
        f"<header><h1>{_e(page_title)}</h1>",
        '<p class="meta">' + "".join(f"<span>{_e(b)}</span>" for b in meta_bits) + "</p>",
        _verdict_box(d),
        "</header>",
        _evidence(d),
        _actions(d),
        _plots_section(trace, d, None) if plots else "",
        _located(d),
        _confirmation(d),
        _rows(d),
        _lint(d),
        _scan(d),
        _sweep(d),
        _rollbacks(trace, d),
        _messages(trace, d),
        _run(trace, d),
        "<footer>Written by nanscope. This page is self-contained: it loads nothing from anywhere."
        "</footer>",
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_e(_CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light">'
        f"<title>{_e(page_title)}</title>"
        f"<style>{_css()}</style></head>\n"
        "<body><main>" + "\n".join(part for part in body if part) + "</main></body></html>\n"
    )


def write_report(
    trace: Trace | None,
    diagnosis: Diagnosis | Mapping[str, Any] | None,
    path: str | Path,
    png_dir: str | Path | None = None,
) -> Path:
    """Write the page to ``path`` (parent folders created); with ``png_dir`` also one PNG per plot.

    The page shows what it is given and runs nothing: read a file with
    :func:`nanscope.loading.load` and diagnose it with :func:`nanscope.diagnose` first. Returns the
    path written.
    """
    if trace is not None and not isinstance(trace, Trace):
        raise TypeError(
            f"write_report takes a Trace, got {type(trace).__name__}: read files with "
            "nanscope.loading.load(path)"
        )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(trace, diagnosis), encoding="utf-8")
    if png_dir is not None and trace is not None:
        _plots.write_pngs(_plots.build_panels(trace, _as_dict(diagnosis)), png_dir)
    return out


_FRAGMENT_COLORS = {
    "healthy": ("#eaf6ec", "#2ca02c"),
    "diverging": ("#fff4e0", "#e08a00"),
    "nonfinite": ("#fdecec", "#d62728"),
    "suspect": ("#f2ecf8", "#7b4fb3"),
    "unobserved": ("#eef1f5", "#56657a"),
    "interrupted": ("#fff8d6", "#b08800"),
    "crashed": ("#f6eeec", "#8c564b"),
}


def diagnosis_fragment(diagnosis: Diagnosis | Mapping[str, Any]) -> str:
    """A small HTML block for Jupyter (``Diagnosis._repr_html_``): verdict, evidence, actions.

    Inline styles only (a ``<style>`` element would restyle the whole notebook), no plots.
    """
    d = _as_dict(diagnosis)
    verdict = d.get("verdict") or "unknown"
    bg, border = _FRAGMENT_COLORS.get(str(verdict), ("#f6f7f9", "#888888"))
    unit = _unit(d)
    head = f"<b>{_e(verdict)}</b>: <code>{_e(d.get('cause') or 'unknown')}</code>"
    if d.get("step") is not None and verdict != Verdict.HEALTHY:
        head += f" at {unit} {_e(d['step'])}"
    if d.get("confidence") is not None:
        head += f" (confidence {_e(fmt_number(d['confidence']))})"
    parts = [
        f'<div class="nanscope-diagnosis" data-verdict="{_e(verdict)}" '
        f'style="border-left:6px solid {border};background:{bg};padding:8px 12px;'
        f'border-radius:4px;font-family:sans-serif;font-size:13px;line-height:1.4">',
        f"<div>{head}</div>",
    ]
    evidence = [e for e in d.get("evidence") or [] if isinstance(e, Mapping)]
    if evidence:
        items = "".join(f"<li>{_text(e.get('text', ''))}</li>" for e in evidence[:5])
        parts.append(
            f'<div style="margin-top:4px">evidence:</div><ul style="margin:2px 0">{items}</ul>'
        )
    located = d.get("located")
    if isinstance(located, Mapping):
        text = _located_text(located)
        if text:
            parts.append(f"<div>where: <code>{_e(text)}</code></div>")
    actions = [a for a in d.get("actions") or [] if a]
    if actions:
        items = "".join(f"<li>{_text(a)}</li>" for a in actions)
        parts.append(
            f'<div style="margin-top:4px">do, in order:</div><ol style="margin:2px 0">{items}</ol>'
        )
    parts.append("</div>")
    return "".join(parts)


set_html_renderer(diagnosis_fragment)
