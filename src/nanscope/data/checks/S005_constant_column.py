"""S005 constant-column: a feature with zero (or float-resolution) spread.

What it does
    Reports numeric features whose finite values are all equal (standard deviation 0), and those
    whose relative spread ``std / |mean|`` is under 1e-6, below what float32 can resolve after
    centring.

Why is this bad?
    Standardising ``(x - mean) / std`` divides by zero: the column becomes 0/0 = NaN in every row,
    and the first update makes every weight NaN. A near-constant column becomes rounding noise
    blown up by a tiny ``std``. Either way the column carries no information.

Example
    A ``year`` column that is 2024 in every row, or a ``sensor_offset`` of 1.0000001 ± 1e-9.

Use instead
    Drop the column, or standardise with an epsilon: ``(x - mean) / (std + 1e-8)``.

Fix
    Drop the column, or add an epsilon to the std you divide by.
"""

from __future__ import annotations

import math

from nanscope.data._model import Finding
from nanscope.data.checks._base import Context, Results, fmt_num, make_finding, no_probes

CODE = "S005"
NAME = "constant-column"
FIX = "drop the column, or standardise with an epsilon: (x - mean) / (std + 1e-8)"


probes = no_probes


def run(ctx: Context, results: Results) -> list[Finding]:
    out = []
    for c in ctx.numeric(target=False):
        if c.n_finite == 0:
            continue
        data: dict[str, float]
        if c.min == c.max:
            message = (
                f"column `{c.name}` is constant ({fmt_num(c.min)} in all {c.n_finite:,} "
                f"finite rows): standardising it divides by a zero std"
            )
            data = {"value": c.min, "std": 0.0}
        elif (
            math.isfinite(c.std)
            and c.mean != 0
            and c.std <= ctx.options.near_constant_rel * abs(c.mean)
        ):
            message = (
                f"column `{c.name}` is near-constant (std {fmt_num(c.std)} around "
                f"{fmt_num(c.mean)}, relative spread {c.std / abs(c.mean):.1e}): "
                f"standardising it amplifies rounding noise"
            )
            data = {"std": c.std, "mean": c.mean, "relative_spread": c.std / abs(c.mean)}
        else:
            continue
        out.append(make_finding(CODE, NAME, "warning", c.name, message, FIX, data=data))
    return out
