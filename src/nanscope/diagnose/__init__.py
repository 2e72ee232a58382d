"""The triage engine: rules (one file per rule) turn a trace plus evidence into a Diagnosis.

The engine and its rules are imported on first use of :func:`diagnose` / :func:`run_rules`, so a
module that only needs the :class:`Diagnosis` data (the report, the adapters) does not load them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nanscope.diagnose.diagnosis import CAUSES, Diagnosis, Evidence, Finding

if TYPE_CHECKING:
    from nanscope.diagnose.engine import diagnose, run_rules

__all__ = ["CAUSES", "Diagnosis", "Evidence", "Finding", "diagnose", "run_rules"]


def __getattr__(name: str) -> Any:
    if name in ("diagnose", "run_rules"):
        from nanscope.diagnose import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'nanscope.diagnose' has no attribute {name!r}")
