"""S007 target-outside-unit: a binary/probability target with values outside [0, 1].

What it does
    When the target feeds a log loss (``loss="log"``), or looks like one — at least 90% of its
    values in [0, 1], or labels -1/+1 — reports the rows whose target lies outside [0, 1].

Why is this bad?
    Binary cross-entropy ``-[y log p + (1 - y) log(1 - p)]`` assumes ``0 <= y <= 1``. With
    ``y = -1`` or ``y = 2`` the loss is unbounded below: the fit drives ``p`` to exactly 0 or 1
    to reward itself, ``log(0)`` appears, and the loss goes to -inf then NaN.

Example
    Labels coded -1/+1 for an SVM, fed to ``BCEWithLogitsLoss``; or a click count (2) in a
    ``clicked`` column.

Use instead
    ``y01 = (y + 1) / 2`` for ±1 labels; ``clicked = clicks > 0`` for counts.

Fix
    Map the target into {0, 1} (or [0, 1] for probabilities) before the log loss.
"""

from __future__ import annotations

import numpy as np

from nanscope.data._model import Finding
from nanscope.data.checks._base import Context, Probe, Results, fmt_num, fmt_rows, make_finding

CODE = "S007"
NAME = "target-outside-unit"
FIX = "map the target into {0, 1} (e.g. (y + 1) / 2 for -1/+1 labels) before a log loss"


def applies(ctx: Context) -> bool:
    t = ctx.target_stats()
    if t is None or not t.numeric or t.n_finite == 0 or ctx.options.loss in ("ce", "mse"):
        return False
    if t.min >= 0 and t.max <= 1:
        return False
    if ctx.options.loss == "log":
        return True
    if t.two_valued and t.min == -1 and t.max == 1:
        return True
    sample = ctx.samples.get(t.name)
    if sample is None or sample.size == 0:
        return False
    return bool(np.mean((sample >= 0) & (sample <= 1)) >= 0.9)


def probes(ctx: Context) -> list[Probe]:
    if not applies(ctx) or ctx.target is None:
        return []
    return [Probe("outside", ctx.target, lo=0.0, hi=1.0)]


def run(ctx: Context, results: Results) -> list[Finding]:
    if not applies(ctx) or ctx.target is None:
        return []
    t = ctx.columns[ctx.target]
    res = results.get(Probe("outside", t.name, lo=0.0, hi=1.0))
    if res is None or res.count == 0:
        return []
    if t.two_valued and t.min == -1 and t.max == 1:
        what = "holds -1/+1 labels"
    else:
        what = (
            f"has {res.count:,} values outside [0, 1] (min {fmt_num(t.min)}, max {fmt_num(t.max)})"
        )
    return [
        make_finding(
            CODE,
            NAME,
            "error",
            t.name,
            f"target `{t.name}` {what}; a log loss needs targets in [0, 1]; "
            f"{fmt_rows(res.rows, res.count)}",
            FIX,
            result=res,
            data={"min": t.min, "max": t.max},
            predicate=("outside", {"lo": 0.0, "hi": 1.0}),
        )
    ]
