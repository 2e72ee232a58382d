"""S010 duplicate-columns: two columns with the same value in every row.

What it does
    Finds pairs of numeric columns whose statistics match exactly (counts, min, max, mean, std),
    then confirms in a pass over every row that they are equal (NaN equal to NaN, null to null).
    Constant columns are left to S005.

Why is this bad?
    Duplicated features make the design matrix rank-deficient: closed-form and second-order
    solvers (normal equations, L-BFGS without damping) divide by a zero pivot and return inf/NaN,
    and the pair's weights can drift apart without bound in opposite directions. It usually means
    a join brought the same column in twice.

Example
    ``amount`` and ``amount_usd`` hold the same values after a currency join was skipped.

Use instead
    Keep one of them: ``df.drop("amount_usd")``.

Fix
    Drop one of the duplicated columns.
"""

from __future__ import annotations

import math

from nanscope.data._model import ColumnStats, Finding
from nanscope.data.checks._base import Context, Probe, Results, make_finding

CODE = "S010"
NAME = "duplicate-columns"
FIX = "drop one of the duplicated columns (a join probably brought it in twice)"


def _close(a: float, b: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def _same_stats(a: ColumnStats, b: ColumnStats) -> bool:
    return (
        (a.n_null, a.n_nan, a.n_posinf, a.n_neginf) == (b.n_null, b.n_nan, b.n_posinf, b.n_neginf)
        and a.min == b.min
        and a.max == b.max
        and _close(a.mean, b.mean)
        and _close(a.std, b.std)
    )


def _pairs(ctx: Context) -> list[tuple[str, str]]:
    """Candidate pairs: columns grouped by their exact counts, min and max first (a dict, so
    wide data costs linear time, not one comparison per pair of columns), then compared."""
    cols = [c for c in ctx.numeric() if c.n_finite > 0 and c.min != c.max]
    groups: dict[tuple[object, ...], list[ColumnStats]] = {}
    for c in cols:
        key = (c.n_null, c.n_nan, c.n_posinf, c.n_neginf, c.min, c.max)
        groups.setdefault(key, []).append(c)
    pairs = []
    for group in groups.values():
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                if _same_stats(a, b):
                    pairs.append((a.name, b.name))
    order = {c.name: i for i, c in enumerate(cols)}
    return sorted(pairs, key=lambda p: (order[p[0]], order[p[1]]))


def probes(ctx: Context) -> list[Probe]:
    return [Probe("equal", a, other=b) for a, b in _pairs(ctx)]


def run(ctx: Context, results: Results) -> list[Finding]:
    out = []
    reported: set[str] = set()
    for a, b in _pairs(ctx):
        res = results.get(Probe("equal", a, other=b))
        if res is None or not res.equal or b in reported:
            continue
        reported.add(b)
        out.append(
            make_finding(
                CODE,
                NAME,
                "warning",
                b,
                f"column `{b}` duplicates column `{a}` (equal in every row)",
                FIX,
                data={"duplicate_of": a},
            )
        )
    return out
