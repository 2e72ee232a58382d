"""S004 unscaled-column: a feature whose magnitude dwarfs the other features'.

What it does
    Gives every numeric feature (not the target) a robust magnitude, ``sqrt(median² + scale²)``
    with ``scale`` the σ-consistent MAD, and compares it with the median magnitude of the *other*
    features. A column at least 100 times larger is reported with the factor. The test is
    scale-free: multiplying every column by the same constant changes nothing.

Why is this bad?
    The gradient of a linear layer with respect to a weight is proportional to its input, and the
    curvature to its square. A money-valued column in the tens of thousands next to features near 1
    makes the largest stable step size about ``factor²`` times smaller than the one that suits the
    others: a learning rate that is fine for them overshoots on this column, the loss grows
    geometrically, weights flip sign, and the fit reaches inf then NaN within a few epochs.

Example
    ``price`` in dollars (median 20,000) next to standardised features: factor ~8,000.

Use instead
    ``price_z = (price - price.mean()) / price.std()``, or ``log1p(price)`` for a skewed amount.

Fix
    Standardise the column (or log-scale a money amount) before fitting.
"""

from __future__ import annotations

import bisect
import math
from statistics import median

from nanscope.data._model import Finding
from nanscope.data.checks._base import Context, Results, fmt_num, make_finding, no_probes

CODE = "S004"
NAME = "unscaled-column"
FIX = "standardise it ((x - mean) / std) or log-scale a money amount before fitting"


def magnitude(median_: float, scale: float) -> float:
    m = median_ if math.isfinite(median_) else 0.0
    s = scale if math.isfinite(scale) else 0.0
    return math.hypot(m, s)


def _median_without(values: list[float], j: int) -> float:
    """The median of sorted ``values`` with the element at index ``j`` left out."""
    m = len(values) - 1

    def at(rank: int) -> float:
        return values[rank if rank < j else rank + 1]

    if m % 2:
        return at(m // 2)
    return (at(m // 2 - 1) + at(m // 2)) / 2


probes = no_probes


def run(ctx: Context, results: Results) -> list[Finding]:
    feats = [c for c in ctx.numeric(target=False) if c.n_finite > 0]
    mags = {c.name: magnitude(c.median, c.scale) for c in feats}
    if len(mags) < 2:
        return []
    out = []
    positive = sorted(m for m in mags.values() if m > 0)
    for c in feats:
        # the median of the other columns' magnitudes, from one sorted list (linear in width)
        own = mags[c.name]
        if own > 0:
            if len(positive) < 2:
                continue
            ref = _median_without(positive, bisect.bisect_left(positive, own))
        else:
            if not positive:
                continue
            ref = median(positive)
        factor = mags[c.name] / ref
        if factor >= ctx.options.magnitude_factor:
            out.append(
                make_finding(
                    CODE,
                    NAME,
                    "warning",
                    c.name,
                    f"column `{c.name}` is ~{fmt_num(round(factor))}x larger than the other "
                    f"features (robust magnitude {fmt_num(mags[c.name])} vs {fmt_num(ref)}); "
                    f"a step size tuned for them overshoots on it",
                    FIX,
                    data={"factor": factor, "magnitude": mags[c.name], "reference": ref},
                )
            )
    return out
