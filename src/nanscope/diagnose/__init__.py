"""The triage engine: rules (one file per rule) turn a trace plus evidence into a Diagnosis."""

from __future__ import annotations

from nanscope.diagnose.diagnosis import CAUSES, Diagnosis, Evidence, Finding
from nanscope.diagnose.engine import diagnose, run_rules

__all__ = ["CAUSES", "Diagnosis", "Evidence", "Finding", "diagnose", "run_rules"]
