"""Diagnosis rules: one file per rule, each a pure function ``check(ctx) -> Finding | None``.

The registry below is the one table of codes. Every rule module carries ``CODE``, ``CAUSE``,
``TITLE`` and a docstring with the sections *What it does*, *Why is this bad?*, *Fingerprint*,
*Evidence*, *Action* and *Example*; ``docs/rules/`` is generated from them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["RULE_MODULES", "load_rules"]

#: code -> module name under nanscope.diagnose.rules
RULE_MODULES: dict[str, str] = {
    "D001": "D001_step_size_too_large",
    "D002": "D002_nonfinite_input",
    "D003": "D003_update_sign_error",
    "D004": "D004_extreme_batch",
    "D005": "D005_log_of_zero",
    "D006": "D006_exploding_gradients",
    "D007": "D007_zero_division",
    "D008": "D008_fp16_overflow",
    "D009": "D009_bad_initialization",
}

_loaded: list[ModuleType] = []


def load_rules() -> list[ModuleType]:
    """Import every rule module once, in code order."""
    if not _loaded:
        for name in RULE_MODULES.values():
            try:
                _loaded.append(importlib.import_module(f"{__name__}.{name}"))
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
    return _loaded
