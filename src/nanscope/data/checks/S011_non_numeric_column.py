"""S011 non-numeric-column: a text (or other non-numeric) column, skipped by the scan.

What it does
    Lists the columns that are not numbers (text, categorical, dates, nested types). They are
    skipped, and the scan goes on with the numeric ones. A text *target* is a warning.

Why is this bad?
    A text column cannot go into a float tensor as it is. When a CSV column that should be numeric
    comes out as text, a few cells like ``"N/A"``, ``"#DIV/0!"`` or ``"1,234"`` forced it, and a
    later ``astype(float)`` with coercion turns them into NaN.

Example
    ``income`` is read as text because one line holds ``"unknown"``.

Use instead
    Parse it explicitly: ``pl.col("income").cast(pl.Float64, strict=False)`` and handle the nulls,
    or one-hot / label-encode a real categorical column.

Fix
    Encode categorical text as integers or one-hot columns; parse numbers stored as text.
"""

from __future__ import annotations

from nanscope.data._model import Finding
from nanscope.data.checks._base import Context, Results, make_finding, no_probes

CODE = "S011"
NAME = "non-numeric-column"
FIX = "encode categories (one-hot / label encoder) or parse numbers stored as text"


probes = no_probes


def run(ctx: Context, results: Results) -> list[Finding]:
    out = []
    for c in ctx.columns.values():
        if c.numeric:
            continue
        what = "text" if c.kind == "text" else f"not numeric ({c.dtype})"
        is_target = c.name == ctx.target
        out.append(
            make_finding(
                CODE,
                NAME,
                "warning" if is_target else "info",
                c.name,
                f"{'target' if is_target else 'column'} `{c.name}` is {what}, skipped",
                "encode the labels as integers 0..K-1" if is_target else FIX,
                data={"dtype": c.dtype},
            )
        )
    return out
