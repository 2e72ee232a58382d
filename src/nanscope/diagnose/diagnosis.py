"""Findings (what one rule concluded) and the Diagnosis (one cause, ranked alternatives).

``Diagnosis.to_dict()`` follows the schema ``nanscope.diagnosis/1`` of DESIGN.md. Fields are only
ever added, never renamed.

Verdicts (:class:`~nanscope.diagnose.verdict.Verdict`): ``healthy`` (watched, nothing wrong
seen), ``diverging``, ``nonfinite``, ``suspect``, and three that are never healthy:
``unobserved`` (no update was recorded; cause ``unknown``, the evidence says why),
``interrupted`` (stopped from outside with no failure found; cause ``unknown``) and ``crashed``
(the script ended with its own exception, no failure found before it; cause ``unknown``, the
exception and the script's line in the evidence).

The diagnosis knows no page: ``Diagnosis._repr_html_`` (Jupyter) calls the renderer registered
with :func:`set_html_renderer`, which the report layer (``nanscope.report.html``) registers when it
is imported and the top-level ``nanscope`` package wires up lazily.
"""

from __future__ import annotations

import enum
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nanscope.diagnose.verdict import Verdict

__all__ = [
    "CAUSES",
    "SCHEMA",
    "VERDICTS",
    "VERDICT_RANK",
    "Diagnosis",
    "Evidence",
    "Finding",
    "set_html_renderer",
]

SCHEMA = "nanscope.diagnosis/1"

#: the fixed cause vocabulary (a contract: never rename)
CAUSES: tuple[str, ...] = (
    "step_size_too_large",
    "nonfinite_input",
    "update_sign_error",
    "extreme_batch",
    "log_of_zero",
    "zero_division",
    "fp16_overflow",
    "exploding_gradients",
    "bad_initialization",
    "healthy",
    "unknown",
)

#: the verdict names in the schema's order (:class:`~nanscope.diagnose.verdict.Verdict`)
VERDICTS: tuple[str, ...] = tuple(v.value for v in Verdict)

#: which diagnosis to report when several monitors (or ranks) have one: lowest first
#: (:attr:`Verdict.rank <nanscope.diagnose.verdict.Verdict.rank>`, as plain strings)
VERDICT_RANK: dict[str, int] = {v.value: v.rank for v in sorted(Verdict, key=lambda v: v.rank)}

_html_renderer: Callable[[Diagnosis], str] | None = None


def set_html_renderer(renderer: Callable[[Diagnosis], str] | None) -> None:
    """Register what ``Diagnosis._repr_html_`` shows in Jupyter (``None``: plain repr only)."""
    global _html_renderer
    _html_renderer = renderer


@dataclass
class Evidence:
    """One piece of evidence: which rule saw it, a sentence with numbers, and the numbers."""

    rule: str
    text: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "text": self.text, "data": _jsonable(self.data)}


