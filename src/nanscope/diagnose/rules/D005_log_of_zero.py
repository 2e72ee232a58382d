"""D005 log_of_zero: the loss formula took the log of a probability that rounded to 0 or 1.

What it does
    Follows the producer (the first op whose inputs were finite and whose output was not): it
    fires only when that op is log-like (``log``, ``xlogy``, ``binary_cross_entropy``, ``nll``) and,
    with full confidence, only when its argument was seen at exactly 0 or outside the log's domain.
    ``torch.special.entr`` and ``xlogy`` count as logs: finite at 0 in the forward, their gradient
    ``-(log p + 1)`` is not, so the producer is their backward node (a masked probability of 0).
    When another op produced the value it stays silent. When no producer was located (a numpy fit
    that silences its floating-point errors), a non-finite loss with a finite gradient, finite
    weights and finite inputs is an inferred suspicion, at lower confidence.

Why is this bad?
    Log loss ``-[y log p + (1-y) log(1-p)]`` is infinite when a positive example gets p exactly 0,
    or a negative one exactly 1; ``0 * log(0)`` is NaN. Large scores saturate the sigmoid to
    exactly 0 or 1 in floating point, often downstream of weights that have grown large.

Fingerprint
    The loss becomes inf/NaN while the weights and the data are finite (and, in a hand-written fit,
    the analytic gradient is finite too).

Evidence
    The producer op, its module and line, the value of its argument, observed or inferred, and the
    propagators after it; else the non-finite loss next to the finite gradient norm, weight norm
    and inputs; how far the weights grew before.

Action
    Compute the loss from the logits in a stable form (``log_softmax``, ``BCEWithLogitsLoss``,
    ``logaddexp``) or clip the probabilities into ``[eps, 1 - eps]``.

Example
    Logistic regression on separable data with ``np.log(sigmoid(X @ w))``: the weights keep growing,
    the sigmoid rounds to exactly 1.0, and ``0 * log(0)`` turns the loss NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nanscope.diagnose.context import Context, Rise
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import OUTLIER_Z, num, row_text, unit
from nanscope.diagnose.rules._producer import Producer, producer_of

CODE = "D005"
CAUSE = "log_of_zero"
TITLE = "Log of a probability that is exactly 0"

ACTIONS = [
    "Compute the loss from the logits in a numerically stable form (log_softmax / "
    "BCEWithLogitsLoss / np.logaddexp) instead of taking log of a rounded probability.",
    "Or clip the probabilities into [eps, 1 - eps] before the log (e.g. eps = 1e-7).",
    "If the weights grew large before it broke, regularise them (L2 / weight decay): large scores "
    "are what saturate the sigmoid or softmax.",
]


@dataclass(frozen=True)
class Fingerprint:
    """A non-finite loss with finite weights and data, and the log that made it where one was
    located."""

    fail: int  # index of the failing update
    #: the producer as the probes located it (a log of the same update that got 0 stands in
    #: for an earlier producer that was not a log)
    located: dict[str, Any]
    producer: Producer | None  # a view of ``located``
    log: bool  # the producer is a log
    other_op: bool  # the producer is an op other than a log, inferred (not seen)
    input_zero: bool  # the log's argument was seen at exactly 0 or out of its domain
    computed: bool  # the log made the batch's -inf/NaN in the training loop's preparation
    loss: float  # the failing loss
    filtered: bool  # that loss is a NaN a logging filter wrote as 0.0
    grad_norm: float  # the gradient norm at the failure (NaN when not recorded)
    grad_measured: bool  # the gradient norm was recorded at the failure
    weights_seen: bool  # the weights were recorded (finite) at the failure
    inputs_seen: bool  # the inputs were recorded (finite) at the failure
    rise: Rise | None  # the run of rising losses before the failure
    weights: tuple[float, float] | None  # the first and last finite weight norms up to it
    #: ||update|| / ||weights|| of the step into the failing update, where it was recorded
    moved: float | None = None


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The failure with finite weights and data, or None when another op or bad data made it."""
    i = ctx.fail
    if i is None:
        return None
    nf = ctx.nonfinite
    located, prod, op_is_log = _log_producer(ctx.located or {})
    other_op = prod is not None and prod.known and not op_is_log
    if other_op and prod is not None and prod.observed:
        return None  # another op produced it: log_of_zero only follows a log
    input_zero = prod is not None and (prod.zero or prod.kind == "log_domain")
    # (numpy saw the log of 0 itself; whether its value reached the batch may be inferred)
    computed = (prod is not None and op_is_log and prod.phase == "preprocess"
                and input_zero)  # fmt: skip
    if (nf["inputs"][i] > 0 or nf["targets"][i] > 0) and not computed:
        return None
    if nf["params"][i] > 0:
        return None
    if not (nf["loss"][i] > 0 or ctx.filtered_nan[i]) and not op_is_log:
        return None
    if prod is not None and op_is_log and prod.inputs_nonfinite():
        return None  # the log only propagated a value made earlier
    present = ctx.trace.present
    weights = ctx.trace.column("weight_norm")[: i + 1]
    weights = weights[np.isfinite(weights)]
    return Fingerprint(
        fail=i,
        located=located,
        producer=prod,
        log=op_is_log,
        other_op=other_op,
        input_zero=input_zero,
        computed=computed,
        loss=ctx.loss[i],
        filtered=bool(ctx.filtered_nan[i]),
        grad_norm=ctx.trace.column("grad_norm")[i],
        grad_measured=bool(present("grad_norm")[i]),
        weights_seen=bool(present("weight_norm")[i] or present("nf_params")[i]),
        inputs_seen=bool(present("nf_inputs")[i] or present("input_absmax")[i]),
        rise=ctx.rise_before(i),
        weights=(weights[0], weights[-1]) if weights.size >= 2 else None,
        moved=ctx.step_ratio_at(i),
    )


