"""S008 class-labels: class labels that are negative, non-integer, 1-based or out of range.

What it does
    When the target holds class labels — ``loss="ce"``, ``num_classes`` given, or an integer-valued
    target with 3 to 1,000 distinct values that is not mostly binary (S007's case) — checks that
    the labels are integers in ``0 .. num_classes - 1``: it reports negative labels, non-integer
    labels, labels at or above ``num_classes``, and labels that start at 1 (``1 .. K``, a classic
    off-by-one).

Why is this bad?
    ``CrossEntropyLoss`` and sparse categorical cross-entropy index the logits with the label. A
    label of -1 or K indexes outside the logits: on a GPU that is a device-side assert or garbage;
    on some paths a NaN or a silently wrong loss. A label of 2.5 is not a class at all.

Example
    Ratings 1..5 used as classes for a 5-way classifier: label 5 is out of range.

Use instead
    ``y = y - 1`` for 1-based labels; ``y = y.astype(int)`` after checking the non-integer rows.

Fix
    Re-encode the labels as integers 0..K-1 (e.g. y - 1, or a label encoder).
"""

from __future__ import annotations

import math

import numpy as np

from nanscope.data._model import ColumnStats, Finding
from nanscope.data.checks import S007_target_outside_unit as s007
from nanscope.data.checks._base import Context, Probe, Results, fmt_num, fmt_rows, make_finding

CODE = "S008"
NAME = "class-labels"
FIX = "re-encode the labels as integers 0..K-1 (y - 1 for 1-based labels, or a label encoder)"


def _labels(ctx: Context) -> ColumnStats | None:
    t = ctx.target_stats()
    if t is None or not t.numeric or t.n_finite == 0 or ctx.options.loss in ("log", "mse"):
        return None
    if ctx.options.loss == "ce" or ctx.options.num_classes is not None:
        return t
    if s007.applies(ctx):  # a mostly-binary target: S007 says it better
        return None
    sample = ctx.samples.get(t.name)
    if sample is None or sample.size == 0 or not 3 <= t.distinct_sample <= 1000:
        return None
    frac_int = float(np.mean(sample == np.round(sample)))
    return t if frac_int >= 0.99 else None


def _hi(ctx: Context, t: ColumnStats) -> float:
    k = ctx.options.num_classes
    return math.inf if k is None else float(k - 1)


def probes(ctx: Context) -> list[Probe]:
    t = _labels(ctx)
    if t is None:
        return []
    out = [Probe("nonintegral", t.name)] if t.kind == "float" else []
    hi = _hi(ctx, t)
    if t.min < 0 or t.max > hi:
        out.append(Probe("outside", t.name, lo=0.0, hi=hi))
    return out


def run(ctx: Context, results: Results) -> list[Finding]:
    t = _labels(ctx)
    if t is None:
        return []
    out = []
    hi = _hi(ctx, t)
    nonint = results.get(Probe("nonintegral", t.name))
    if nonint is not None and nonint.count:
        out.append(
            make_finding(
                CODE,
                NAME,
                "error",
                t.name,
                f"target `{t.name}` has {nonint.count:,} non-integer class labels; "
                f"{fmt_rows(nonint.rows, nonint.count)}",
                FIX,
                result=nonint,
                data={"problem": "non-integer"},
            )
        )
    outside = results.get(Probe("outside", t.name, lo=0.0, hi=hi))
    if outside is not None and outside.count:
        k = ctx.options.num_classes
        expected = f"0..{k - 1}" if k is not None else "0..K-1"
        out.append(
            make_finding(
                CODE,
                NAME,
                "error",
                t.name,
                f"target `{t.name}` has {outside.count:,} class labels outside {expected} "
                f"(min {fmt_num(t.min)}, max {fmt_num(t.max)}); "
                f"{fmt_rows(outside.rows, outside.count)}",
                FIX,
                result=outside,
                data={"problem": "out-of-range", "min": t.min, "max": t.max},
                predicate=("outside", {"lo": 0.0, "hi": hi}),
            )
        )
    elif t.min == 1 and t.kind != "bool":
        sample = ctx.samples.get(t.name)
        seen = set() if sample is None else set(np.unique(sample).tolist())
        if seen and seen == set(range(1, int(t.max) + 1)):
            out.append(
                make_finding(
                    CODE,
                    NAME,
                    "warning",
                    t.name,
                    f"target `{t.name}` labels run 1..{fmt_num(t.max)}: a {fmt_num(t.max)}-class "
                    f"loss expects 0..{fmt_num(t.max - 1)}, so label {fmt_num(t.max)} is out of "
                    f"range",
                    FIX,
                    data={"problem": "one-based", "min": t.min, "max": t.max},
                )
            )
    return out
