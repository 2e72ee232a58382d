"""Small helpers shared by the rules: number formatting, the unit of a record and the standard
action texts."""

from __future__ import annotations

from typing import Any

from nanscope.diagnose.context import Context
from nanscope.formatting import number
from nanscope.formatting import row as row_words
from nanscope.numerics import OUTLIER_Z
from nanscope.outcome import UNSCALED_RATIO

__all__ = ["OUTLIER_Z", "SCALE_FAR", "initial_weights_sane", "num", "row_text",
           "tenfold_action", "unit", "unscaled_columns"]  # fmt: skip


#: weights whose std(W) * sqrt(fan_in) is this far from 1 (either way) are not a standard
#: initialiser's (those give about 0.5 to 1.5)
SCALE_FAR = 8.0


def unscaled_columns(ctx: Context) -> bool:
    """The first batches hold a column in raw units (its max |x| ``UNSCALED_RATIO`` times the
    median column's)."""
    for record in ctx.records[:8]:
        ratio = record.get("input_scale_ratio")
        if isinstance(ratio, (int, float)) and ratio >= UNSCALED_RATIO:
            return True
    return False


def initial_weights_sane(ctx: Context) -> bool:
    """The weights were measured before the first update (a loop on bare tensors, at its first
    backward) and could not have made its values: all zero (their output is the bias), or every
    matrix within ``SCALE_FAR`` of a standard initialiser's scale."""
    first = ctx.records[0] if ctx.records else {}
    if first.get("step") == 1 and first.get("weight_norm") == 0.0:
        return True
    scale = ctx.evidence.get("initial_weight_scale") or {}
    worst, least = scale.get("max_ratio"), scale.get("min_ratio")
    if not isinstance(worst, (int, float)) or not isinstance(least, (int, float)):
        return False
    return worst < SCALE_FAR and least > 1 / SCALE_FAR


def num(value: Any) -> str:
    """A number as people read it in a report (see :func:`nanscope.formatting.number`)."""
    return number(value)


def row_text(row: dict[str, Any]) -> str:
    """'batch row 7 (dataset row 1207), column 3 = nan' (see :func:`nanscope.formatting.row`)."""
    return row_words(row)


def unit(ctx: Context) -> str:
    """What one record of the trace is: an ``epoch`` for a per-epoch log, else an ``update``."""
    return "epoch" if ctx.granularity == "epoch" else "update"


def tenfold_action(lr: float | None) -> str:
    if lr:
        return (
            f"Cut the learning rate tenfold (lr {num(lr)} -> {num(lr / 10)}) and rerun: if the "
            "loss then descends, the step size was the cause (`nanscope sweep` runs this for you)."
        )
    return (
        "Cut the learning rate tenfold and rerun: if the loss then descends, the step size was "
        "the cause (`nanscope sweep` runs this for you)."
    )
