"""D001 step_size_too_large: the update overshoots the minimum and lands further out each time.

What it does
    Looks at the updates before the failure (or before the divergence detector stopped the run)
    for a growth phase: consecutive updates whose loss rises, each rise larger than the last, while
    the gradient reverses direction and the weights flip sign. Failing that, for a departure (as
    Adam and AdamW diverge): the loss jumped out of its own range within a few updates and stayed
    out, many times above the best it had reached, never coming back.

Why is this bad?
    An oversized step jumps across the valley to a point higher up the other side, and the next
    step jumps back further still. The weights oscillate with growing magnitude until the loss
    overflows to ``inf`` and then ``NaN``. Training longer only gets there more thoroughly.

Fingerprint
    The loss grows geometrically over several updates (0.7, 1.4, 6, 90, 3e4, inf); successive
    gradients point in opposite directions; the weights alternate in sign and grow. The update
    still points downhill (cosine(update, gradient) < 0): the direction is right, the length wrong.
    Under an adaptive optimizer (Adam, AdamW) the step is normalised, so the loss does not grow
    geometrically: it jumps in 1-3 updates and plateaus far above its best (3.5 -> 20), and each
    update moves the weights by a large fraction of their norm. Just past the stability limit
    under minibatch noise the loss creeps up instead: no run of rises, no jump, a climb whose
    log rises steadily until it is many times its best, with the updates still pointing downhill
    (a flipped sign climbs the same way, pointing uphill: only the direction tells them apart).

Evidence
    The growth factor and number of rising updates; the fraction of updates where the gradient
    reversed; the sign-flip fraction; the cosine between update and gradient; for a departure, the
    best loss and its update, the jump (from, to, in how many updates), the plateau's level and
    length, and the update-to-weight ratio where it was recorded; as contributing findings, an
    unscaled input column (its scale against the median column's) or an extreme row.

Action
    Cut the learning rate tenfold and rerun (``nanscope sweep`` does it); standardise unscaled
    features; clip the gradient norm if the fit stays fragile; record the learning rate that worked.

Example
    Linear regression on a raw money-valued feature (values in the thousands) fit at lr=1.0: the
    loss multiplies by ~1e6 per update and reaches ``inf`` in a few dozen updates, while the same
    fit at lr=0.01 on standardised features converges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nanscope.detectors import NOISE_FLOOR
from nanscope.detectors import Departure as DepartureDetector
from nanscope.diagnose.context import Context, Rise
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import OUTLIER_Z, num, row_text, tenfold_action, unit
from nanscope.diagnose.rules._logs import from_log
from nanscope.outcome import FAR, UNSCALED_RATIO

CODE = "D001"
CAUSE = "step_size_too_large"
TITLE = "Step size too large"

#: an update that moves the weights by more than this fraction of their norm is a large step
#: (healthy training moves them by ~1e-3 per update, ~1e-2 early with Adam: the tiny GPT of the
#: zoo at lr 1e-2 moves them by 0.9%; at lr 3, by 137%)
LARGE_UPDATE = 0.1
#: a loss that multiplies by this much in one update was thrown, not grown
EXPLOSION_JUMP = 100.0


def check(ctx: Context) -> Finding | None:
    climb = growth(ctx)
    if climb is not None:
        return _growth_finding(ctx, climb)
    left = departure(ctx)
    if left is not None:
        return _departure_finding(ctx, left)
    thrown = explosion(ctx)
    if thrown is not None:
        return _explosion_finding(ctx, thrown)
    return None


# --------------------------------------------------------------------------- the growth phase


@dataclass(frozen=True)
class Growth:
    """A geometric climb of the loss before the failure (or the stop), and how the gradient and
    the weights moved during it."""

    rise: Rise  # the run of rising losses
    at: int  # index of the update the finding names: the failure, the stop or the rise's end
    gradients: int  # updates of the climb whose gradient direction was recorded
    reversed: int  # of them, those whose gradient pointed against the one before
    reversal: float  # ``reversed / gradients`` (NaN when none was recorded)
    median_grad_cos: float  # the median cosine between successive gradients (NaN: none)
    max_flip: float | None  # the largest share of weights that flipped sign in one update
    mean_flip: float | None  # the mean share (None when sign flips were not recorded)
    min_update_cos: float | None  # the least cosine(update, gradient) (None: not recorded)
    extreme_jump: bool  # the climb's largest rise came with an extreme row in its batch


def growth(ctx: Context) -> Growth | None:
    """The geometric climb before the failure, or None (a spike on noise, rounding at the float
    noise floor, an update that ascends the gradient)."""
    rise = ctx.rise
    broke = ctx.fail is not None or ctx.stop is not None
    if rise is None:
        return None
    if not rise.sustained:
        return None  # one jump on top of noise is a spike, not a geometric climb
    first = ctx.finite_loss[0] if ctx.finite_loss.size else math.nan
    if first > 0 and abs(ctx.loss[rise.end]) < NOISE_FLOOR * first:
        return None  # rounding at the float noise floor of the starting loss, not growth
    strong_growth = rise.length >= 3 and (rise.growth >= 10 or rise.geometric)
    explosive = rise.length >= 2 and rise.growth >= 1e3
    if broke:
        if not (strong_growth or explosive):
            return None
    elif not (rise.length >= 4 and rise.growth >= 10 and rise.geometric):
        return None
    lo, hi = rise.start + 1, rise.end + 1
    grad_cos = ctx.trace.column("grad_cos")[lo:hi]
    flips = ctx.trace.column("flip_frac")[lo:hi]
    cos = ctx.update_cos[lo:hi]
    same = ctx.trace.column("update_cos_same")[lo:hi]
    gc = grad_cos[np.isfinite(grad_cos)]
    fl = flips[np.isfinite(flips)]
    uc = np.concatenate([cos[np.isfinite(cos)], same[np.isfinite(same)]])
    # the update ascends in both conventions: a sign error, not a step size
    both = np.isfinite(cos) & np.isfinite(same)
    if both.any() and float(np.mean((cos[both] > 0) & (same[both] > 0))) > 0.5:
        return None
    biggest = _largest_jump(ctx, rise)
    return Growth(
        rise=rise,
        at=ctx.fail if ctx.fail is not None else (ctx.stop if ctx.stop is not None else rise.end),
        gradients=int(gc.size),
        reversed=int(np.sum(gc < 0)),
        reversal=float(np.mean(gc < 0)) if gc.size else math.nan,
        median_grad_cos=float(np.median(gc)) if gc.size else math.nan,
        max_flip=float(np.max(fl)) if fl.size else None,
        mean_flip=float(np.mean(fl)) if fl.size else None,
        min_update_cos=float(np.min(uc)) if uc.size else None,
        extreme_jump=biggest is not None and bool(ctx.rows_near(biggest, ("extreme",), back=1)),
    )


def _growth_finding(ctx: Context, found: Growth) -> Finding:
    rise = found.rise
    evidence = [
        Evidence(
            CODE,
            f"loss grew {num(rise.growth)}x over {rise.length} consecutive updates "
            f"({num(ctx.loss[rise.start])} -> {num(ctx.loss[rise.end])}), "
            f"{rise.accelerating} of {max(rise.length - 1, 0)} rises larger than the one before",
            {"growth": rise.growth, "rises": rise.length, "accelerating": rise.accelerating,
             "from_step": ctx.step_at(rise.start), "to_step": ctx.step_at(rise.end)},
        )
    ]  # fmt: skip
    confidence = 0.55
    oscillating = False
    if found.gradients and found.reversal >= 0.5:
        oscillating = True
        evidence.append(
            Evidence(
                CODE,
                f"the gradient reversed direction in {found.reversed} of {found.gradients} "
                f"updates (median cosine between successive gradients "
                f"{num(found.median_grad_cos)})",
                {"reversal_fraction": found.reversal, "median_grad_cos": found.median_grad_cos},
            )
        )
    if found.max_flip is not None and found.max_flip >= 0.2:
        oscillating = True
        evidence.append(
            Evidence(
                CODE,
                f"up to {num(100 * found.max_flip)}% of the weights flipped sign in one update",
                {"max_flip_fraction": found.max_flip, "mean_flip_fraction": found.mean_flip},
            )
        )
    if oscillating:
        confidence += 0.3
    if found.min_update_cos is not None:
        if found.min_update_cos < 0:
            confidence += 0.1
            evidence.append(
                Evidence(
                    CODE,
                    f"the updates still point downhill (cosine(update, gradient) down to "
                    f"{num(found.min_update_cos)}): the direction is right, the step too long",
                    {"min_update_cos": found.min_update_cos},
                )
            )
    elif not found.gradients and found.max_flip is None:
        if rise.length >= 5 and rise.growth >= 1e3:
            confidence += 0.15  # a long, explosive geometric climb: rarely anything else
        evidence.append(
            Evidence(
                CODE,
                "only the loss was recorded: "
                + ("log the gradient norm per update next time (or rerun under `nanscope run`) "
                   "to see the gradient reverse and confirm it" if from_log(ctx)
                   else "pass params and grads to Monitor.update to see the weights oscillate "
                   "and confirm it"),
                {},
            )
        )  # fmt: skip
    alternatives: list[tuple[str, float]] = [] if oscillating else [("update_sign_error", 0.25)]
    if found.extreme_jump:
        # the climb's largest rise came with an extreme row in its batch: that row may have
        # thrown the weights, not the step size (the replay without it decides)
        confidence = min(confidence, 0.5)
        alternatives.append(("extreme_batch", 0.6))
    return _step_finding(ctx, confidence, evidence, found.at, alternatives)


def _largest_jump(ctx: Context, rise: Rise) -> int | None:
    """Index of the rise's largest single rise by ratio (positive losses), or None."""
    lo, hi = rise.start, rise.end
    window = ctx.loss[lo : hi + 1]
    if window.size < 2 or not np.all(np.isfinite(window)) or window.min() <= 0:
        return None
    return lo + 1 + int(np.argmax(window[1:] / window[:-1]))


