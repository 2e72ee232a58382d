"""D005 log_of_zero: the loss formula took the log of a probability that rounded to 0 or 1.

What it does
    Looks at the first non-finite update: a loss that is inf or NaN while the gradient, the weights
    and the inputs are all finite means the loss formula itself made the infinity. With the
    PyTorch adapter the replay names the op (``log``, ``LogBackward0``) and settles it.

Why is this bad?
    Log loss ``-[y log p + (1-y) log(1-p)]`` is infinite when a positive example gets p exactly 0,
    or a negative one exactly 1; ``0 * log(0)`` is NaN. Large scores saturate the sigmoid to
    exactly 0 or 1 in floating point, often downstream of weights that have grown large.

Fingerprint
    The loss becomes inf/NaN while the weights and the data are finite (and, in a hand-written fit,
    the analytic gradient is finite too).

Evidence
    The non-finite loss next to the finite gradient norm, weight norm and inputs; how far the
    weights grew before; the located op when known.

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

_LOG_OPS = ("log", "xlogy", "binary_cross_entropy", "nll", "crossentropy", "cross_entropy")


def check(ctx: Context) -> Finding | None:
    i = ctx.fail
    if i is None:
        return None
    nf = ctx.nonfinite
    located = ctx.located or {}
    op = str(located.get("op") or "").lower()
    op_is_log = any(name in op for name in _LOG_OPS) and "softplus" not in op
    inputs_text = str(located.get("inputs", ""))
    input_zero = bool(located.get("input_zero")) or any(
        word in inputs_text for word in ("exactly 0", "exactly zero")
    )
    if nf["inputs"][i] > 0 or nf["targets"][i] > 0 or nf["params"][i] > 0:
        return None
    if not (nf["loss"][i] > 0 or ctx.filtered_nan[i]) and not op_is_log:
        return None
    evidence: list[Evidence] = []
    loss_value = ctx.loss[i]
    grad = ctx.trace.column("grad_norm")[i]
    grad_measured = ctx.trace.present("grad_norm")[i]
    if op_is_log:
        confidence = 0.95 if input_zero or not located.get("inputs") else 0.9
        evidence.append(
            Evidence(
                CODE,
                f"the first non-finite value came from {located.get('op')}"
                + (f" in {located['module']}" if located.get("module") else "")
                + (f", whose input was {located['inputs']}" if located.get("inputs") else ""),
                {"op": located.get("op"), "module": located.get("module")},
            )
        )
    elif grad_measured and math.isfinite(grad):
        confidence = 0.75 if loss_value == math.inf else 0.7
        evidence.append(
            Evidence(
                CODE,
                f"the loss is {num(loss_value)} at update {ctx.step_at(i)} while the gradient "
                f"(norm {num(grad)}), the weights and the inputs are all finite: the loss formula "
                "itself produced it, as log(p) does when p rounds to exactly 0 or 1",
                {"loss": loss_value, "grad_norm": float(grad)},
            )
        )
    elif located:
        return None  # the replay found another op
    else:
        confidence = 0.3
        evidence.append(
            Evidence(
                CODE,
                f"the loss is {num(loss_value)} at update {ctx.step_at(i)} with finite weights "
                "and inputs; the gradient was not recorded, so the loss formula is one suspect "
                "among several",
                {"loss": loss_value},
            )
        )
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
    return Finding(
        rule=CODE,
        cause=CAUSE,
        confidence=confidence,
        evidence=evidence,
        actions=list(ACTIONS),
        step=ctx.step_at(i),
        located=located or None,
        alternatives=[("zero_division", 0.15)] if not op_is_log else [],
    )
