"""D003 update_sign_error: the update climbs the loss instead of descending it.

What it does
    Measures the cosine between each applied update (weights now minus weights before) and the
    gradient. Descent makes it negative; a flipped sign makes it positive.

Why is this bad?
    ``w <- w + lr * g`` ascends. The loss rises smoothly and relentlessly from the very first
    update; it looks like a step size too large until you look at the code, and no learning rate
    fixes it.

Fingerprint
    The loss rises from update one, steadily, without oscillation; successive updates point the
    same way; cosine(update, gradient) is close to +1.

Evidence
    The fraction of updates that pointed along the gradient and the median cosine; the fraction
    of updates whose loss rose.

Action
    Fix the sign of the update (``w = w - lr * grad``); if you maximise a score, minimise its
    negative; ``nanscope lint`` flags ascent in hand-written loops.

Example
    A hand-written logistic regression whose update reads ``w += lr * grad``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num

CODE = "D003"
CAUSE = "update_sign_error"
TITLE = "The update ascends the loss"

#: cosine(update, gradient) above this: the update is the gradient itself, scaled (w += lr * g)
EXACTLY_ALONG = 0.99

ACTIONS = [
    "Fix the sign of the update: w = w - lr * grad (this fit adds the gradient, which climbs "
    "the loss).",
    "If the objective is a score to maximise, minimise its negative instead.",
    "Run `nanscope lint` on the training script: it flags updates that add lr * grad.",
]


@dataclass(frozen=True)
class Fingerprint:
    """A loss that rose before the failure (or the stop), and which way the updates pointed."""

    first: float  # the first finite loss
    last: float  # the last finite loss before the failure
    rises: int  # how many of the compared updates raised the loss
    compared: int  # how many successive finite losses were compared
    rising: float  # ``rises / compared``
    directed: bool  # cosine(update, gradient) was recorded on enough updates to go by
    along: float  # the share of those updates pointing along the gradient (NaN: not directed)
    median_update_cos: float  # their median cosine (NaN: not directed)


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The rise and the updates' direction, or None: a descent, an update that points downhill,
    or (only the loss recorded) a climb that accelerates like a step too large."""
    end = ctx.end if ctx.fail is None else ctx.fail
    loss = ctx.loss[:end]
    finite = loss[np.isfinite(loss)]
    if finite.size < 4:
        return None
    deltas = np.diff(finite)
    rising = float(np.mean(deltas > 0))
    cos = ctx.update_cos[:end]
    cos = cos[np.isfinite(cos)]
    # an update exactly along the gradient (cosine ~ +1: plain SGD turned round) is conclusive
    # from any number of measured updates; a noisier direction (momentum, Adam) needs several
    directed = cos.size >= 3 or (cos.size and bool(np.all(cos > EXACTLY_ALONG)))
    along = median = math.nan
    if directed:
        along = float(np.mean(cos > 0))
        median = float(np.median(cos))
        # a loss that left its range and stayed out (the departure detector) rose however noisy
        # its minibatches made the single updates
        departed = (ctx.alarm or {}).get("shape") == "departure"
        if along < 0.8 or median <= 0.3 or (rising < 0.6 and not departed):
            return None
        if finite[-1] <= finite[0]:
            return None
    else:
        # only the loss: a smooth, steady rise from step one that does not accelerate
        if rising < 0.9 or deltas.size < 5 or ctx.trace.has("grad_cos"):
            return None
        positive = deltas[deltas > 0]
        ratios = positive[1:] / positive[:-1]
        if ratios.size and float(np.median(ratios)) > 1.15:
            return None  # geometric growth: the step-size rule's case
    return Fingerprint(finite[0], finite[-1], int(np.sum(deltas > 0)), int(deltas.size), rising,
                       bool(directed), along, median)  # fmt: skip


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    step = ctx.step_at(ctx.break_index)
    if found.directed:
        along, median = found.along, found.median_update_cos
        confidence = 0.95 if along >= 0.95 else 0.85
        evidence = [
            Evidence(
                CODE,
                f"the applied update pointed along the gradient in {num(100 * along)}% of "
                f"updates (median cosine(update, gradient) {num(median)}; descent gives < 0)",
                {"along_fraction": along, "median_update_cos": median},
            ),
            Evidence(
                CODE,
                f"the loss rose in {found.rises} of {found.compared} updates, "
                f"{num(found.first)} -> {num(found.last)}",
                {"rising_fraction": found.rising, "first": float(found.first),
                 "last": float(found.last)},
            ),
        ]  # fmt: skip
        return Finding(CODE, CAUSE, confidence, evidence, list(ACTIONS), step=step)
    evidence = [
        Evidence(
            CODE,
            f"the loss rose smoothly from the first update in {found.rises} of "
            f"{found.compared} updates without accelerating ({num(found.first)} -> "
            f"{num(found.last)}); only the loss was recorded, so the update's direction "
            "could not be checked",
            {"rising_fraction": found.rising},
        )
    ]
    return Finding(CODE, CAUSE, 0.5, evidence, list(ACTIONS), step=step,
                   alternatives=[("step_size_too_large", 0.3)])