# --------------------------------------------------------------------------- the departure


@dataclass(frozen=True)
class Departure:
    """The loss left its range and stayed out (as Adam and AdamW diverge), or climbed out."""

    jump: dict[str, Any]  # the departure detector's data: best, jump, plateau, factor, climb
    at: int  # index of the update the finding names: the stop, or the last one
    ended: bool  # the trace ended on the plateau (nothing stopped the run)
    #: the median ||update|| / ||weights|| after the jump and before it, where both were recorded
    update_ratio: tuple[float, float | None] | None
    optimizer: str  # the optimizer's class name, where it was recorded
    extreme: bool  # an extreme row was in the jump's batches
    directions: int  # updates whose cosine(update, gradient) was recorded
    downhill_share: float  # the share of them pointing downhill (NaN when none)
    uphill_share: float  # the share pointing uphill (NaN when none)
    median_update_cos: float  # their median cosine (NaN when none)

    @property
    def downhill(self) -> bool:
        return self.directions >= 3 and self.downhill_share > 0.8

    @property
    def uphill(self) -> bool:
        """The updates climb the gradient: a sign error's direction."""
        return self.directions >= 3 and self.uphill_share > 0.8

    @property
    def steady(self) -> bool:
        """Never below where it started, then a climb over many updates rather than a jump."""
        return self.jump["jump_updates"] > 3 and int(
            self.jump["best_step"] or 0) <= DepartureDetector.SMOOTH


