"""Per-update plots of a trace: the data of each panel, and its picture through matplotlib.

Two layers, so the HTML page and the tests can reason about a plot without pixels:

* :func:`build_panels` turns a trace (and its diagnosis) into :class:`Panel` objects: plain numbers
  per line, the non-finite updates to mark (:class:`Mark`), the detection step, the x range shared
  by every panel. No matplotlib here.
* :func:`render` draws one panel to SVG or PNG bytes. matplotlib is imported only inside it, on an
  ``Agg`` canvas (no pyplot, no global backend switch), so importing this module never needs
  matplotlib.

Every panel of one report uses the same figure width, the same axes box (:data:`AXES_BOX`) and the
same x limits, so stacked vertically the panels line up update for update: the loss spike sits
above the gradient jump that caused it. :func:`x_to_pixel` maps an update to its pixel column in a
rendered image, which is what the tests use to check that a marker is drawn where the failure
happened.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.diagnose.verdict import is_failure
from nanscope.trace import Trace

__all__ = [
    "AXES_BOX",
    "FIG_SIZE",
    "Line",
    "Mark",
    "Panel",
    "build_panels",
    "have_matplotlib",
    "render",
    "write_pngs",
    "x_to_pixel",
]

#: figure size in inches (width, height) and the dpi of the PNG pictures; the page shows each
#: picture as wide as its column
FIG_SIZE: tuple[float, float] = (12.0, 2.4)
PNG_DPI = 100
#: the axes box in figure fractions (left, bottom, right, top), the same for every panel; the
#: strip on the right holds the legend of the panels with several lines
AXES_BOX: tuple[float, float, float, float] = (0.065, 0.18, 0.86, 0.87)
#: fewer updates than this make no picture (one point on empty axes says nothing)
MIN_UPDATES = 2

#: the colour of non-finite markers (the tests look for it in the pixels)
NONFINITE_COLOR = "#d62728"
#: colour of the detection line, by verdict
VERDICT_COLORS: Mapping[str, str] = {
    "healthy": "#2ca02c",
    "diverging": "#e08a00",
    "nonfinite": "#d62728",
    "suspect": "#7b4fb3",
    "unobserved": "#56657a",
    "interrupted": "#b08800",
    "crashed": "#8c564b",
}
#: most per-layer gradient lines drawn (the largest ones); the rest are counted in the title
MAX_LAYERS = 8
#: longer series are reduced to a min/max envelope of this many buckets before drawing
MAX_POINTS = 4000
#: a positive series goes on a log axis when it spans more than this many powers of ten (below
#: that a log axis only shows odd minor ticks and the picture is the same)
LOG_DECADES = 0.5
#: at most this many non-finite runs get their own labelled line
MAX_MARKS = 12


@dataclass(frozen=True)
class Mark:
    """A non-finite update to mark: where (``step``), what it was (``label``: nan, inf, -inf)."""

    step: int
    label: str
    #: how many consecutive updates were non-finite from here on (1 = just this one)
    span: int = 1
    #: the last update of that run of non-finite updates
    last: int | None = None


@dataclass
class Line:
    label: str
    x: np.ndarray
    y: np.ndarray
    style: str = "-"
    width: float = 1.6
    color: str | None = None


@dataclass
class Panel:
    """One plot: its lines, scale, and the updates to mark."""

    key: str  # file stem and element id: loss, grad_norm, update_ratio, flip_frac, lr
    title: str
    ylabel: str
    lines: list[Line]
    log: bool
    xlim: tuple[float, float]
    xlabel: str = "update"
    marks: list[Mark] = field(default_factory=list)
    label_marks: bool = False
    detect_step: int | None = None
    detect_color: str = "#444444"
    ylim: tuple[float, float] | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The metadata the HTML page exposes (data attributes) and tests read."""
        return {
            "key": self.key,
            "title": self.title,
            "log": self.log,
            "xlim": list(self.xlim),
            "axes": list(AXES_BOX),
            "marks": [{"step": m.step, "label": m.label, "span": m.span} for m in self.marks],
            "detect_step": self.detect_step,
            "lines": [ln.label for ln in self.lines],
        }


