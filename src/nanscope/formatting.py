"""Numbers as people read them: one definition for every report, message and table.

>>> number(0.000123456), number(2494037252470475.0), number(12), number(float("nan"))
('0.000123', '2.49e+15', '12', 'nan')
>>> number(1234567, thousands=True), lr(0.1), lr(3e-05)
('1,234,567', '0.1', '3e-05')
>>> value({"growth": 2494037252470475.0, "rises": 4})
'growth 2.49e+15, rises 4'

Everything here is pure and needs only the standard library (numpy scalars are read through
``float()``), so any layer may import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["count", "lr", "number", "row", "value"]

#: below this magnitude (and at or above :data:`LARGE`) a number is written in e-notation
SMALL = 1e-3
LARGE = 1e5


def _as_float(x: Any) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        return None


def number(
    x: Any,
    *,
    none: str = "?",
    nan: str = "nan",
    thousands: bool = False,
    large: float = LARGE,
) -> str:
    """A number as people read it: 4 significant digits (3 in e-notation), nan/inf spelled out.

    ``None`` gives ``none``; a NaN gives ``nan`` (a table may prefer ``"-"``); ``thousands`` writes
    integers (and integral floats) with separators (``1,234,567``); ``large`` is the magnitude from
    which e-notation is used. Text that is not a number is returned as it is.
    """
    if x is None:
        return none
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int) or getattr(getattr(x, "dtype", None), "kind", None) in ("i", "u"):
        return f"{int(x):,}" if thousands else str(int(x))
    f = _as_float(x)
    if f is None:
        return str(x)
    if math.isnan(f):
        return nan
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if thousands and f == int(f) and abs(f) < 1e15:
        return f"{int(f):,}"
    if f != 0 and (abs(f) >= large or abs(f) < SMALL):
        return f"{f:.3g}"
    return f"{f:.4g}"


def count(n: Any) -> str:
    """An integer count with thousands separators: ``12,345``."""
    return number(n, thousands=True)


def lr(x: Any) -> str:
    """A learning rate as it would be typed: ``0.1``, ``0.001``, ``3e-05``, ``1.0`` (6 digits)."""
    f = _as_float(x)
    if f is None:
        return str(x)
    if f == 0:
        return "0.0"
    if not math.isfinite(f):
        return number(f)
    if 1e-4 <= abs(f) < 1e6:
        text = f"{f:.6g}"
        return text if ("." in text or "e" in text) else text + ".0"
    return f"{f:.3g}"


def value(v: Any, *, limit: int = 12) -> str:
    """Any evidence value as one readable line: numbers through :func:`number`, mappings as
    ``key value, key value``, lists joined by commas (mappings in a list by ``; ``), at most
    ``limit`` items of a list (then ``... (N in all)``). Never a Python repr of a dict."""
    if isinstance(v, Mapping):
        parts = [f"{k} {value(x, limit=limit)}" for k, x in v.items() if x is not None]
        return ", ".join(parts)
    if isinstance(v, (list, tuple)):
        items = list(v)
        sep = "; " if any(isinstance(x, Mapping) for x in items) else ", "
        shown = sep.join(value(x, limit=limit) for x in items[:limit])
        more = f" ... ({len(items)} in all)" if len(items) > limit else ""
        return shown + more
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    return number(v)


def row(r: Mapping[str, Any]) -> str:
    """One bad input row in words: ``batch row 7 (dataset row 1207), column 3 = nan``."""
    text = f"batch row {r.get('batch_row')}"
    if r.get("dataset_row") is not None:
        text += f" (dataset row {r['dataset_row']})"
    if r.get("source") == "targets":
        text += " of the targets"
    if r.get("column") is not None:
        text += f", column {r['column']}"
    text += f" = {number(r.get('value'))}"
    if r.get("z") is not None and r.get("why") == "extreme":
        text += f" (robust z {number(r['z'])})"
    return text
