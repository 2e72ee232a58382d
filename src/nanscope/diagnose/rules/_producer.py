"""What the rules share about the producer: the first op whose inputs were finite, output not.

The probes put it in ``evidence["located"]`` (its keys: :mod:`nanscope.located`): its ``op``,
``phase``, ``dtype``, ``why`` (the input values that made it: ``{"kind": "zero_denominator" |
"log_domain" | "past_range" | ...}``), ``observed`` (an op check saw it) or not (inferred),
``precision`` (recomputed wider: finite and past the narrow dtype's limit) and ``loss_scale``. The
rules read it through these helpers so they agree on what counts as a log, a division or an
overflow (the op families of :mod:`nanscope.numerics`).
"""

from __future__ import annotations

from typing import Any

from nanscope.diagnose.context import Context
from nanscope.diagnose.rules._common import num
from nanscope.located import Located
from nanscope.numerics import DIVISION_OPS, GROWTH_OPS, HALF_TINY, LOG_OPS

__all__ = ["Producer", "flushed_eps", "producer_of", "producer_step"]


class Producer:
    """A read-only view of ``located`` in the terms the rules use."""

    def __init__(self, located: dict[str, Any]) -> None:
        self.d = located
        loc = Located.read(located)
        self.located = loc
        self.op = loc.op or ""
        self.low = self.op.lower()
        self.forward_op = (loc.forward_op or "").lower()
        self.phase = loc.phase or ""
        self.dtype = loc.dtype or ""
        self.why: dict[str, Any] = loc.why or {}
        self.kind = str(self.why.get("kind") or "")
        self.observed = bool(loc.observed)
        self.inputs = loc.inputs or ""
        self.zero = bool(loc.input_zero) or self.inputs.startswith("exactly zero") or bool(
            self.why.get("zero")
        )
        self.precision = loc.precision
        self.loss_scale = float(loc.loss_scale) if loc.loss_scale is not None else None

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
        for other in self.located.also or []:
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
        note = self.located.note
        return self.kind == "nonfinite_input" or self.inputs.startswith("non-finite") or bool(
            note and "already non-finite" in note
        )

    def where(self) -> str:
        """'exp in Rate (train.py:21)'."""
        text = self.op or "?"
        if self.located.module:
            text += f" in {self.located.module}"
        source = self.located.source or {}
        if source.get("file"):
            text += f" ({source['file']}:{source.get('line')})"
        return text

    def how(self) -> str:
        """'observed' or 'inferred', with the way it was found."""
        how = self.located.how
        word = "observed" if self.observed else "inferred"
        return f"{word} ({how})" if how else word

    def values_text(self) -> str:
        """The input values that made it, as a clause."""
        text = str(self.why.get("text") or "")
        if not text and self.inputs:
            text = f"its input was {self.inputs}"
        return text

    def chain_text(self, limit: int = 4) -> str:
        chain = self.located.chain or []
        if not chain:
            return ""
        ops = [str(c.get("op")) for c in chain[:limit] if isinstance(c, dict)]
        more = f" (+{len(chain) - limit} more)" if len(chain) > limit else ""
        detected = self.located.detected
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


def flushed_eps(ctx: Context, located: dict[str, Any]) -> float | None:
    """The optimizer's eps when float16 made it 0: the script set it above 0 but below
    float16's smallest value, and the producer ran in float16; else None."""
    eps = ctx.trace.meta.get("optimizer_eps")
    if (str(located.get("dtype")) == "float16" and isinstance(eps, (int, float))
            and 0 < eps < HALF_TINY):  # fmt: skip
        return eps
    return None


def producer_step(ctx: Context, located: dict[str, Any]) -> int | None:
    """The update a producer's finding names: the failing one, else the one the probes located
    the producer at (a value made and caught before the loss went non-finite)."""
    return ctx.step_at(ctx.fail) if ctx.fail is not None else located.get("step")
