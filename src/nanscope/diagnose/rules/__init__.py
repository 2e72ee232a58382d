"""Diagnosis rules: one file per rule, each a pure function ``check(ctx) -> Finding | None``.

``RULES`` below is the one table of codes: every rule module is listed once by name and imported
here, so a missing or broken rule file fails at import, never silently. A rule module is named
``D###_<cause>.py`` and carries ``CODE``, ``CAUSE`` (a label of the fixed vocabulary
``nanscope.CAUSES``), ``TITLE`` and a docstring with the sections *What it does*, *Why is this
bad?*, *Fingerprint*, *Evidence*, *Action* and *Example* (the convention every D, L and S rule
follows: :mod:`nanscope.rulebook`);
``docs/rules/`` is generated from them, and ``tests/diagnose/fixtures/`` holds one recorded trace
per rule. A rule's ``fingerprint(ctx)`` measures (a frozen dataclass, or None when its shape is
absent) and ``check`` scores and words it, so what was measured is tested apart from the text.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["RULES", "RULE_MODULES", "load_rules"]

#: the rule module names, in code order: the one place a rule is registered
_NAMES = (
    "D001_step_size_too_large",
    "D002_nonfinite_input",
    "D003_update_sign_error",
    "D004_extreme_batch",
    "D005_log_of_zero",
    "D006_exploding_gradients",
    "D007_zero_division",
    "D008_fp16_overflow",
    "D009_bad_initialization",
    "D010_bad_initialization",
    "D011_step_size_too_large",
    "D012_step_size_too_large",
)

#: the rule modules, in code order (imported here, so a missing or broken one fails at import)
RULES: tuple[ModuleType, ...] = tuple(importlib.import_module(f"{__name__}.{n}") for n in _NAMES)

#: code -> module name under nanscope.diagnose.rules
RULE_MODULES: dict[str, str] = {m.CODE: m.__name__.rpartition(".")[2] for m in RULES}


def load_rules() -> list[ModuleType]:
    """Every rule module, in code order."""
    return list(RULES)
