"""S006 extreme-rows: finite values far outside a column's bulk, by robust z-score.

What it does
    Scores every value by a robust z-score ``(x - median) / scale``, where ``scale`` is the
    σ-consistent MAD (1.4826·MAD). When the MAD is 0 (more than half the rows share one value) it
    falls back to the IQR/1.349, then to the 5-95% range/3.29, then to the standard deviation. Rows
    beyond ±10 are listed, first rows and worst row, with their z-scores. Two-valued columns (0/1
    indicators) are skipped: a z-score means nothing there.

    A handful of such rows (at most max(3, 0.01% of rows)) is a *warning*: isolated outliers. More
    than that is an *info*: the column is heavy-tailed rather than holding a few bad rows.

    On large data the median and MAD come from an evenly strided sample (see the scan docs); the
    rows beyond the threshold are then found exactly, in a pass over every row.

Why is this bad?
    With a squared error a row's gradient grows with its residual, so one row at z = 10⁴ outweighs
    the rest of its batch by orders of magnitude. The fit descends for many updates and then
    spikes to inf/NaN on the batch that holds the row: the ``extreme_batch`` fingerprint.

Example
    ``age`` has median 38 and MAD 9; row 40,000,000 holds 99999 (a sentinel), z ≈ 7,500.

Use instead
    Treat the sentinel as missing, clip or winsorise the column, or use a robust loss (Huber).

Fix
    Inspect and drop or clip the listed rows; clip the gradient norm so one row cannot dominate.
"""

from __future__ import annotations

import math

from nanscope.data._model import ColumnStats, Finding, Severity
from nanscope.data.checks._base import (
    Context,
    Probe,
    ProbeResult,
    Results,
    fmt_num,
    fmt_rows,
    make_finding,
    plural,
)

CODE = "S006"
NAME = "extreme-rows"
FIX = "inspect and drop or clip the listed rows; clip the gradient norm (clip_grad_norm_)"


def _bounds(c: ColumnStats, z: float) -> tuple[float, float] | None:
    if c.two_valued or c.n_finite == 0:
        return None
    if not (math.isfinite(c.scale) and c.scale > 0 and math.isfinite(c.median)):
        return None
    return c.median - z * c.scale, c.median + z * c.scale


def _worst(c: ColumnStats) -> float:
    return c.max if abs(c.max - c.median) >= abs(c.min - c.median) else c.min


def probes(ctx: Context) -> list[Probe]:
    out = []
    for c in ctx.numeric():
        b = _bounds(c, ctx.options.z_threshold)
        if b is None or (c.min >= b[0] and c.max <= b[1]):
            continue
        out.append(Probe("outside", c.name, lo=b[0], hi=b[1]))
        out.append(Probe("value", c.name, value=_worst(c)))
    return out


def run(ctx: Context, results: Results) -> list[Finding]:
    out = []
    z = ctx.options.z_threshold
    for c in ctx.numeric():
        b = _bounds(c, z)
        if b is None:
            continue
        res = results.get(Probe("outside", c.name, lo=b[0], hi=b[1]))
        if res is None or res.count == 0:
            continue
        worst = _worst(c)
        worst_res = results.get(Probe("value", c.name, value=worst))
        worst_row = worst_res.rows[0] if worst_res and worst_res.rows else None
        worst_z = (worst - c.median) / c.scale
        limit = max(3, math.ceil(1e-4 * c.n_finite))
        isolated = res.count <= limit
        rows, values = res.rows, res.values
        if worst_row is not None and worst_row not in rows:
            rows, values = (*rows, worst_row), (*values, worst)
        where = f"; {fmt_rows(rows, res.count)}" if res.count > 1 else ""
        role = "target" if c.name == ctx.target else "column"
        at = f" at row {worst_row}" if worst_row is not None else ""
        severity: Severity
        if isolated:
            severity = "warning"
            msg = (
                f"{role} `{c.name}` has {plural(res.count, 'extreme value')} "
                f"beyond robust z ±{z:g} "
                f"(median {fmt_num(c.median)}, scale {fmt_num(c.scale)}); worst "
                f"{fmt_num(worst)}{at} (z = {fmt_num(round(worst_z, 1))}){where}"
            )
            fix = FIX
        else:
            severity = "info"
            msg = (
                f"{role} `{c.name}` is heavy-tailed: {res.count:,} rows beyond robust z ±{z:g} "
                f"(worst {fmt_num(worst)}{at}, z = {fmt_num(round(worst_z, 1))})"
            )
            fix = "consider log1p/clipping the column or a robust loss (Huber)"
        out.append(
            make_finding(
                CODE,
                NAME,
                severity,
                c.name,
                msg,
                fix,
                result=ProbeResult(res.count, rows, values),
                data={
                    "median": c.median,
                    "scale": c.scale,
                    "scale_method": c.scale_method,
                    "z_threshold": z,
                    "worst_value": worst,
                    "worst_row": worst_row,
                    "worst_z": worst_z,
                    "heavy_tailed": not isolated,
                },
                predicate=("outside", {"lo": b[0], "hi": b[1]}),
            )
        )
    return out
