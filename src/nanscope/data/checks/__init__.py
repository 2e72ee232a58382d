"""The scan checks, one per module ``S###_<name>.py``, in code order. ``CHECKS`` is the registry:
every check is listed once by name and imported here, so a missing or broken file fails at
import. The docstring convention and the generated pages under ``docs/scan/`` are
:mod:`nanscope.rulebook`'s.

| code | name | severity |
|---|---|---|
| S001 | nan-values | error |
| S002 | inf-values | error |
| S003 | null-values | error |
| S004 | unscaled-column | warning |
| S005 | constant-column | warning |
| S006 | extreme-rows | warning (info when heavy-tailed) |
| S007 | target-outside-unit | error |
| S008 | class-labels | error / warning (1-based) |
| S009 | constant-target | warning |
| S010 | duplicate-columns | warning |
| S011 | non-numeric-column | info (warning for the target) |
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["CHECKS", "by_code"]

#: the check module names, in code order: the one place a check is registered
_NAMES = (
    "S001_nan_values",
    "S002_inf_values",
    "S003_null_values",
    "S004_unscaled_column",
    "S005_constant_column",
    "S006_extreme_rows",
    "S007_target_outside_unit",
    "S008_class_labels",
    "S009_constant_target",
    "S010_duplicate_columns",
    "S011_non_numeric_column",
)

#: the check modules, in code order (imported here, so a missing or broken one fails at import)
CHECKS: tuple[ModuleType, ...] = tuple(importlib.import_module(f"{__name__}.{n}") for n in _NAMES)


def by_code() -> dict[str, ModuleType]:
    return {m.CODE: m for m in CHECKS}
