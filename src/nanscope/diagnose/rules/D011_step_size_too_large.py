"""D011 step_size_too_large: a short run whose loss ended far above where it started.

What it does
    Looks at runs too short for the divergence fingerprint (fewer than :data:`SHORT` updates: the
    detectors need four rises in a row, the departure test a history): when the loss ends at its
    highest and at least three times where it started, still finite, it reports a step that
    overshot, at the confidence that makes the run suspect rather than healthy. A longer run is
    judged by D001's growth and departure tests instead.

Why is this bad?
    Gradient descent with a step the loss can take never ends a run above where it started; a
    loss that triples in a handful of updates (2.28 to 11.05 in two) is the first updates of a
    divergence, or of an adaptive optimizer's jump out of its basin, seen before the log ended.
    Calling it healthy because no NaN appeared yet misses the run that is about to break.

Fingerprint
    Fewer than eight updates; finite, positive losses; the last is the highest and at least 3x
    the first.

Evidence
    The first and last loss, the factor between them and the number of updates it took.

Action
    Cut the learning rate tenfold and rerun, longer, logging the loss every update (and the
    gradient norm): a run that keeps descending at the lower rate settles it.

Example
    Gradient descent on a quadratic whose curvature needs a step below 0.1, run at 0.5: the loss
    multiplies by about six per update, and the first two updates show it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num, tenfold_action, unit
from nanscope.diagnose.rules._logs import from_log

CODE = "D011"
CAUSE = "step_size_too_large"
TITLE = "A short run that ended far above its start"

#: runs shorter than this cannot show the detectors' fingerprint (four rises in a row, each
#: larger than the one before, need eight updates to tell from a noisy start)
SHORT = 8
#: the last loss this many times the first (and the highest of the run): far above its start
RISE = 3.0


@dataclass(frozen=True)
class Fingerprint:
    """A short run that ended at its highest loss, far above where it started."""

    first: float  # the first loss
    last: float  # the last loss, the run's highest
    records: int  # how many updates (or epochs) were recorded

    @property
    def ratio(self) -> float:
        return self.last / self.first


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The short run's rise, or None: a long run (the detectors judge it), a failure, or a loss
    that did not end far above its start."""
    if ctx.fail is not None or ctx.n < 2 or ctx.n >= SHORT:
        return None
    loss = ctx.loss
    if not bool(np.all(np.isfinite(loss))) or not bool(np.all(loss > 0)):
        return None
    first, last = float(loss[0]), float(loss[-1])
    if last < RISE * first or last < float(np.max(loss)):
        return None
    return Fingerprint(first, last, ctx.n)


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    ratio, n, each = found.ratio, found.records, unit(ctx)
    evidence = [
        Evidence(
            CODE,
            f"the loss rose {num(ratio)}x in {n - 1} {each}{'s' if n > 2 else ''} "
            f"({num(found.first)} -> {num(found.last)}) and ended at its highest: descent with a "
            "step the loss can take never ends a run above its start",
            {"first_loss": found.first, "last_loss": found.last, "ratio": ratio, "records": n},
        ),
        Evidence(
            CODE,
            f"only {n} {each}s were recorded: too few for the divergence fingerprint, so "
            "the step size is inferred from the rise alone",
            {"records": n, "observed": False},
        ),
    ]
    actions = [tenfold_action(ctx.lr_now)]
    if from_log(ctx):
        actions.append(
            "Rerun longer and log the loss (and the gradient norm) every update: a rise that "
            "goes on past a few updates is a divergence, one that turns back is noise."
        )
    else:
        actions.append("Let the run go on for a few more updates before judging it.")
    return Finding(CODE, CAUSE, 0.6 if math.isfinite(ratio) else 0.5, evidence, actions,
                   step=ctx.step_at(n - 1),
                   alternatives=[("extreme_batch", 0.3), ("exploding_gradients", 0.2)])