def departure(ctx: Context) -> Departure | None:
    """The departure that stopped the run, or the one under way where the trace ends (replayed
    with the detector over the updates before the failure), or None."""
    dep = _departed(ctx)
    if dep is None:
        return None
    cos = ctx.update_cos[: ctx.end]
    cos = cos[np.isfinite(cos)]
    jump_index = _index_of(ctx, dep["jump_to_step"])
    return Departure(
        jump=dep,
        at=ctx.stop if ctx.stop is not None else (ctx.end - 1),
        ended=ctx.stop is None and ctx.fail is None,
        update_ratio=_update_ratio(ctx, dep),
        optimizer=str(ctx.trace.meta.get("optimizer") or ""),
        extreme=bool(ctx.rows_near(jump_index, ("extreme",), back=dep["jump_updates"] + 1)),
        directions=int(cos.size),
        downhill_share=float(np.mean(cos < 0)) if cos.size else math.nan,
        uphill_share=float(np.mean(cos > 0)) if cos.size else math.nan,
        median_update_cos=float(np.median(cos)) if cos.size else math.nan,
    )


def _departed(ctx: Context) -> dict[str, Any] | None:
    """The departure detector's data: from the alarm that stopped the run, or replayed."""
    alarm = ctx.alarm
    if alarm and alarm.get("shape") == "departure":
        return dict(alarm)
    if ctx.stop is not None:
        return None  # stopped by another detector
    held = [e.get("step") for e in ctx.trace.meta.get("events") or []
            if isinstance(e, dict) and e.get("event") == "held"]  # fmt: skip
    detector = DepartureDetector()
    found: dict[str, Any] | None = None
    for record in ctx.records[: ctx.end]:
        fired = detector.step(record)
        if fired is not None:
            found = dict(fired.data)
            break
    if found is None:
        found = detector.state()
        if found is None or found["window"] < detector.WINDOW:
            return None
        # still out of its range where the trace ends, however long the jump took
    if any(isinstance(h, int) and found["jump_to_step"] <= h for h in held):
        return None  # the run showed that step-up was its data's, not the weights'
    return found


