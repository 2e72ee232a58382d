"""D007 zero_division: a division, sqrt, rsqrt or norm met an exact zero.

What it does
    Follows the producer, the first op whose inputs were finite and whose output was not (seen by
    the first-update op watch or the replay of the failing update). When it is a division, a
    reciprocal, a square root, an rsqrt, a norm, a std or a var (forward or backward) and the value
    it divided by, or took the root of, was exactly 0, that is the cause. A division in the
    training loop's preprocessing that fills a column with NaN (``(x - x.mean(0)) / x.std(0)`` on a
    constant column) is computed, not read: it outranks "drop these rows". An op named without
    its inputs is an inferred suspect, at lower confidence.

Why is this bad?
    ``0 / 0`` is NaN, ``x / 0`` is inf; the square root and the norm are finite at 0 but their
    gradients are not (``d sqrt(x) / dx = 1 / (2 sqrt(x))``), so the forward looks clean and the
    NaN appears in the backward, in every weight at once. Zero vectors come from padding, from
    masked positions, from duplicated pairs in a distance, from a ReLU layer that died.

Fingerprint
    NaN from 0/0, or from the gradient of sqrt/norm at 0; often late in training, on the first
    batch that holds a padded (all-zero) sequence or a pair at distance exactly 0.

Evidence
    The located op (``div``, ``DivBackward0``, ``SqrtBackward0``, ``LinalgVectorNormBackward0``...),
    its module, the user's source line, and that its input was exactly zero.

Action
    Add an epsilon where it divides or takes the root (``x / (n + eps)``, ``sqrt(s + eps)``);
    mask the padding out of the loss; use the library's safe forms
    (``F.normalize(x, eps=...)``, ``F.cosine_similarity(a, b, eps=...)``).

Example
    A cosine distance written by hand, ``(a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))``, on
    zero-padded sequences: every padded position is 0/0, the loss is NaN on the first batch with
    padding (seed 000: an LSTM whose loss went NaN after 85 epochs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._producer import Producer, flushed_eps, producer_of, producer_step

CODE = "D007"
CAUSE = "zero_division"
TITLE = "Division, sqrt or norm at exactly zero"

_DIVISION = ("div", "reciprocal", "cosine", "remainder", "fmod")
_ROOTS = ("sqrt", "rsqrt", "norm", "cdist", "std", "var")


def _family(op: str) -> str | None:
    low = op.lower()
    if "log" in low:
        return None  # log_of_zero's
    for name in _ROOTS:
        if name in low:
            return "root"
    for name in _DIVISION:
        if name in low:
            return "division"
    if "pow" in low:
        return "root"  # a fractional power at 0
    return None


def _where(located: dict) -> str:
    text = f"{located.get('op')}"
    if located.get("module"):
        text += f" in {located['module']}"
    source = located.get("source") or {}
    if source.get("file"):
        text += f" ({source['file']}:{source.get('line')})"
    return text


@dataclass(frozen=True)
class Fingerprint:
    """The division or root that produced the first non-finite value, and what it got."""

    located: dict[str, Any]  # the producer as the probes located it
    producer: Producer  # a view of ``located``
    family: str  # "division" or "root" (a square root, a norm, a fractional power)
    phase: str  # where it ran: forward, backward, loss, optimizer or preprocess
    zero: bool  # its input was seen at exactly 0
    computed: bool  # it made the batch's NaN in the training loop's preparation
    fail: int | None  # index of the failing update
    nan_loss: bool  # the failing loss is NaN, not inf (0/0 rather than x/0)
    flushed_eps: float | None  # the optimizer's eps (above 0) that float16 made 0, if it did


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The producer when it is a division or a root that met 0 (or was inferred to), or None."""
    located = ctx.located
    if not located:
        return None
    prod = producer_of(located)
    assert prod is not None
    family = _family(prod.op) or _family(prod.forward_op)
    if family is None:
        return None
    zero = prod.zero and prod.kind not in ("past_range", "log_domain")
    if prod.inputs_nonfinite() or prod.kind == "past_range" or prod.inputs == "past the half range":
        return None  # the value was already broken, or it is an overflow story
    phase = prod.phase or "forward"
    i = ctx.fail
    computed = phase == "preprocess" and prod.observed and zero
    if i is not None and not computed and (
        ctx.nonfinite["inputs"][i] > 0 or ctx.nonfinite["targets"][i] > 0
    ):
        return None
    inferred = bool(located.get("guessed")) or not prod.inputs or not prod.observed
    if not (zero or inferred):
        return None  # its inputs were seen, and they were not 0
    return Fingerprint(
        located=located,
        producer=prod,
        family=family,
        phase=phase,
        zero=zero,
        computed=computed,
        fail=i,
        nan_loss=i is not None and math.isnan(ctx.loss[i]),
        flushed_eps=flushed_eps(ctx, located),
    )


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    located, phase, computed = found.located, found.phase, found.computed
    op = found.producer.op
    if found.zero:
        confidence = 0.92 if found.producer.observed else 0.7
        if computed:
            confidence = 0.97  # seen making the batch's NaN: not a bad row of the data
        evidence = _zero_evidence(found)
    else:
        confidence = 0.5
        if found.family == "division" and phase == "forward" and found.nan_loss:
            confidence = 0.6  # a NaN (not inf) loss from a division: 0/0
        evidence = [
            Evidence(
                CODE,
                f"the first non-finite value is in the {phase} and the only op in the loss that "
                f"can make one from a finite value is {_where(located)}; its inputs were no "
                "longer kept, so whether they were exactly 0 is inferred",
                {"op": op, "phase": phase, "guessed": True, "observed": False},
            )
        ]
    alternatives: list[tuple[str, float]] = []
    if phase == "optimizer":
        evidence.append(
            Evidence(
                CODE,
                "it happened in the optimizer's own arithmetic, from finite gradients: a "
                "parameter whose gradient is exactly 0 divides 0 by a denominator of 0 when the "
                "optimizer's epsilon is 0",
                {"phase": "optimizer"},
            )
        )
        if found.flushed_eps is not None:
            # the script's eps is not 0: float16 made it 0 (D008's story)
            confidence = min(confidence, 0.5)
            alternatives.append(("fp16_overflow", 0.85))
    elif not computed and ("div" in op.lower() or found.family == "root"):
        evidence.append(
            Evidence(
                CODE,
                "zero vectors in a normalisation or a distance usually come from padding, masked "
                "positions or identical pairs",
                {},
            )
        )
    return Finding(CODE, CAUSE, confidence, evidence, _actions(found),
                   step=producer_step(ctx, located), located=located,
                   alternatives=alternatives + ([("log_of_zero", 0.1)] if not found.zero else []))


