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

from nanscope.data._model import ColumnStats
from nanscope.data.checks._base import missing_check

CODE = "S002"
NAME = "inf-values"
FIX = "drop or replace the infinite rows, and guard the division or log that produced them"


def _signs(c: ColumnStats) -> str:
    """``2 +inf and 1 -inf values``: the count of each sign the column holds."""
    signs = []
    if c.n_posinf:
        signs.append(f"{c.n_posinf:,} +inf")
    if c.n_neginf:
        signs.append(f"{c.n_neginf:,} -inf")
    return " and ".join(signs) + " values"


probes, run = missing_check(
    "inf", CODE, NAME, FIX, values=_signs,
    data=lambda c: {"posinf": c.n_posinf, "neginf": c.n_neginf},
)  # fmt: skip