def _departure_finding(ctx: Context, found: Departure) -> Finding:
    dep = found.jump
    evidence = [
        Evidence(
            CODE,
            _departure_text(ctx, found),
            {"best_loss": dep["best"], "best_step": dep["best_step"],
             "jump_from": dep["jump_from"], "jump_from_step": dep["jump_from_step"],
             "jump_to": dep["jump_to"], "jump_to_step": dep["jump_to_step"],
             "jump_updates": dep["jump_updates"], "plateau": dep["plateau"],
             "plateau_updates": dep["window"], "factor": dep["factor"], "k": dep["k"],
             "level": dep.get("level", dep["plateau"]), "climb": bool(dep.get("climb"))},
        )
    ]  # fmt: skip
    confidence = 0.6
    if dep["jump_updates"] <= 3:
        confidence += 0.1  # a jump, not a drift
    if found.update_ratio is not None:
        during, before = found.update_ratio
        if during >= LARGE_UPDATE:
            confidence += 0.1
        evidence.append(
            Evidence(
                CODE,
                f"each update moved the weights by a median {num(100 * during)}% of their norm "
                f"after the jump (norm as last measured)"
                + (f" ({num(100 * before)}% before it)" if before is not None else "")
                + (": steps that large throw the fit out of its valley" if during >= LARGE_UPDATE
                   else ""),
                {"update_to_weight": during, "update_to_weight_before": before},
            )
        )  # fmt: skip
    optimizer = found.optimizer
    if "adam" in optimizer.lower():
        evidence.append(
            Evidence(
                CODE,
                f"{optimizer} normalises the step, so a learning rate too large shows as a jump "
                "to a plateau rather than as geometric growth to inf",
                {"optimizer": optimizer},
            )
        )
    alternatives: list[tuple[str, float]] = []
    if found.extreme:
        # one extreme row in the jump's batch threw the weights out: that row, not the lr
        confidence = 0.35
        alternatives.append(("extreme_batch", 0.6))
    if found.steady and not found.downhill:
        # never below where it started, then a climb over many updates rather than a jump: the
        # update sign error's fingerprint as much as a step size's (only the loss can't tell)
        confidence = min(confidence, 0.45)
        alternatives.append(("update_sign_error", 0.45))
        if not found.directions:
            evidence.append(
                Evidence(
                    CODE,
                    "only the loss was recorded: a flipped update sign (w + lr * g) climbs the "
                    "same way; the cosine between update and gradient would tell them apart",
                    {"direction_recorded": False},
                )
            )
    if found.downhill and (found.steady or dep.get("climb")):
        evidence.append(
            Evidence(
                CODE,
                f"the updates point downhill (cosine(update, gradient) < 0 in "
                f"{num(100 * found.downhill_share)}% of them, median "
                f"{num(found.median_update_cos)}) while the loss climbs: the direction is right, "
                "the step too long (a flipped sign would point them uphill)",
                {"downhill_fraction": found.downhill_share,
                 "median_update_cos": found.median_update_cos},
            )
        )  # fmt: skip
    if found.uphill:
        confidence = min(confidence, 0.35)  # the updates climb the gradient: a sign error
        alternatives.append(("update_sign_error", 0.6))
    return Finding(CODE, CAUSE, confidence, evidence, _departure_actions(ctx, found),
                   step=ctx.step_at(found.at), alternatives=alternatives)


