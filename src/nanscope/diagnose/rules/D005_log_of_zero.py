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

import numpy as np

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num
from nanscope.diagnose.rules._producer import producer_of

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

def _unit(ctx: Context) -> str:
    return "epoch" if ctx.granularity == "epoch" else "update"


def _loss_text(ctx: Context, i: int) -> str:
    """The failing loss as logged: ``nan``, ``inf``, or a 0.0 a logging filter put for a NaN."""
    if ctx.filtered_nan[i]:
        return "NaN (logged as 0.0 by the logger's NaN filter)"
    return num(ctx.loss[i])


def _seen_finite(ctx: Context, i: int) -> list[str]:
    """What was recorded finite at update ``i`` besides the loss: only what a record holds."""
    present = ctx.trace.present
    seen = []
    if present("weight_norm")[i] or present("nf_params")[i]:
        seen.append("the weights")
    if present("nf_inputs")[i] or present("input_absmax")[i]:
        seen.append("the inputs")
    return seen


def check(ctx: Context) -> Finding | None:
    i = ctx.fail
    if i is None:
        return None
    nf = ctx.nonfinite
    located = ctx.located or {}
    prod = producer_of(located)
    op_is_log = prod is not None and prod.is_log()
    also = prod.also_log() if prod is not None and not op_is_log else None
    if also is not None and prod is not None:
        # another producer of the update was a log that got 0: it is the log's story
        first = prod.where()
        picked = {k: also.get(k) for k in ("op", "source", "message", "why")}
        located = {**located, **picked, "inputs": "exactly zero", "input_zero": True,
                   "note": f"an earlier op of the same update also overflowed: {first}"}
        prod = producer_of(located)
        op_is_log = True
    other_op = prod is not None and prod.known and not op_is_log
    if other_op and prod is not None and prod.observed:
        return None  # another op produced it: log_of_zero only follows a log
    input_zero = prod is not None and (prod.zero or prod.kind == "log_domain")
    computed = (prod is not None and op_is_log and prod.observed and prod.phase == "preprocess"
                and input_zero)  # fmt: skip
    if (nf["inputs"][i] > 0 or nf["targets"][i] > 0) and not computed:
        return None
    if nf["params"][i] > 0:
        return None
    if not (nf["loss"][i] > 0 or ctx.filtered_nan[i]) and not op_is_log:
        return None
    evidence: list[Evidence] = []
    loss_value = ctx.loss[i]
    grad = ctx.trace.column("grad_norm")[i]
    grad_measured = ctx.trace.present("grad_norm")[i]
    if prod is not None and op_is_log:
        if prod.inputs_nonfinite():
            return None  # the log only propagated a value made earlier
        if prod.observed and input_zero:
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
        data = {"op": prod.op, "module": located.get("module"), "observed": prod.observed,
                "why": prod.why}
        evidence.append(Evidence(CODE, text, data))
        chain = prod.chain_text()
        if chain:
            evidence.append(Evidence(CODE, chain, {"chain": located.get("chain")}))
    elif grad_measured and math.isfinite(grad):
        # no producer was located: the loss formula is suspected, not seen
        confidence = 0.6 if loss_value == math.inf else 0.55
        if other_op:
            confidence = 0.4  # an inferred producer that is not a log
        finite = ", ".join([f"the gradient (norm {num(grad)})", *_seen_finite(ctx, i)])
        evidence.append(
            Evidence(
                CODE,
                f"the loss is {_loss_text(ctx, i)} at {_unit(ctx)} {ctx.step_at(i)} while "
                f"{finite} {'are all' if ',' in finite else 'is'} finite: the loss formula made "
                "it; no op was located, so a log of a probability rounded to 0 or 1 is inferred, "
                "not seen",
                {"loss": loss_value, "grad_norm": float(grad), "observed": False},
            )
        )
    else:
        confidence = 0.3
        seen = _seen_finite(ctx, i)
        missing = ([] if grad_measured else ["the gradient"]) + (
            [] if seen else ["the weights", "the inputs"]
        )
        text = f"the loss is {_loss_text(ctx, i)} at {_unit(ctx)} {ctx.step_at(i)}"
        if seen:
            text += f" with {' and '.join(seen)} finite"
        if grad_measured:
            text += f", the gradient norm {num(grad)} too"
        if missing:
            text += f"; {', '.join(missing[:-1])} and {missing[-1]}" if len(missing) > 1 else (
                f"; {missing[0]}")
            text += " were not recorded" if len(missing) > 1 else " was not recorded"
        text += ": the loss formula is one suspect among several"
        evidence.append(Evidence(CODE, text, {"loss": loss_value}))
    rise = ctx.rise_before(i)
    if not op_is_log and rise is not None and rise.length >= 3 and rise.growth >= 10:
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
    weights = ctx.trace.column("weight_norm")[: i + 1]
    weights = weights[np.isfinite(weights)]
    if weights.size >= 2 and weights[0] > 0 and weights[-1] / weights[0] >= 3:
        evidence.append(
            Evidence(
                CODE,
                f"the weights grew {num(weights[-1] / weights[0])}x over the run "
                f"(norm {num(weights[0])} -> {num(weights[-1])}): large scores saturate the "
                "sigmoid/softmax to exactly 0 or 1",
                {"weight_growth": float(weights[-1] / weights[0])},
            )
        )
    actions = list(ACTIONS)
    if prod is not None and op_is_log and prod.phase == "backward" and prod.observed:
        # the forward was finite (xlogy / entr are 0 at 0): the log is in the op's gradient
        evidence.append(Evidence(
            CODE, f"the forward of {prod.forward_op or prod.op} was finite; its gradient is not: "
            "d/dp of -p log p is -(log p + 1), -inf at p = 0 (a probability masked or rounded "
            "to exactly 0), and 0 * inf is NaN", {"phase": "backward"}))  # fmt: skip
        actions.insert(0, "Compute the entropy (or x log x) from log-probabilities: "
                          "-(p * log_p).sum(-1) with log_p = log_softmax(logits), whose gradient "
                          "is finite at p = 0; or clamp p to [eps, 1] before xlogy / entr.")
    if computed:
        where_made = ("in the data preparation before training" if "data preparation" in
                      str(located.get("how")) else "in the training loop")  # fmt: skip
        evidence.append(Evidence(
            CODE, f"the -inf/NaN in the batch is computed by this log {where_made}, not read "
            "from the data", {"phase": "preprocess"}))  # fmt: skip
        src = located.get("source") or {}
        where = f"{src.get('file')}:{src.get('line')}" if src.get("file") else "the log"
        actions = [f"Fix {where}: a log transform of counts or amounts that can be 0 needs "
                   "log1p (log(1 + x)) or a clamp (x.clamp_min(eps)); do not drop the rows."]
    return Finding(
        rule=CODE,
        cause=CAUSE,
        confidence=confidence,
        evidence=evidence,
        actions=actions,
        step=ctx.step_at(i),
        located=located or None,
        alternatives=[] if op_is_log else [("zero_division", 0.15)],
    )