def _outlier_row(ctx: Context, found: Fingerprint) -> dict[str, Any] | None:
    """The finite outlier row (``OUTLIER_Z`` robust standard deviations out) of the failing
    update's own batch, when the loss broke there without a climb before it."""
    if found.computed:
        return None  # the log was the data preparation's: its 0 was in the data
    rise = found.rise
    if rise is not None and rise.length >= 3 and rise.growth >= 10:
        return None
    rows = [r for r in ctx.rows_near(found.fail, ("extreme",), back=0)
            if (r.get("z") or 0) >= OUTLIER_Z]  # fmt: skip
    return max(rows, key=lambda r: r.get("z") or 0) if rows else None


def _log_producer(located: dict[str, Any]) -> tuple[dict[str, Any], Producer | None, bool]:
    """The located producer, its view and whether it is a log; when it is not, another
    producer of the same update that was a log at 0 takes its place (it is the log's story)."""
    prod = producer_of(located)
    op_is_log = prod is not None and prod.is_log()
    also = prod.also_log() if prod is not None and not op_is_log else None
    if also is not None and prod is not None:
        first = prod.where()
        picked = {k: also.get(k) for k in ("op", "source", "message", "why")}
        located = {**located, **picked, "inputs": "exactly zero", "input_zero": True,
                   "note": f"an earlier op of the same update also overflowed: {first}"}
        prod = producer_of(located)
        op_is_log = True
    return located, prod, op_is_log


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    prod = found.producer
    if prod is not None and found.log:
        confidence, evidence = _producer_evidence(found, prod)
    else:
        confidence, evidence = _loss_evidence(ctx, found)
    rise = found.rise
    if not found.log and rise is not None and rise.length >= 3 and rise.growth >= 10:
        # the loss was already climbing geometrically: the inf is that climb overflowing
        confidence = min(confidence, 0.3)
        evidence.append(
            Evidence(
                CODE,
                f"but the loss had been growing for {rise.length} updates before "
                f"({num(rise.growth)}x): the infinity is more likely that growth overflowing",
                {"growth": rise.growth},
            )
        )
    if found.weights is not None:
        first, last = found.weights
        if first > 0 and last / first >= 3:
            evidence.append(
                Evidence(
                    CODE,
                    f"the weights grew {num(last / first)}x over the run "
                    f"(norm {num(first)} -> {num(last)}): large scores saturate the "
                    "sigmoid/softmax to exactly 0 or 1",
                    {"weight_growth": float(last / first)},
                )
            )
    alternatives = [] if found.log else [("zero_division", 0.15)]
    if found.moved is not None and found.moved >= 1 and not found.computed:
        # the step before replaced the model rather than nudged it: the 0 the log met is the
        # saturation that step made (a smaller step is the cure, not an epsilon at the log)
        confidence = min(confidence, 0.5)
        alternatives.insert(0, ("step_size_too_large", 0.7))
        evidence.append(Evidence(
            CODE, f"but the step into that update moved the weights by {num(found.moved)}x their "
            "own norm: a step that size saturates the scores, and the log met the 0 it made",
            {"update_to_weight": found.moved}))  # fmt: skip
    outlier = _outlier_row(ctx, found)
    if outlier is not None:
        # a typo in the batch (5e7 among values of order one) saturated the scores at once: the
        # log met the 0 that row made, and leaving the row out is the cure, not an epsilon
        confidence = min(confidence, 0.5)
        alternatives.insert(0, ("extreme_batch", 0.8))
        evidence.append(Evidence(
            CODE, f"but the batch of that update holds an outlier, {row_text(outlier)} "
            f"({num(outlier.get('z'))} robust standard deviations out), and the loss was not "
            "climbing before: that row's scores saturated, and the log met the 0 it made",
            {"row": outlier}))  # fmt: skip
    actions = list(ACTIONS)
    if prod is not None and found.log and prod.phase == "backward" and prod.observed:
        # the forward was finite (xlogy / entr are 0 at 0): the log is in the op's gradient
        evidence.append(Evidence(
            CODE, f"the forward of {prod.forward_op or prod.op} was finite; its gradient is not: "
            "d/dp of -p log p is -(log p + 1), -inf at p = 0 (a probability masked or rounded "
            "to exactly 0), and 0 * inf is NaN", {"phase": "backward"}))  # fmt: skip
        actions.insert(0, "Compute the entropy (or x log x) from log-probabilities: "
                          "-(p * log_p).sum(-1) with log_p = log_softmax(logits), whose gradient "
                          "is finite at p = 0; or clamp p to [eps, 1] before xlogy / entr.")
    located = found.located
    if found.computed:
        where_made = ("in the data preparation before training" if "data preparation" in
                      str(located.get("how")) else "in the training loop")  # fmt: skip
        seen = "the -inf/NaN in the batch is" if found.producer and found.producer.observed else (
            "the -inf/NaN the loss met is most likely")  # fmt: skip
        evidence.append(Evidence(
            CODE, f"{seen} computed by this log {where_made}, not read from the data",
            {"phase": "preprocess"}))  # fmt: skip
        src = located.get("source") or {}
        where = f"{src.get('file')}:{src.get('line')}" if src.get("file") else "the log"
        actions = [f"Fix {where}: a log transform of counts or amounts that can be 0 needs "
                   "log1p (log(1 + x)) or a clamp (x.clamp_min(eps)); do not drop the rows."]
    return Finding(CODE, CAUSE, confidence, evidence, actions, step=ctx.step_at(found.fail),
                   located=located or None,
                   alternatives=alternatives)  # fmt: skip