def _departure_text(ctx: Context, found: Departure) -> str:
    dep, each = found.jump, unit(ctx)
    if dep.get("climb"):
        return (
            f"the loss climbed out of its range and kept climbing: best {num(dep['best'])} "
            f"(median of up to {DepartureDetector.SMOOTH} updates) at {each} {dep['best_step']}, "
            f"out of its range (above {num(math.sqrt(dep['k']) * dep['best'])}) from {each} "
            f"{dep['jump_from_step'] + 1}, and after {dep['window']} {each}s out it is at "
            f"{num(dep['level'])}, {num(dep['factor'])}x its best and above where it started "
            f"({num(dep['start'])}), rising steadily (a line through the log of those "
            f"{each}s climbs beyond its noise; their median {num(dep['plateau'])})"
        )
    return (
        f"the loss left its range and did not come back: best {num(dep['best'])} (median "
        f"of up to {DepartureDetector.SMOOTH} updates) at {each} {dep['best_step']}, then "
        f"{num(dep['jump_from'])} -> {num(dep['jump_to'])} in "
        f"{dep['jump_updates']} {each}(s) ({each} {dep['jump_from_step']} -> "
        f"{dep['jump_to_step']}), and {'it ended' if found.ended else 'it stayed'} "
        f"{dep['window']} {each}s at a median {num(dep['plateau'])}, {num(dep['factor'])}x its "
        f"best (its range: below {num(math.sqrt(dep['k']) * dep['best'])})"
    )


def _departure_actions(ctx: Context, found: Departure) -> list[str]:
    actions = [_cut_action(ctx)]
    if "adam" in found.optimizer.lower():
        actions.append(
            "With warm-up and a schedule, the peak learning rate is the one to cut; clipping the "
            "gradient norm does not bound an adaptive optimizer's step (about lr per weight)."
        )
    elif _clips(ctx):
        actions.append(
            "The script already clips the gradient norm: each step is still up to lr x max_norm "
            "long, so it is the learning rate to cut, not the clipping to add."
        )
    elif _scheduled(ctx):
        actions.append("With warm-up and a schedule, the peak learning rate is the one to cut.")
    if found.steady and not found.downhill:
        actions.append(
            "If the loss still climbs at a tenth of the learning rate, check the sign of the "
            "update: w = w - lr * grad."
        )
    actions.append("Record the learning rate that worked so the next run starts from it.")
    return actions


# --------------------------------------------------------------------------- the explosion


@dataclass(frozen=True)
class Explosion:
    """A one-update jump of the loss the run never came back from."""

    index: int  # index of the update the loss jumped to
    factor: float  # how many times the loss multiplied in that update (inf: to non-finite)
    before: float  # the loss before the jump
    after: float  # the loss it jumped to
    start: float  # the first loss
    moved: float | None  # ||update|| / ||weights|| of the step into it, where recorded
    extreme: bool  # an extreme row was in its batch (or the one before)


