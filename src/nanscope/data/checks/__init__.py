"""The scan checks, one per module, in code order. ``CHECKS`` is the registry.

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

from types import ModuleType

from nanscope.data.checks import (
    s001_nan,
    s002_inf,
    s003_null,
    s004_unscaled,
    s005_constant,
    s006_extreme,
    s007_target_range,
    s008_class_labels,
    s009_constant_target,
    s010_duplicate,
    s011_non_numeric,
)

__all__ = ["CHECKS", "by_code"]

CHECKS: tuple[ModuleType, ...] = (
    s001_nan,
    s002_inf,
    s003_null,
    s004_unscaled,
    s005_constant,
    s006_extreme,
    s007_target_range,
    s008_class_labels,
    s009_constant_target,
    s010_duplicate,
    s011_non_numeric,
)


def by_code() -> dict[str, ModuleType]:
    return {m.CODE: m for m in CHECKS}
