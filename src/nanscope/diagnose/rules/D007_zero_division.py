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

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._producer import producer_of
from nanscope.numerics import HALF_TINY

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


def check(ctx: Context) -> Finding | None:
    located = ctx.located
    if not located:
        return None
    prod = producer_of(located)
    assert prod is not None
    op = prod.op
    family = _family(op) or _family(prod.forward_op)
    if family is None:
        return None
    inputs = prod.inputs
    zero = prod.zero and prod.kind not in ("past_range", "log_domain")
    if prod.inputs_nonfinite() or prod.kind == "past_range" or inputs == "past the half range":
        return None  # the value was already broken, or it is an overflow story
    phase = prod.phase or "forward"
    i = ctx.fail
    computed = phase == "preprocess" and prod.observed and zero
    if i is not None and not computed and (
        ctx.nonfinite["inputs"][i] > 0 or ctx.nonfinite["targets"][i] > 0
    ):
        return None
    evidence: list[Evidence] = []
    if zero:
        confidence = 0.92 if prod.observed else 0.7
        if computed:
            confidence = 0.97  # seen making the batch's NaN: not a bad row of the data
        if family == "root" and phase == "backward":
            what = (
                f"the gradient of {located.get('forward_op') or op} is infinite at 0: "
                f"{_where(located)} received exactly 0 in the backward"
            )
        elif family == "root":
            what = f"{_where(located)} took the root/norm of exactly 0"
        else:
            what = f"{_where(located)} divided by exactly 0 (0/0 is NaN, x/0 is inf)"
        values = prod.values_text()
        if values and "exactly 0" in values and values not in what:
            what += f"; {values}"
        what += f" [{prod.how()}, {phase}]"
        evidence.append(Evidence(CODE, what, {"op": op, "module": located.get("module"),
                                              "phase": phase, "inputs": inputs,
                                              "observed": prod.observed}))  # fmt: skip
        if computed:
            evidence.append(
                Evidence(
                    CODE,
                    "the NaN/inf in the batch is computed by this division "
                    + ("in the data preparation before training" if "data preparation" in
                       str(located.get("how")) else "in the training loop")
                    + ", not read from the data: the division is what to fix, not the rows",
                    {"phase": "preprocess"},
                )
            )
        chain = prod.chain_text()
        if chain:
            evidence.append(Evidence(CODE, chain, {"chain": located.get("chain")}))
    elif located.get("guessed") or not inputs or not prod.observed:
        confidence = 0.5
        if (family == "division" and phase == "forward" and i is not None
                and math.isnan(ctx.loss[i])):  # fmt: skip
            confidence = 0.6  # a NaN (not inf) loss from a division: 0/0
        evidence.append(
            Evidence(
                CODE,
                f"the first non-finite value is in the {phase} and the only op in the loss that "
                f"can make one from a finite value is {_where(located)}; its inputs were no "
                "longer kept, so whether they were exactly 0 is inferred",
                {"op": op, "phase": phase, "guessed": True, "observed": False},
            )
        )
    else:
        return None
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
        eps = ctx.trace.meta.get("optimizer_eps")
        if (str(located.get("dtype")) == "float16" and isinstance(eps, (int, float))
                and 0 < eps < HALF_TINY):  # fmt: skip
            # the script's eps is not 0: float16 made it 0 (D008's story)
            confidence = min(confidence, 0.5)
            alternatives.append(("fp16_overflow", 0.85))
    elif not computed and ("div" in op.lower() or family == "root"):
        evidence.append(
            Evidence(
                CODE,
                "zero vectors in a normalisation or a distance usually come from padding, masked "
                "positions or identical pairs",
                {},
            )
        )
    actions = [
        "Add an epsilon where it divides or takes the root: x / (norm + 1e-8), "
        "torch.sqrt(s + 1e-12), or clamp the divisor with .clamp_min(eps).",
        "Mask padded / empty positions out before the division and out of the loss.",
        "Use the safe library forms: F.normalize(x, dim=-1, eps=1e-8), "
        "F.cosine_similarity(a, b, dim=-1, eps=1e-8), torch.linalg.vector_norm instead of "
        "sqrt(sum(x**2)).",
    ]
    if phase == "optimizer":
        actions.insert(0, "Keep the optimizer's eps above 0 (Adam, AdamW, RMSprop, Adagrad: the "
                          "default 1e-8); a parameter with an exactly-zero gradient then stays "
                          "finite.")  # fmt: skip
    if computed:
        actions.insert(0, "Guard the standardisation against constant columns: divide by "
                          "(std + 1e-8), or drop the columns whose std is 0 before training "
                          "(they carry no information); do not drop rows.")
    source = located.get("source") or {}
    if source.get("file"):
        actions.insert(0, f"Fix {source['file']}:{source.get('line')}: {actions.pop(0)}")
    return Finding(
        rule=CODE,
        cause=CAUSE,
        confidence=confidence,
        evidence=evidence,
        actions=actions,
        step=ctx.step_at(i) if i is not None else located.get("step"),
        located=located,
        alternatives=alternatives + ([("log_of_zero", 0.1)] if not zero else []),
    )
