"""S002 inf-values: +inf or -inf in a numeric column.

What it does
    Counts the infinite values of every numeric column and lists the first rows that hold one.

Why is this bad?
    An infinite input makes the forward pass infinite, and ``inf - inf`` or ``0 * inf`` in the loss
    or its gradient turns it into NaN within the same update. Infinities usually come from a
    division by zero upstream (a ratio feature with a zero denominator) or a ``log(0)``.

Example
    ``ctr = clicks / impressions`` is ``inf`` where ``impressions == 0``.

Use instead
    ``ctr = clicks / impressions.clip(lower=1)``, or mark and drop the rows.

Fix
    Replace or drop the infinite rows and fix the division or log that produced them.
"""

from __future__ import annotations

from nanscope.data._model import Finding
from nanscope.data.checks._base import Context, Probe, Results, fmt_rows, make_finding, pct

CODE = "S002"
NAME = "inf-values"
FIX = "drop or replace the infinite rows, and guard the division or log that produced them"


def probes(ctx: Context) -> list[Probe]:
    return [Probe("inf", c.name) for c in ctx.numeric() if c.n_inf > 0]


def run(ctx: Context, results: Results) -> list[Finding]:
    out = []
    for c in ctx.numeric():
        if c.n_inf == 0:
            continue
        res = results.get(Probe("inf", c.name))
        where = f", {fmt_rows(res.rows, c.n_inf)}" if res and res.rows else ""
        signs = []
        if c.n_posinf:
            signs.append(f"{c.n_posinf:,} +inf")
        if c.n_neginf:
            signs.append(f"{c.n_neginf:,} -inf")
        role = "target" if c.name == ctx.target else "column"
        out.append(
            make_finding(
                CODE,
                NAME,
                "error",
                c.name,
                f"{role} `{c.name}` has {' and '.join(signs)} values "
                f"({pct(c.n_inf, c.count)}){where}",
                FIX,
                result=res,
                count=c.n_inf,
                data={"posinf": c.n_posinf, "neginf": c.n_neginf},
                predicate=("inf", {}),
            )
        )
    return out
