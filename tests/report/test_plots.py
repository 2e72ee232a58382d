"""The plots: the failure is drawn where it happened, panels line up, scales follow the data."""

from __future__ import annotations

import io
import math
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image

import nanscope
from nanscope.report import plots
from nanscope.trace import Trace

RED = (214, 39, 40)  # plots.NONFINITE_COLOR


def _red_rows(image: Image.Image, column: int) -> int:
    """How many pixels of ``column`` (or its neighbours) are the non-finite red."""
    pixels = np.asarray(image.convert("RGB")).astype(int)
    band = pixels[:, max(0, column - 1) : column + 2]
    close = (np.abs(band - np.array(RED)).sum(axis=2) < 60).any(axis=1)
    return int(close.sum())


def _panel(panels: list[plots.Panel], key: str) -> plots.Panel:
    return next(p for p in panels if p.key == key)


def test_nan_marker_is_drawn_at_the_failing_update(nan_run: Path) -> None:
    trace = nanscope.read_trace(nan_run)
    panel = _panel(plots.build_panels(trace, nanscope.diagnose(trace)), "loss")
    assert [(m.step, m.label, m.span) for m in panel.marks] == [(31, "nan", 10)]
    image = Image.open(io.BytesIO(plots.render(panel, "png")))
    width, height = image.size
    axes_height = (plots.AXES_BOX[3] - plots.AXES_BOX[1]) * height
    # a red vertical line over (almost) the whole axes height at update 31 ...
    assert _red_rows(image, plots.x_to_pixel(panel, 31, width)) > 0.8 * axes_height
    # ... and none where the fit was still fine
    for step in (5, 15, 25):
        assert _red_rows(image, plots.x_to_pixel(panel, step, width)) < 0.1 * axes_height


def test_every_panel_shares_the_x_axis_and_the_marks(nan_run: Path) -> None:
    flat: list[tuple[str, float]] = []
    panels = plots.build_panels(nanscope.read_trace(nan_run), flat=flat)
    # the learning rate was 0.05 throughout and no weight ever flipped sign: a flat line says
    # nothing, so no panel, a note
    assert [p.key for p in panels] == ["loss", "grad_norm", "update_ratio"]
    assert flat == [("fraction of weights that flipped sign", 0.0), ("learning rate", 0.05)]
    assert len({p.xlim for p in panels}) == 1
    assert all([m.step for m in p.marks] == [31] for p in panels)
    sizes = {Image.open(io.BytesIO(plots.render(p, "png"))).size for p in panels[:2]}
    assert len(sizes) == 1  # same pixels per update in every picture


def test_labels_for_inf_and_gradients_and_log_scale() -> None:
    records = [{"step": i, "loss": 10.0 ** (i / 2), "grad_norm": 1.0} for i in range(1, 13)]
    records[6]["grad_norm"] = float("nan")
    records[9]["loss"] = math.inf
    records[10]["loss"] = -math.inf
    records[11]["loss"] = math.nan
    trace = Trace(records)
    loss = _panel(plots.build_panels(trace), "loss")
    assert loss.log  # positive and spanning decades
    # each non-finite value labelled as what it is, never a NaN under an inf's label
    assert [(m.step, m.label, m.span) for m in loss.marks] == [
        (7, "nan grad", 1), (10, "inf", 1), (11, "-inf", 1), (12, "nan", 1)]
    assert "log scale" in loss.title


def test_small_range_and_negative_loss_stay_linear() -> None:
    flat = Trace([{"step": i, "loss": 1.0 + 0.01 * i, "lr": 0.1 - 0.001 * i} for i in range(1, 30)])
    assert not _panel(plots.build_panels(flat), "loss").log
    assert not _panel(plots.build_panels(flat), "lr").log
    negative = Trace([{"step": i, "loss": -(10.0**i)} for i in range(1, 6)])
    assert not _panel(plots.build_panels(negative), "loss").log


def test_long_runs_are_reduced_but_keep_the_spike() -> None:
    n = 20000
    records = [{"step": i, "loss": 1.0} for i in range(1, n + 1)]
    records[12345]["loss"] = 1e6
    panel = _panel(plots.build_panels(Trace(records)), "loss")
    x, y = plots._reduce(panel.lines[0].x, panel.lines[0].y)
    assert x.size <= plots.MAX_POINTS and 1e6 in y and 12346 in x


def test_svg_is_an_image_not_markup_with_text() -> None:
    trace = Trace([{"step": 1, "loss": 1.0}, {"step": 2, "loss": math.nan}])
    svg = plots.render(plots.build_panels(trace)[0], "svg")
    assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg and b"<script" not in svg


def test_empty_trace_has_no_panels() -> None:
    assert plots.build_panels(Trace([])) == []


def test_one_update_makes_no_empty_axes() -> None:
    # one point says nothing over time: no axes with ticks at fractions of an update
    one = Trace([{"step": 1, "loss": 0.7, "grad_norm": 2.0, "lr": 0.1}])
    assert plots.build_panels(one) == []
    two = Trace([{"step": 1, "loss": 0.7, "lr": 0.1}, {"step": 2, "loss": 0.5, "lr": 0.1}])
    assert [p.key for p in plots.build_panels(two)] == ["loss"]


def test_a_schedule_is_plotted_a_constant_is_not() -> None:
    warmup = [{"step": i, "loss": 1.0 / i, "lr": 1e-3 * min(1.0, i / 10)} for i in range(1, 40)]
    assert "lr" in [p.key for p in plots.build_panels(Trace(warmup))]
    same = [{"step": i, "loss": 1.0 / i, "lr": 1e-3, "flip_frac": 0.0} for i in range(1, 40)]
    flat: list[tuple[str, float]] = []
    assert [p.key for p in plots.build_panels(Trace(same), flat=flat)] == ["loss"]
    assert dict(flat) == {"learning rate": 1e-3, "fraction of weights that flipped sign": 0.0}


def test_plots_use_the_page_width() -> None:
    # the axes take most of the picture, and the page shows the picture as wide as its column
    left, _, right, _ = plots.AXES_BOX
    assert right - left > 0.75
    # the stylesheet the package ships, which every page inlines
    css = (resources.files("nanscope.report") / "assets" / "report.css").read_text("utf-8")
    rule = css[css.index(".plots img") :].split("}", 1)[0]
    assert "width: 100%" in rule and "max-width" not in rule


def test_per_layer_norms_are_drawn_through_every_update_they_were_measured_at(
    nan_run: Path,
) -> None:
    """Per-layer norms are measured on a schedule, not every update: each layer's line goes
    through the updates that have them (no dot lost between gaps), and only those."""
    trace = nanscope.read_trace(nan_run)
    measured = [int(r["step"]) for r in trace.records if r.get("grad_norms")]
    assert len(measured) >= 2
    panel = _panel(plots.build_panels(trace), "grad_norm")
    layers = [ln for ln in panel.lines if ln.label != "global"]
    assert {ln.label for ln in layers} == {"a", "b"}
    for line in layers:
        assert [int(x) for x in line.x] == measured
        before = line.y[line.x < 31]  # the NaN row arrives at update 31 (policy warn goes on)
        assert before.size >= 2 and np.isfinite(before).all()