def explosion(ctx: Context) -> Explosion | None:
    """The one-update jump the run never came back from, or None.

    The jump: the loss multiplied by ``EXPLOSION_JUMP`` or more in one update after update 1 (or
    went from finite to non-finite right after a step that moved the weights by more than their
    own norm), and from then on the run either broke (non-finite, or stopped) or stayed more than
    ``FAR`` times above where it started."""
    loss = ctx.loss
    end = min(ctx.end + 1, ctx.n) if ctx.fail is not None else ctx.end
    outcome = ctx.outcome
    broke = ctx.fail is not None or ctx.stop is not None or outcome.kind == "blown"
    if not broke or end < 2:
        return None
    start = float(loss[0]) if math.isfinite(loss[0]) else math.nan
    if not start > 0:
        return None
    for i in range(1, end):
        a, b = float(loss[i - 1]), float(loss[i])
        if not (math.isfinite(a) and a > 0):
            continue
        if math.isfinite(b):
            if b < EXPLOSION_JUMP * a:
                continue
        else:
            # a NaN after a long descent says nothing of the step; one after a step that moved
            # the weights by more than their own norm does
            moved = ctx.step_ratio_at(i)
            if moved is None or moved < 1:
                continue
        after = loss[i:end]
        finite_after = after[np.isfinite(after)]
        stayed = not finite_after.size or float(np.min(finite_after)) > FAR * start
        if stayed:
            return Explosion(i, (b / a if math.isfinite(b) else math.inf), a, b, start,
                             ctx.step_ratio_at(i),
                             bool(ctx.rows_near(i, ("extreme",), back=1)))  # fmt: skip
    return None


def _explosion_finding(ctx: Context, found: Explosion) -> Finding:
    each, i = unit(ctx), found.index
    evidence = [
        Evidence(
            CODE,
            f"the loss jumped {num(found.factor)}x in one {each} ({num(found.before)} -> "
            f"{num(found.after)} at {each} {ctx.step_at(i)}) and never came back near where it "
            f"started ({num(found.start)})",
            {"shape": "explosion", "jump": found.factor, "jump_from": found.before,
             "jump_to": found.after, "jump_step": ctx.step_at(i)},
        )
    ]  # fmt: skip
    confidence = 0.5
    moved = found.moved
    if moved is not None:
        evidence.append(
            Evidence(
                CODE,
                f"the step into it moved the weights by {num(moved)}x their own norm"
                + (": one step replaced the model rather than nudged it" if moved >= 1 else ""),
                {"update_to_weight": moved},
            )
        )
        if moved >= 1:
            confidence += 0.2
    alternatives: list[tuple[str, float]] = []
    if found.extreme:
        confidence = min(confidence, 0.4)  # an extreme row in that batch: the row may be it
        alternatives.append(("extreme_batch", 0.55))
    return _step_finding(ctx, confidence, evidence, i, alternatives)


# --------------------------------------------------------------------------- shared


def _step_finding(ctx: Context, confidence: float, evidence: list[Evidence], at: int,
                  alternatives: list[tuple[str, float]]) -> Finding:
    """The Finding of a growth or an explosion: the step to cut, with what contributed to it
    (an unscaled column, an outlier row) named and acted on first."""
    contributing = _contributing(ctx)
    return Finding(CODE, CAUSE, confidence, evidence, _step_actions(ctx, contributing),
                   step=ctx.step_at(at), contributing=contributing, alternatives=alternatives)


def _step_actions(ctx: Context, contributing: list[Evidence]) -> list[str]:
    """What to do about a step too large, the unscaled column first when there is one."""
    actions: list[str] = []
    for item in contributing:
        if item.data.get("kind") == "unscaled_column":
            actions.append(
                f"Standardise input column {item.data['column']} (subtract its mean, divide by its "
                "std): its scale dwarfs the other columns, so a step size that suits them is "
                "far too long along its weights."
            )
    actions.append(_cut_action(ctx))
    for item in contributing:
        if item.data.get("kind") == "extreme_row":
            actions.append(
                "Check whether the outlier row dominates the gradient; squared error weights a "
                "large residual quadratically."
            )
    if not _clips(ctx):
        actions.append("If the loss is still fragile after the cut, clip the gradient norm.")
    actions.append("Record the learning rate that worked so the next run starts from it.")
    return actions


