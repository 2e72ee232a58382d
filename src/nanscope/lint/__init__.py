"""nanscope.lint: find the numerical hazards that make a loss go NaN, in the source, before it runs.

>>> from nanscope.lint import lint_source
>>> [f.code for f in lint_source("import torch\\np = torch.sigmoid(z)\\nloss = -torch.log(p)\\n")]
['L001']

Rules have stable codes ``L001``... (table in :mod:`nanscope.lint.registry`); ``L000`` is a file
that does not parse. ``# noqa``, ``# noqa: L003`` or ``# nanscope: noqa: L001,L003`` on a line
suppresses its findings, ``# nanscope: noqa`` on a line of its own the whole file
(:mod:`nanscope.lint.noqa`); ``[tool.nanscope.lint]`` in ``pyproject.toml`` chooses the rules per
file (:mod:`nanscope.lint.config`). A finding's ``edits`` are its safe fix
(:mod:`nanscope.lint.fixes`), its ``place`` where it stands (:mod:`nanscope.lint.ranking`).
"""

from __future__ import annotations

from nanscope.lint._engine import (
    LintReport,
    lint_file,
    lint_near,
    lint_paths,
    lint_source,
    select_rules,
)
from nanscope.lint._types import LintFinding, Rule
from nanscope.lint.registry import RULES, SYNTAX_ERROR_CODE

__all__ = [
    "RULES",
    "SYNTAX_ERROR_CODE",
    "LintFinding",
    "LintReport",
    "Rule",
    "lint_file",
    "lint_near",
    "lint_paths",
    "lint_source",
    "select_rules",
]