def _zero_evidence(found: Fingerprint) -> list[Evidence]:
    """What the op got (exactly 0), where it made the batch's NaN, and the ops after it."""
    located, prod, phase = found.located, found.producer, found.phase
    op = prod.op
    if found.family == "root" and phase == "backward":
        what = (
            f"the gradient of {located.get('forward_op') or op} is infinite at 0: "
            f"{_where(located)} received exactly 0 in the backward"
        )
    elif found.family == "root":
        what = f"{_where(located)} took the root/norm of exactly 0"
    else:
        what = f"{_where(located)} divided by exactly 0 (0/0 is NaN, x/0 is inf)"
    values = prod.values_text()
    if values and "exactly 0" in values and values not in what:
        what += f"; {values}"
    what += f" [{prod.how()}, {phase}]"
    evidence = [Evidence(CODE, what, {"op": op, "module": located.get("module"), "phase": phase,
                                      "inputs": prod.inputs, "observed": prod.observed})]
    if found.computed:
        evidence.append(
            Evidence(
                CODE,
                "the NaN/inf in the batch is computed by this division "
                + ("in the data preparation before training" if "data preparation" in
                   str(located.get("how")) else "in the training loop")
                + ", not read from the data: the division is what to fix, not the rows",
                {"phase": "preprocess"},
            )
        )  # fmt: skip
    chain = prod.chain_text()
    if chain:
        evidence.append(Evidence(CODE, chain, {"chain": located.get("chain")}))
    return evidence


def _actions(found: Fingerprint) -> list[str]:
    actions = [
        "Add an epsilon where it divides or takes the root: x / (norm + 1e-8), "
        "torch.sqrt(s + 1e-12), or clamp the divisor with .clamp_min(eps).",
        "Mask padded / empty positions out before the division and out of the loss.",
        "Use the safe library forms: F.normalize(x, dim=-1, eps=1e-8), "
        "F.cosine_similarity(a, b, dim=-1, eps=1e-8), torch.linalg.vector_norm instead of "
        "sqrt(sum(x**2)).",
    ]
    if found.phase == "optimizer":
        actions.insert(0, "Keep the optimizer's eps above 0 (Adam, AdamW, RMSprop, Adagrad: the "
                          "default 1e-8); a parameter with an exactly-zero gradient then stays "
                          "finite.")  # fmt: skip
    if found.computed:
        actions.insert(0, "Guard the standardisation against constant columns: divide by "
                          "(std + 1e-8), or drop the columns whose std is 0 before training "
                          "(they carry no information); do not drop rows.")
    source = found.located.get("source") or {}
    if source.get("file"):
        actions.insert(0, f"Fix {source['file']}:{source.get('line')}: {actions.pop(0)}")
    return actions
