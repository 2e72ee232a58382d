"""Values made ready for strict JSON, one definition for every writer of nanscope's files.

A leaf: it imports nothing of nanscope, so the sweep's results and the scan's report (and any other
writer) encode a NaN, a numpy scalar or a vocabulary's enum member the same way.

>>> jsonable({"loss": float("nan"), "steps": (1, 2.5), 3: float("-inf")})
{'loss': 'nan', 'steps': [1, 2.5], '3': '-inf'}
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["jsonable"]


def jsonable(value: Any) -> Any:
    """A strict-JSON-ready copy of ``value``: non-finite floats as the strings ``"nan"``,
    ``"inf"`` and ``"-inf"``, numpy scalars as Python numbers, an enum member (a ``Verdict``) as
    its plain value, mapping keys as strings, tuples as lists, anything else as its ``str``."""
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return jsonable(item())
    return str(value)
