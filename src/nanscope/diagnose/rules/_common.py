"""Small helpers shared by the rules: number formatting and the standard action texts."""

from __future__ import annotations

from typing import Any

from nanscope.formatting import number

__all__ = ["num", "row_text", "tenfold_action"]


def num(value: Any) -> str:
    """A number as people read it in a report (see :func:`nanscope.formatting.number`)."""
    return number(value)


def row_text(row: dict[str, Any]) -> str:
    """'batch row 7 (dataset row 1207), column 3 = nan' for one bad row."""
    text = f"batch row {row.get('batch_row')}"
    if row.get("dataset_row") is not None:
        text += f" (dataset row {row['dataset_row']})"
    if row.get("source") == "targets":
        text += " of the targets"
    if row.get("column") is not None:
        text += f", column {row['column']}"
    text += f" = {num(row.get('value'))}"
    if row.get("z") is not None and row.get("why") == "extreme":
        text += f" (robust z {num(row['z'])})"
    return text


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