@dataclass
class Finding:
    """What one rule concluded about a trace."""

    rule: str
    cause: str
    confidence: float
    evidence: list[Evidence] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    step: int | None = None
    located: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: findings that are not a cause of their own but help explain the top cause
    contributing: list[Evidence] = field(default_factory=list)
    #: other causes this rule cannot rule out, with a confidence for each
    alternatives: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"unknown cause {self.cause!r}; the vocabulary is {CAUSES}")
        self.confidence = float(min(1.0, max(0.0, self.confidence)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "cause": self.cause,
            "confidence": round(self.confidence, 3),
            "text": self.evidence[0].text if self.evidence else "",
            "evidence": [e.to_dict() for e in self.evidence],
        }
        return out


@dataclass
class Diagnosis:
    """One cause for a run, with the evidence, where it happened, and what to do, in order."""

    verdict: str
    cause: str
    confidence: float
    step: int | None = None
    first_nonfinite: dict[str, Any] | None = None
    evidence: list[Evidence] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    contributing: list[dict[str, Any]] = field(default_factory=list)
    located: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)
    granularity: str = "update"
    rule: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    #: the failing update rerun changed one way at a time (probes/confirm.py), where it ran
    confirmation: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verdict == Verdict.HEALTHY

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "cause": self.cause,
            "confidence": round(float(self.confidence), 3),
            "step": self.step,
            "first_nonfinite": self.first_nonfinite,
            "evidence": [e.to_dict() for e in self.evidence],
            "actions": list(self.actions),
            "alternatives": self.alternatives,
            "contributing": self.contributing,
            "located": self.located,
            "rows": self.rows,
            "run": self.run,
            "granularity": self.granularity,
            "rule": self.rule,
            "summary": self.summary,
        }
        if self.confirmation:
            out["confirmation"] = self.confirmation
        out.update(self.extra)
        return _jsonable(out)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosis:
        known = {
            "verdict", "cause", "confidence", "step", "first_nonfinite", "actions",
            "alternatives", "contributing", "located", "rows", "run", "granularity", "rule",
            "summary", "confirmation",
        }  # fmt: skip
        kwargs = {k: data[k] for k in known if k in data}
        kwargs["evidence"] = [
            Evidence(e.get("rule", ""), e.get("text", ""), e.get("data") or {})
            for e in data.get("evidence", [])
        ]
        extra = {
            k: v for k, v in data.items() if k not in known and k not in ("schema", "evidence")
        }
        return cls(**kwargs, extra=extra)

    def headline(self) -> str:
        """One line: the verdict, the cause and where."""
        if self.verdict == Verdict.HEALTHY:
            return "healthy: no non-finite value and no sign of divergence"
        if self.verdict == Verdict.UNOBSERVED:
            seen = int((self.summary or {}).get("updates") or 0)
            if seen:
                unit = "epochs" if self.granularity == "epoch" else "updates"
                return f"unobserved: {seen} {unit} recorded but no loss in them, nothing to judge"
            return "unobserved: no update was recorded, so nothing could be watched"
        if self.verdict == Verdict.INTERRUPTED:
            last = f" after update {self.step}" if self.step is not None else ""
            return f"interrupted{last}: stopped from outside, no failure found before"
        if self.verdict == Verdict.CRASHED:
            crash = next((e.data for e in self.evidence if e.data.get("type")), {})
            what = f" with {crash['type']}" if crash.get("type") else ""
            if crash.get("file"):
                what += f" at {os.path.basename(str(crash['file']))}:{crash.get('line')}"
            last = f" after update {self.step}" if self.step is not None else " before any update"
            return f"crashed{what}{last}: the script's own exception, no failure found before"
        where = f" at update {self.step}" if self.step is not None else ""
        unit = "epoch" if self.granularity == "epoch" else "update"
        if self.granularity == "epoch" and self.step is not None:
            where = f" at {unit} {self.step}"
        return f"{self.verdict}: {self.cause}{where} (confidence {self.confidence:.2f})"

    def message(self) -> str:
        """The text of a DivergenceError: cause, update, top evidence and the first action."""
        lines = [f"nanscope: {self.headline()}"]
        for item in self.evidence[:2]:
            lines.append(f"  evidence: {item.text}")
        if self.located:
            where = _located_text(self.located)
            if where:
                lines.append(f"  where: {where}")
        if self.actions:
            lines.append(f"  do this first: {self.actions[0]}")
        if self.run.get("dir"):
            lines.append(f"  run: {self.run['dir']}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.message()

    def _repr_html_(self) -> str | None:
        if _html_renderer is None:
            return None
        return _html_renderer(self)


def _located_text(located: dict[str, Any]) -> str:
    parts = []
    if located.get("phase"):
        parts.append(str(located["phase"]))
    if located.get("op"):
        parts.append(f"op {located['op']}")
    if located.get("module"):
        parts.append(f"in {located['module']}")
    source = located.get("source") or {}
    if source.get("file"):
        parts.append(f"at {source['file']}:{source.get('line', '?')}")
    return " ".join(parts)


def _jsonable(value: Any) -> Any:
    """Strict-JSON-ready copy: non-finite floats as strings, numpy scalars as Python numbers, a
    vocabulary's enum member (a :class:`Verdict`) as its plain value."""
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    item = getattr(value, "item", None)
    if callable(item):
        return _jsonable(item())
    return str(value)