def _producer_evidence(found: Fingerprint, prod: Producer) -> tuple[float, list[Evidence]]:
    """The log that made the first non-finite value, seen or inferred."""
    if prod.observed and found.input_zero:
        confidence = 0.95
    elif prod.observed:
        confidence = 0.8  # a log made it, but its argument was not seen at 0
    else:
        confidence = 0.55  # inferred: the log is the likeliest op, its input unseen
    text = f"the first non-finite value came from {prod.where()}"
    values = prod.values_text()
    if values:
        text += f", {values}" if values.startswith("its") else f" ({values})"
    text += f" [{prod.how()}]"
    data = {"op": prod.op, "module": found.located.get("module"), "observed": prod.observed,
            "why": prod.why}
    evidence = [Evidence(CODE, text, data)]
    chain = prod.chain_text()
    if chain:
        evidence.append(Evidence(CODE, chain, {"chain": found.located.get("chain")}))
    return confidence, evidence


def _loss_evidence(ctx: Context, found: Fingerprint) -> tuple[float, list[Evidence]]:
    """No log was located: the loss next to what was recorded finite, suspected, not seen."""
    grad = found.grad_norm
    at = f"{unit(ctx)} {ctx.step_at(found.fail)}"
    loss_text = "NaN (logged as 0.0 by the logger's NaN filter)" if found.filtered else num(
        found.loss)
    seen = [what for what, yes in (("the weights", found.weights_seen),
                                   ("the inputs", found.inputs_seen)) if yes]  # fmt: skip
    if found.grad_measured and math.isfinite(grad):
        # no producer was located: the loss formula is suspected, not seen
        confidence = 0.6 if found.loss == math.inf else 0.55
        if found.other_op:
            confidence = 0.4  # an inferred producer that is not a log
        finite = ", ".join([f"the gradient (norm {num(grad)})", *seen])
        text = (
            f"the loss is {loss_text} at {at} while {finite} "
            f"{'are all' if ',' in finite else 'is'} finite: the loss formula made it; no op was "
            "located, so a log of a probability rounded to 0 or 1 is inferred, not seen"
        )
        return confidence, [Evidence(CODE, text, {"loss": found.loss, "grad_norm": float(grad),
                                                  "observed": False})]  # fmt: skip
    missing = ([] if found.grad_measured else ["the gradient"]) + (
        [] if seen else ["the weights", "the inputs"]
    )
    text = f"the loss is {loss_text} at {at}"
    if seen:
        text += f" with {' and '.join(seen)} finite"
    if found.grad_measured:
        text += f", the gradient norm {num(grad)} too"
    if missing:
        text += f"; {', '.join(missing[:-1])} and {missing[-1]}" if len(missing) > 1 else (
            f"; {missing[0]}")
        text += " were not recorded" if len(missing) > 1 else " was not recorded"
    text += ": the loss formula is one suspect among several"
    return 0.3, [Evidence(CODE, text, {"loss": found.loss})]
