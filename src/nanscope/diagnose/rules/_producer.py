"""What the rules share about the producer: the first op whose inputs were finite, output not.

The probes put it in ``evidence["located"]`` (``nanscope.probes.producer`` / ``locate`` for
PyTorch, ``nanscope.probes.fperrors`` for numpy): its ``op``, ``phase``, ``dtype``, ``why`` (the
input values that made it: ``{"kind": "zero_denominator" | "log_domain" | "past_range" | ...}``),
``observed`` (an op check saw it) or not (inferred), ``precision`` (recomputed wider: finite and
past the narrow dtype's limit) and ``loss_scale``. The rules read it through these helpers so they
agree on what counts as a log, a division or an overflow.
"""

from __future__ import annotations

from typing import Any

from nanscope.diagnose.rules._common import num
from nanscope.numerics import DIVISION_OPS, GROWTH_OPS, LOG_OPS

__all__ = ["Producer", "producer_of"]

class Producer:
    """A read-only view of ``located`` in the terms the rules use."""

    def __init__(self, located: dict[str, Any]) -> None:
        self.d = located
        self.op = str(located.get("op") or "")
        self.low = self.op.lower()
        self.forward_op = str(located.get("forward_op") or "").lower()
        self.phase = str(located.get("phase") or "")
        self.dtype = str(located.get("dtype") or "")
        why = located.get("why")
        self.why: dict[str, Any] = why if isinstance(why, dict) else {}
        self.kind = str(self.why.get("kind") or "")
        self.observed = bool(located.get("observed"))
        inputs = str(located.get("inputs") or "")
        self.inputs = inputs
        self.zero = bool(located.get("input_zero")) or inputs.startswith("exactly zero") or bool(
            self.why.get("zero")
        )
        self.precision = located.get("precision") if isinstance(located.get("precision"),
                                                                dict) else None  # fmt: skip
        scale = located.get("loss_scale")
        self.loss_scale = float(scale) if isinstance(scale, (int, float)) else None

    @property
    def known(self) -> bool:
        """An op was named (observed or inferred)."""
        return bool(self.op)

    def is_log(self) -> bool:
        names = (self.low, self.forward_op)
        return any(k in n for n in names for k in LOG_OPS) and "softplus" not in self.low

    def also_log(self) -> dict[str, Any] | None:
        """Another producer of the same update that was a log at 0 / out of its domain (numpy:
        which of several producers reached the loss is not known, every one is kept)."""
        for other in self.d.get("also") or []:
            if not isinstance(other, dict):
                continue
            why = other.get("why") or {}
            op = str(other.get("op") or "").lower()
            if why.get("kind") == "log_domain" or (any(k in op for k in LOG_OPS)
                                                  and why.get("zero")):  # fmt: skip
                return other
        return None

    def is_division(self) -> bool:
        if self.is_log():
            return False
        return any(k in n for n in (self.low, self.forward_op) for k in DIVISION_OPS)

    def is_growth(self) -> bool:
        return any(k in n for n in (self.low, self.forward_op) for k in GROWTH_OPS)

    def past_range(self) -> bool:
        return self.kind == "past_range" or self.inputs in ("past the half range", "huge") or (
            self.inputs.startswith("huge")
        )

    def inputs_nonfinite(self) -> bool:
        return self.kind == "nonfinite_input" or self.inputs.startswith("non-finite") or bool(
            self.d.get("note") and "already non-finite" in str(self.d.get("note"))
        )

    def where(self) -> str:
        """'exp in Rate (train.py:21)'."""
        text = self.op or "?"
        if self.d.get("module"):
            text += f" in {self.d['module']}"
        source = self.d.get("source") or {}
        if isinstance(source, dict) and source.get("file"):
            text += f" ({source['file']}:{source.get('line')})"
        return text

    def how(self) -> str:
        """'observed' or 'inferred', with the way it was found."""
        how = self.d.get("how")
        word = "observed" if self.observed else "inferred"
        return f"{word} ({how})" if how else word

    def values_text(self) -> str:
        """The input values that made it, as a clause."""
        text = str(self.why.get("text") or "")
        if not text and self.inputs:
            text = f"its input was {self.inputs}"
        return text

    def chain_text(self, limit: int = 4) -> str:
        chain = self.d.get("chain") or []
        if not isinstance(chain, list) or not chain:
            return ""
        ops = [str(c.get("op")) for c in chain[:limit] if isinstance(c, dict)]
        more = f" (+{len(chain) - limit} more)" if len(chain) > limit else ""
        detected = self.d.get("detected")
        tail = f", then the {detected} was detected" if detected else ""
        return "propagated by " + " -> ".join(ops) + more + tail

    def scale_text(self) -> str:
        if self.loss_scale is None:
            return ""
        exp = _log2(self.loss_scale)
        spelled = f"2^{exp}" if exp is not None else num(self.loss_scale)
        return (f"the loss was multiplied by a loss scale of {spelled} ({num(self.loss_scale)}) "
                "before backward(): the scaled gradients are what overflow")  # fmt: skip


def _log2(x: float) -> int | None:
    import math

    if x <= 0:
        return None
    e = math.log2(x)
    return round(e) if abs(e - round(e)) < 1e-9 else None


def producer_of(located: dict[str, Any] | None) -> Producer | None:
    if not located:
        return None
    return Producer(located)