def _clips(ctx: Context) -> bool:
    """The script clips the gradient norm (the adapter recorded the pre-clip norm)."""
    return any((r.get("extra") or {}).get("grad_norm_source") == "pre_clip" for r in ctx.records)


def _index_of(ctx: Context, step: Any) -> int | None:
    if step is None:
        return None
    hits = np.flatnonzero(ctx.steps == int(step))
    return int(hits[0]) if hits.size else None


def _cut_action(ctx: Context) -> str:
    """The tenfold cut, of the lr the optimizer was built with when a schedule had not reached it
    yet (a warm-up stopped early): that is the number in the user's config."""
    peak = _peak_lr(ctx)
    built = ctx.trace.meta.get("optimizer_lr")
    if (isinstance(built, (int, float)) and peak and _scheduled(ctx)
            and float(built) > 1.05 * peak):  # fmt: skip
        return (
            f"Cut the learning rate tenfold (the optimizer's lr {num(float(built))} -> "
            f"{num(float(built) / 10)}; its schedule had reached {num(peak)} when the run "
            "stopped) and rerun: if the loss then descends, the step size was the cause "
            "(`nanscope sweep` runs this for you)."
        )
    return tenfold_action(peak)


def _scheduled(ctx: Context) -> bool:
    """The recorded lr changed during the run (a warm-up or a schedule), by more than the noise
    of an lr read off a hand-made update."""
    lr = ctx.trace.column("lr")[: max(ctx.end, 1)]
    lr = lr[np.isfinite(lr) & (lr > 0)]
    return bool(lr.size >= 2 and float(lr.max()) > 1.2 * float(lr.min()))


def _peak_lr(ctx: Context) -> float | None:
    lr = ctx.trace.column("lr")[: max(ctx.end, 1)]
    lr = lr[np.isfinite(lr)]
    return float(lr.max()) if lr.size else None


def _update_ratio(ctx: Context, dep: dict[str, Any]) -> tuple[float, float | None] | None:
    """Median ||update|| / ||weights|| after the jump (and before it), where both were recorded."""
    un = ctx.trace.column("update_norm")[: ctx.end]
    wn = ctx.trace.column("weight_norm")[: ctx.end].copy()
    # the weight norm is taken on full updates only: carry the last one measured forward
    for i in range(1, wn.size):
        if not np.isfinite(wn[i]):
            wn[i] = wn[i - 1]
    with np.errstate(all="ignore"):
        ratio = un / wn
    ok = np.isfinite(ratio) & (wn > 0)
    split = _index_of(ctx, dep["jump_to_step"])
    if split is None:
        return None
    after = ratio[split:][ok[split:]]
    before = ratio[:split][ok[:split]]
    if not after.size:
        return None
    return float(np.median(after)), (float(np.median(before)) if before.size else None)


def _contributing(ctx: Context) -> list[Evidence]:
    out: list[Evidence] = []
    for record in ctx.records[: max(ctx.end, 1)]:
        ratio = record.get("input_scale_ratio")
        if ratio is not None and ratio >= UNSCALED_RATIO:
            column = _widest_column(ctx)
            out.append(
                Evidence(
                    CODE,
                    f"input column {column} is {num(ratio)}x larger in scale than the median "
                    f"column (max |x| = {num(record.get('input_absmax'))}): an unscaled feature",
                    {"kind": "unscaled_column", "ratio": ratio, "column": column},
                )
            )
            break
    extreme = [r for r in ctx.rows if r.get("why") == "extreme" and (r.get("z") or 0) >= OUTLIER_Z]
    if extreme:
        row = max(extreme, key=lambda r: r.get("z") or 0.0)
        out.append(
            Evidence(CODE, f"an outlier row: {row_text(row)}", {"kind": "extreme_row", **row})
        )
    return out


def _widest_column(ctx: Context) -> object:
    for record in ctx.records:
        if record.get("input_scale_column") is not None:
            return record["input_scale_column"]
    return "?"
