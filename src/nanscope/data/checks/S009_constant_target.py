"""S009 constant-target: a target that takes a single value.

What it does
    Reports a target whose finite values are all equal.

Why is this bad?
    There is nothing to learn: the fit drives the output to the constant, and with a log loss the
    predicted probability to exactly 0 or 1, where ``log(0)`` waits. It nearly always means a bug
    upstream: a filter that kept one class, a join that broadcast one label, the wrong column.

Example
    ``clicked`` is 0 in every row after filtering to one campaign with no clicks.

Use instead
    Check the query that built the labels; stratify the split so both classes are present.

Fix
    Check the filter or join that built the target; it should not be constant.
"""

from __future__ import annotations

from nanscope.data._model import Finding
from nanscope.data.checks._base import Context, Results, fmt_num, make_finding, no_probes

CODE = "S009"
NAME = "constant-target"
FIX = "check the filter or join that built the target; a model cannot learn a constant"


probes = no_probes


def run(ctx: Context, results: Results) -> list[Finding]:
    t = ctx.target_stats()
    if t is None or not t.numeric or t.n_finite == 0 or t.min != t.max:
        return []
    return [
        make_finding(
            CODE,
            NAME,
            "warning",
            t.name,
            f"target `{t.name}` is constant ({fmt_num(t.min)} in all {t.n_finite:,} finite rows)",
            FIX,
            data={"value": t.min},
        )
    ]
