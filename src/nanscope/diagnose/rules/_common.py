"""Small helpers shared by the rules: number formatting, the unit of a record and the standard
action texts."""

from __future__ import annotations

from typing import Any

from nanscope.diagnose.context import Context
from nanscope.formatting import number
from nanscope.formatting import row as row_words

__all__ = ["OUTLIER_Z", "num", "row_text", "tenfold_action", "unit"]


#: a row this many robust standard deviations out is an outlier worth naming (heavy tails reach
#: ~20 routinely); at the batch where the loss jumped, it is what threw it
OUTLIER_Z = 50.0


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