# ---------------------------------------------------------------------------- building the data


def _nonfinite_label(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def _kind(norm: float, recorded: bool) -> str:
    """What a recorded norm says of the values behind it: ``nan`` or ``inf``; ``non-finite`` when
    no norm was recorded or it is finite (the values were counted, not summed)."""
    if not recorded or math.isfinite(norm):
        return "non-finite"
    return "nan" if math.isnan(norm) else "inf"


def _runs(steps: np.ndarray, bad: np.ndarray, labels: Sequence[str]) -> list[Mark]:
    """Group consecutive bad updates of the same kind into marks (an inf followed by NaNs is
    two marks, each labelled by what it is)."""
    marks: list[Mark] = []
    idx = np.flatnonzero(bad)
    if idx.size == 0:
        return marks
    start = prev = int(idx[0])
    for i in [int(v) for v in idx[1:]] + [-1]:
        if i == prev + 1 and labels[i] == labels[start]:
            prev = i
            continue
        marks.append(
            Mark(int(steps[start]), labels[start], span=prev - start + 1, last=int(steps[prev]))
        )
        if i < 0:
            break
        start = prev = i
    return marks


def loss_marks(trace: Trace) -> list[Mark]:
    """The updates where the loss, the gradient or the weights went non-finite, in runs.

    A non-finite loss is labelled by its value (``nan``, ``inf``, ``-inf``); a loss a logger zeroed
    to hide a NaN is ``nan (hidden)``; a finite loss with a non-finite gradient or weight is
    ``nan grad`` / ``inf grad`` / ``nan weights`` / ``inf weights`` as its recorded norm says
    (``non-finite ...`` when no norm tells which).
    """
    n = len(trace)
    if n == 0:
        return []
    steps = trace.steps()
    loss = trace.column("loss")
    grad = trace.column("grad_norm")
    weights = trace.column("weight_norm")
    grad_seen, weights_seen = trace.present("grad_norm"), trace.present("weight_norm")
    loss_bad = (trace.present("loss") & ~np.isfinite(loss)) | (trace.nonfinite("loss") > 0)
    grad_bad = trace.nonfinite("grads") > 0
    params_bad = trace.nonfinite("params") > 0
    filtered = np.array(["loss_nan_filtered" in (r.get("events") or []) for r in trace.records])
    bad = loss_bad | grad_bad | params_bad | filtered
    labels = []
    for i in range(n):
        if not np.isfinite(loss[i]) and trace.present("loss")[i]:
            labels.append(_nonfinite_label(float(loss[i])))
        elif loss_bad[i]:
            labels.append("non-finite")  # counted elements behind a finite mean: which, unknown
        elif filtered[i]:
            labels.append("nan (hidden)")
        elif grad_bad[i]:
            labels.append(_kind(float(grad[i]), bool(grad_seen[i])) + " grad")
        else:
            labels.append(_kind(float(weights[i]), bool(weights_seen[i])) + " weights")
    return _runs(steps, bad, labels)


def _positive(y: np.ndarray) -> np.ndarray:
    """``y`` where it is finite and > 0, NaN elsewhere (what a log axis can show)."""
    out = np.array(y, dtype=np.float64, copy=True)
    out[~np.isfinite(out) | (out <= 0)] = np.nan
    return out


def _finite(y: np.ndarray) -> np.ndarray:
    out = np.array(y, dtype=np.float64, copy=True)
    out[~np.isfinite(out)] = np.nan
    return out


def _has_values(y: np.ndarray) -> bool:
    return bool(np.isfinite(y).any())


def _log_ok(y: np.ndarray, decades: float = 1.0) -> bool:
    """A log axis suits a positive series that spans more than ``decades`` powers of ten."""
    finite = y[np.isfinite(y)]
    if not finite.size or not bool((finite > 0).all()):
        return False
    return float(finite.max()) > 10**decades * float(finite.min())


def _reduce(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """A min/max envelope of a long series (keeps spikes, gaps stay gaps)."""
    n = x.size
    if n <= limit:
        return x, y
    buckets = limit // 2
    edges = np.linspace(0, n, buckets + 1).astype(int)
    xs: list[float] = []
    ys: list[float] = []
    for a, b in itertools.pairwise(edges):
        if b <= a:
            continue
        seg = y[a:b]
        finite = np.isfinite(seg)
        if not finite.any():
            xs.append(float(x[a]))
            ys.append(math.nan)
            continue
        lo = a + int(np.nanargmin(np.where(finite, seg, np.nan)))
        hi = a + int(np.nanargmax(np.where(finite, seg, np.nan)))
        for j in sorted({lo, hi}):
            xs.append(float(x[j]))
            ys.append(float(y[j]))
    return np.array(xs), np.array(ys)


def _flat_value(lines: Sequence[Line]) -> float | None:
    """The one value every line of a panel holds where it was measured (a constant learning
    rate, a sign-flip fraction that stayed 0), else None. A single measured point is flat too:
    one dot on empty axes says nothing a number does not."""
    values = np.concatenate([ln.y[np.isfinite(ln.y)] for ln in lines]) if lines else np.array([])
    if values.size == 0:
        return None
    lo, hi = float(values.min()), float(values.max())
    return lo if hi - lo <= 1e-12 * max(abs(lo), abs(hi), 1e-300) else None


def _measured(steps: np.ndarray, values: np.ndarray, seen: np.ndarray) -> tuple[Any, Any]:
    """The updates where a series was measured, and its values there: a measure taken on a
    schedule (every 64 updates, or on rises only) is drawn through its points, not as dots lost
    between gaps."""
    return steps[seen], values[seen]


def build_panels(
    trace: Trace, diagnosis: Any = None, *, flat: list[tuple[str, float]] | None = None
) -> list[Panel]:
    """The panels a trace supports, in report order: loss, gradient norms, update/weight ratio,
    sign-flip fraction, learning rate.

    Only panels that say something are kept: none for a trace with fewer than
    :data:`MIN_UPDATES` updates, none for a series with no value, and none (besides the loss) for
    a series that holds one value throughout, such as a constant learning rate; those are
    appended to ``flat`` as ``(title, value)`` when a list is given, for a one-line note."""
    if len(trace) < MIN_UPDATES:
        return []
    steps = trace.steps().astype(np.float64)
    common = _frame(trace, steps, diagnosis)
    panels = [
        _loss_panel(trace, steps, common),
        _grad_panel(trace, steps, common),
        _ratio_panel(trace, steps, common),
        _flip_panel(trace, steps, common),
        _lr_panel(trace, steps, common),
    ]
    kept = []
    for panel in panels:
        if panel is None:
            continue
        value = None if panel.key == "loss" else _flat_value(panel.lines)
        if value is None:
            kept.append(panel)
        elif flat is not None:
            flat.append((panel.title.replace(" (log scale)", ""), value))
    return kept


def _frame(trace: Trace, steps: np.ndarray, diagnosis: Any) -> dict[str, Any]:
    """What every panel shares: the x range and label, the non-finite marks, the detection."""
    lo, hi = float(steps.min()), float(steps.max())
    pad = max(0.5, (hi - lo) * 0.02)
    verdict = str(_get(diagnosis, "verdict") or "")
    detect = _get(diagnosis, "step")
    failed = is_failure(verdict)
    return {
        "xlim": (lo - pad, hi + pad),
        "xlabel": "epoch" if trace.granularity == "epoch" else "update",
        "marks": loss_marks(trace),
        "detect_step": int(detect) if isinstance(detect, (int, float)) and failed else None,
        "detect_color": VERDICT_COLORS.get(verdict, "#444444"),
    }


def _loss_panel(trace: Trace, steps: np.ndarray, common: dict[str, Any]) -> Panel | None:
    if not trace.has("loss"):
        return None
    lines = [Line("loss", steps, trace.column("loss"))]
    val = trace.column("val_loss")
    if _has_values(val):
        lines.append(Line("val_loss", steps, val, style="--", width=1.2))
    log = all(_log_ok(ln.y, LOG_DECADES) for ln in lines)
    for ln in lines:
        ln.y = _positive(ln.y) if log else _finite(ln.y)
    return Panel(
        "loss",
        "loss" + (" (log scale)" if log else ""),
        "loss",
        lines,
        log,
        label_marks=True,
        **common,
    )


def _grad_panel(trace: Trace, steps: np.ndarray, common: dict[str, Any]) -> Panel | None:
    """The global gradient norm and the :data:`MAX_LAYERS` largest layers' norms."""
    grad_lines: list[Line] = []
    if trace.has("grad_norm"):
        grad_lines.append(
            Line("global", steps, _positive(trace.column("grad_norm")), width=2.0, color="#222222")
        )
    note = ""
    if trace.has("grad_norms"):
        series = _layer_norms(trace, steps)
        ranked = sorted(series, key=lambda k: -np.nanmax(np.append(series[k][1], 0.0)))
        for name in ranked[:MAX_LAYERS]:
            xs, ys = series[name]
            grad_lines.append(Line(str(name), xs, ys, width=1.1))
        if len(ranked) > MAX_LAYERS:
            note = f"{MAX_LAYERS} largest of {len(ranked)} layers shown"
    if not (grad_lines and any(_has_values(ln.y) for ln in grad_lines)):
        return None
    log = _log_ok(np.concatenate([ln.y for ln in grad_lines]), LOG_DECADES)
    return Panel(
        "grad_norm",
        "gradient norm" + (" (log scale)" if log else ""),
        "L2 norm",
        grad_lines,
        log,
        note=note,
        **common,
    )


def _layer_norms(trace: Trace, steps: np.ndarray) -> dict[str, tuple[Any, Any]]:
    """Each layer's gradient norm, at the updates that measured it, in the order first seen."""
    n = len(trace)
    names: list[str] = []
    for record in trace.records:
        for name in record.get("grad_norms") or {}:
            if name not in names:
                names.append(name)
    series = {}
    for name in names:
        ys = np.full(n, np.nan)
        seen = np.zeros(n, dtype=bool)
        for i, record in enumerate(trace.records):
            value = (record.get("grad_norms") or {}).get(name)
            if isinstance(value, (int, float)):
                ys[i] = float(value)
                seen[i] = True
        series[name] = _measured(steps, _positive(ys), seen)
    return series


def _ratio_panel(trace: Trace, steps: np.ndarray, common: dict[str, Any]) -> Panel | None:
    if not (trace.has("update_norm") and trace.has("weight_norm")):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = trace.column("update_norm") / trace.column("weight_norm")
    ratio = _positive(ratio)
    if not _has_values(ratio):
        return None
    log = _log_ok(ratio, LOG_DECADES)
    both = trace.present("update_norm") & trace.present("weight_norm")
    xs, ys = _measured(steps, ratio, both)
    return Panel(
        "update_ratio",
        "update / weight norm" + (" (log scale)" if log else ""),
        "ratio",
        [Line("update_norm / weight_norm", xs, ys)],
        log,
        **common,
    )


def _flip_panel(trace: Trace, steps: np.ndarray, common: dict[str, Any]) -> Panel | None:
    flip = _finite(trace.column("flip_frac"))
    if not _has_values(flip):
        return None
    xs, ys = _measured(steps, flip, trace.present("flip_frac"))
    return Panel(
        "flip_frac",
        "fraction of weights that flipped sign",
        "fraction",
        [Line("flip_frac", xs, ys)],
        False,
        ylim=(-0.03, 1.03),
        **common,
    )


def _lr_panel(trace: Trace, steps: np.ndarray, common: dict[str, Any]) -> Panel | None:
    lr = trace.column("lr")
    if not _has_values(lr):
        return None
    log = _log_ok(lr)
    return Panel(
        "lr",
        "learning rate" + (" (log scale)" if log else ""),
        "lr",
        [Line("lr", steps, _positive(lr) if log else _finite(lr))],
        log,
        **common,
    )


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


# ---------------------------------------------------------------------------- drawing


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def render(panel: Panel, fmt: str = "svg") -> bytes:
    """Draw one panel; ``fmt`` is ``"svg"`` or ``"png"``. Needs matplotlib."""
    if fmt not in ("svg", "png"):
        raise ValueError(f"fmt must be 'svg' or 'png', got {fmt!r}")
    from io import BytesIO

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    # a bare Figure on an Agg canvas: no pyplot, no global backend switch (safe inside Jupyter)
    fig = Figure(figsize=FIG_SIZE, dpi=PNG_DPI)
    FigureCanvasAgg(fig)
    left, bottom, right, top = AXES_BOX
    ax = fig.add_axes((left, bottom, right - left, top - bottom))
    for line in panel.lines:
        x, y = _reduce(line.x, line.y)
        ax.plot(
            x,
            y,
            line.style,
            lw=line.width,
            color=line.color,
            label=line.label,
            marker="o" if x.size <= 60 else None,
            ms=2.5,
        )
    if panel.log:
        ax.set_yscale("log")
    ax.minorticks_off()  # the major grid reads well enough, and minor ticks cost half the time
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    ax.set_xlim(*panel.xlim)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # updates are whole numbers
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    title = panel.title + (f"  ({panel.note})" if panel.note else "")
    ax.set_title(title, loc="left", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    transform = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for k, mark in enumerate(panel.marks):
        if mark.span > 1 and mark.last is not None:
            ax.axvspan(mark.step, mark.last, color=NONFINITE_COLOR, alpha=0.08, lw=0)
        if k >= MAX_MARKS:
            continue
        ax.axvline(mark.step, color=NONFINITE_COLOR, lw=1.8, zorder=5)
        if panel.label_marks:
            text = mark.label + (f" x{mark.span}" if mark.span > 1 else "")
            ax.text(
                mark.step,
                0.97,
                f" {text} @ {mark.step}",
                transform=transform,
                color=NONFINITE_COLOR,
                fontsize=8,
                va="top",
                ha="left",
                fontweight="bold",
                zorder=6,
            )
    if panel.detect_step is not None:
        ax.axvline(panel.detect_step, color=panel.detect_color, lw=1.4, ls="--", zorder=4)
        if panel.label_marks:
            ax.text(
                panel.detect_step,
                0.03,
                f"detected @ {panel.detect_step} ",
                transform=transform,
                color=panel.detect_color,
                fontsize=8,
                va="bottom",
                ha="right",
                zorder=6,
            )
    if len(panel.lines) > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    buffer = BytesIO()
    if fmt == "svg":
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    else:
        fig.savefig(buffer, format="png", dpi=PNG_DPI)
    return buffer.getvalue()


def x_to_pixel(panel: Panel, step: float, width_px: int) -> int:
    """The pixel column of update ``step`` in a rendered image ``width_px`` wide."""
    left, _, right, _ = AXES_BOX
    x0, x1 = panel.xlim
    frac = left + (float(step) - x0) / (x1 - x0) * (right - left)
    return round(frac * width_px)


def write_pngs(panels: Sequence[Panel], directory: str | Path) -> list[Path]:
    """Write each panel as ``<key>.png`` in ``directory`` (created); returns the paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for panel in panels:
        path = out / f"{panel.key}.png"
        path.write_bytes(render(panel, "png"))
        paths.append(path)
    return paths
