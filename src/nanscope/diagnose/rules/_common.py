"""Small helpers shared by the rules: number formatting and the standard action texts."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["num", "row_text", "tenfold_action"]


def num(value: Any) -> str:
    """A number as people read it in a report: 3 significant digits, nan/inf spelled out."""
    if value is None:
        return "?"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.3g}"
    return f"{x:.4g}"


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
