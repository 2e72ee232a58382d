"""D012 step_size_too_large: a fit thrown far above its untrained loss that never got back below it.

What it does
    Reads a watched fit from its first update (a log may begin anywhere: it is not read). When
    nothing went non-finite and no detector stopped the run, but the loss climbed to ten times
    (:data:`~nanscope.outcome.FAR`) its first value or more and the fit ended (the median of its
    last updates) still above that first value, near it or far above it, it reports a step that
    overshoots. The cause is
    inferred from the curve, at the confidence that makes the run suspect; no replay decided it.

Why is this bad?
    At initialisation the model has fitted nothing, so one batch's loss is much like another's,
    and descent with a step the loss can take lowers it. A loss that climbs tenfold from there was
    thrown up the far side of its valley by the step. A fit that then ends above where it began
    learnt nothing in all its updates: it oscillates from wall to wall, or it survived a blow-up
    that the next seed will not. No NaN appeared, so nothing else says so, and the learning rate
    that did it is recorded as one that worked.

Fingerprint
    Finite losses from the first update; the highest at least 10x the first; the end above the
    first. A climb that comes back below the start is a curriculum step or a survived spike, not
    this.

Evidence
    The first loss, the peak and the update it was reached at, the end and its ratio to the first,
    and that the cause was inferred from the curve alone.

Action
    Cut the learning rate tenfold and rerun: a fit that then descends from its first update
    settles it (``nanscope sweep`` runs the cuts). Standardise input columns in raw units when the
    first batch shows them: they set the largest step a fit survives.

Example
    A softmax classifier trained by hand at lr 30: the loss goes from 1.1 to 40 in two updates,
    swings between 1 and 17 for the rest of the run and ends at 1.3, above where it began; at lr 3
    it descends from the first update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num, tenfold_action
from nanscope.outcome import FAR, UNSCALED_RATIO, OutcomeKind

CODE = "D012"
CAUSE = "step_size_too_large"
TITLE = "A fit thrown far above its start that never came back"

#: inferred from the curve alone: enough to make the run suspect, below any observed evidence
CONFIDENCE = 0.6


@dataclass(frozen=True)
class Fingerprint:
    """A watched fit whose loss climbed FAR times its first value and ended above it."""

    first: float  # the first update's loss: the model at initialisation
    peak: float  # the highest loss
    peak_step: int  # the update it was reached at
    end: float  # where the fit ended (the median of its last updates)
    peak_ratio: float  # peak against first
    end_ratio: float  # end against first (above 1)


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The climb, or None: a log (it may begin anywhere), a failure or a stop (the other rules
    read those), a climb it came back below its start from, or no climb of ``FAR``."""
    if not ctx.live or ctx.fail is not None or ctx.stop is not None:
        return None
    outcome = ctx.outcome
    if outcome.kind not in (OutcomeKind.RETURNED, OutcomeKind.BLOWN):
        return None
    if outcome.peak_ratio < FAR or outcome.end_ratio <= 1:
        return None  # (a spike it came back below, a 1000x excursion it survived)
    present = ctx.trace.present("loss")
    peak_at = int(ctx.loss[present].argmax())
    return Fingerprint(outcome.start, outcome.peak, int(ctx.steps[present][peak_at]),
                       outcome.end, outcome.peak_ratio, outcome.end_ratio)  # fmt: skip


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    evidence = [
        Evidence(
            CODE,
            f"the loss climbed from {num(found.first)} at the first update to {num(found.peak)} "
            f"at update {found.peak_step} ({num(found.peak_ratio)}x) and ended at "
            f"{num(found.end)}, {num(found.end_ratio)}x above where it began: from an untrained "
            "start, a step the loss can take does not raise it tenfold",
            {"first_loss": found.first, "peak_loss": found.peak, "peak_step": found.peak_step,
             "end_loss": found.end, "end_ratio": found.end_ratio},
        ),
        Evidence(
            CODE,
            "inferred from the loss curve: nothing broke, so no replay tested a smaller step",
            {"observed": False},
        ),
    ]
    actions = [tenfold_action(ctx.lr_now)]
    if any((r.get("input_scale_ratio") or 0) >= UNSCALED_RATIO for r in ctx.records[:1]):
        actions.append("Standardise the input columns in raw units: their scale sets the largest "
                       "step the fit survives.")  # fmt: skip
    confidence = CONFIDENCE if math.isfinite(found.peak_ratio) else CONFIDENCE - 0.1
    return Finding(CODE, CAUSE, confidence, evidence, actions, step=found.peak_step,
                   alternatives=[("extreme_batch", 0.3), ("exploding_gradients", 0.2)])
