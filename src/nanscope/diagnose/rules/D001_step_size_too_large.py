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
from typing import Any

import numpy as np

from nanscope.detectors import NOISE_FLOOR, Departure
from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num, row_text, tenfold_action
from nanscope.diagnose.rules._logs import from_log
from nanscope.outcome import FAR, UNSCALED_RATIO

CODE = "D001"
CAUSE = "step_size_too_large"
TITLE = "Step size too large"

#: a row this far out is worth naming next to a too-large step (heavy tails reach ~20 routinely)
OUTLIER_Z = 50.0


#: an update that moves the weights by more than this fraction of their norm is a large step
#: (healthy training moves them by ~1e-3 per update, ~1e-2 early with Adam: the tiny GPT of the
#: zoo at lr 1e-2 moves them by 0.9%; at lr 3, by 137%)
LARGE_UPDATE = 0.1


def check(ctx: Context) -> Finding | None:
    finding = _growth(ctx)
    if finding is None:
        finding = _departure(ctx)
    if finding is None:
        finding = _explosion(ctx)
    return finding


#: a loss that multiplies by this much in one update was thrown, not grown
EXPLOSION_JUMP = 100.0


def explosion(ctx: Context) -> tuple[int, float] | None:
    """``(index, factor)`` of the one-update jump the run never came back from, or None.

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
            moved = _step_size_at(ctx, i)
            if moved is None or moved < 1:
                continue
        after = loss[i:end]
        finite_after = after[np.isfinite(after)]
        stayed = not finite_after.size or float(np.min(finite_after)) > FAR * start
        if stayed:
            return i, (b / a if math.isfinite(b) else math.inf)
    return None


def _explosion(ctx: Context) -> Finding | None:
    found = explosion(ctx)
    if found is None:
        return None
    i, factor = found
    unit = "epoch" if ctx.granularity == "epoch" else "update"
    before, after = float(ctx.loss[i - 1]), float(ctx.loss[i])
    evidence = [
        Evidence(
            CODE,
            f"the loss jumped {num(factor)}x in one {unit} ({num(before)} -> {num(after)} at "
            f"{unit} {ctx.step_at(i)}) and never came back near where it started "
            f"({num(float(ctx.loss[0]))})",
            {"shape": "explosion", "jump": factor, "jump_from": before, "jump_to": after,
             "jump_step": ctx.step_at(i)},
        )
    ]  # fmt: skip
    confidence = 0.5
    moved = _step_size_at(ctx, i)
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
    if ctx.rows_near(i, ("extreme",), back=1):
        confidence = min(confidence, 0.4)  # an extreme row in that batch: the row may be it
        alternatives.append(("extreme_batch", 0.55))
    contributing = _contributing(ctx)
    actions = _step_actions(ctx, contributing)
    return Finding(
        rule=CODE,
        cause=CAUSE,
        confidence=confidence,
        evidence=evidence,
        actions=actions,
        step=ctx.step_at(i),
        contributing=contributing,
        alternatives=alternatives,
    )


def _step_size_at(ctx: Context, index: int) -> float | None:
    """||update|| / ||weights|| of the step that led into update ``index`` (the update norm is
    recorded on the update after the step; the weight norm carried from its last measurement)."""
    un = ctx.trace.column("update_norm")
    wn = ctx.trace.column("weight_norm")
    for j in (index, index - 1):
        if 0 <= j < ctx.n and math.isfinite(un[j]):
            known = wn[: j + 1][np.isfinite(wn[: j + 1])]
            if known.size and known[-1] > 0:
                return float(un[j] / known[-1])
    return None


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


def _growth(ctx: Context) -> Finding | None:
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
    if gc.size:
        reversal = float(np.mean(gc < 0))
        if reversal >= 0.5:
            oscillating = True
            evidence.append(
                Evidence(
                    CODE,
                    f"the gradient reversed direction in {int(np.sum(gc < 0))} of {gc.size} "
                    f"updates (median cosine between successive gradients {num(np.median(gc))})",
                    {"reversal_fraction": reversal, "median_grad_cos": float(np.median(gc))},
                )
            )
    if fl.size and float(np.max(fl)) >= 0.2:
        oscillating = True
        evidence.append(
            Evidence(
                CODE,
                f"up to {num(100 * float(np.max(fl)))}% of the weights flipped sign in one update",
                {"max_flip_fraction": float(np.max(fl)), "mean_flip_fraction": float(np.mean(fl))},
            )
        )
    if oscillating:
        confidence += 0.3
    if uc.size:
        downhill = float(np.min(uc)) < 0
        if downhill:
            confidence += 0.1
            evidence.append(
                Evidence(
                    CODE,
                    f"the updates still point downhill (cosine(update, gradient) down to "
                    f"{num(float(np.min(uc)))}): the direction is right, the step too long",
                    {"min_update_cos": float(np.min(uc))},
                )
            )
    elif not gc.size and not fl.size:
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
        )
    alternatives: list[tuple[str, float]] = [] if oscillating else [("update_sign_error", 0.25)]
    biggest = _largest_jump(ctx, rise)
    if biggest is not None and ctx.rows_near(biggest, ("extreme",), back=1):
        # the climb's largest rise came with an extreme row in its batch: that row may have
        # thrown the weights, not the step size (the replay without it decides)
        confidence = min(confidence, 0.5)
        alternatives.append(("extreme_batch", 0.6))
    contributing = _contributing(ctx)
    actions = _step_actions(ctx, contributing)
    step_index = (
        ctx.fail if ctx.fail is not None else (ctx.stop if ctx.stop is not None else rise.end)
    )
    return Finding(
        rule=CODE,
        cause=CAUSE,
        confidence=confidence,
        evidence=evidence,
        actions=actions,
        step=ctx.step_at(step_index),
        contributing=contributing,
        alternatives=alternatives,
    )


def _largest_jump(ctx: Context, rise: Any) -> int | None:
    """Index of the rise's largest single rise by ratio (positive losses), or None."""
    lo, hi = rise.start, rise.end
    window = ctx.loss[lo : hi + 1]
    if window.size < 2 or not np.all(np.isfinite(window)) or window.min() <= 0:
        return None
    return lo + 1 + int(np.argmax(window[1:] / window[:-1]))


def departure(ctx: Context) -> dict[str, Any] | None:
    """The departure that stopped the run, or the one under way where the trace ends (replayed
    with the detector over the updates before the failure), or None."""
    alarm = ctx.alarm
    if alarm and alarm.get("shape") == "departure":
        return dict(alarm)
    if ctx.stop is not None:
        return None  # stopped by another detector
    held = [e.get("step") for e in ctx.trace.meta.get("events") or []
            if isinstance(e, dict) and e.get("event") == "held"]  # fmt: skip
    detector = Departure()
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


def _departure(ctx: Context) -> Finding | None:
    dep = departure(ctx)
    if dep is None:
        return None
    unit = "epoch" if ctx.granularity == "epoch" else "update"
    ended = ctx.stop is None and ctx.fail is None
    if dep.get("climb"):
        text = (
            f"the loss climbed out of its range and kept climbing: best {num(dep['best'])} "
            f"(median of up to {Departure.SMOOTH} updates) at {unit} {dep['best_step']}, out of "
            f"its range (above {num(math.sqrt(dep['k']) * dep['best'])}) from {unit} "
            f"{dep['jump_from_step'] + 1}, and after {dep['window']} {unit}s out it is at "
            f"{num(dep['level'])}, {num(dep['factor'])}x its best and above where it started "
            f"({num(dep['start'])}), rising steadily (a line through the log of those "
            f"{unit}s climbs beyond its noise; their median {num(dep['plateau'])})"
        )
    else:
        text = (
            f"the loss left its range and did not come back: best {num(dep['best'])} (median "
            f"of up to {Departure.SMOOTH} updates) at {unit} {dep['best_step']}, then "
            f"{num(dep['jump_from'])} -> {num(dep['jump_to'])} in "
            f"{dep['jump_updates']} {unit}(s) ({unit} {dep['jump_from_step']} -> "
            f"{dep['jump_to_step']}), and {'it ended' if ended else 'it stayed'} "
            f"{dep['window']} {unit}s at a median {num(dep['plateau'])}, {num(dep['factor'])}x its "
            f"best (its range: below {num(math.sqrt(dep['k']) * dep['best'])})"
        )
    evidence = [
        Evidence(
            CODE,
            text,
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
    ratio = _update_ratio(ctx, dep)
    if ratio is not None:
        during, before = ratio
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
    optimizer = str(ctx.trace.meta.get("optimizer") or "")
    if "adam" in optimizer.lower():
        evidence.append(
            Evidence(
                CODE,
                f"{optimizer} normalises the step, so a learning rate too large shows as a jump "
                "to a plateau rather than as geometric growth to inf",
                {"optimizer": optimizer},
            )
        )
    jump_index = _index_of(ctx, dep["jump_to_step"])
    extreme = ctx.rows_near(jump_index, ("extreme",), back=dep["jump_updates"] + 1)
    alternatives: list[tuple[str, float]] = []
    if extreme:
        # one extreme row in the jump's batch threw the weights out: that row, not the lr
        confidence = 0.35
        alternatives.append(("extreme_batch", 0.6))
    cos = ctx.update_cos[: ctx.end]
    cos = cos[np.isfinite(cos)]
    downhill = cos.size >= 3 and float(np.mean(cos < 0)) > 0.8
    steady = dep["jump_updates"] > 3 and int(dep["best_step"] or 0) <= Departure.SMOOTH
    if steady and not downhill:
        # never below where it started, then a climb over many updates rather than a jump: the
        # update sign error's fingerprint as much as a step size's (only the loss can't tell)
        confidence = min(confidence, 0.45)
        alternatives.append(("update_sign_error", 0.45))
        if not cos.size:
            evidence.append(
                Evidence(
                    CODE,
                    "only the loss was recorded: a flipped update sign (w + lr * g) climbs the "
                    "same way; the cosine between update and gradient would tell them apart",
                    {"direction_recorded": False},
                )
            )
    if downhill and (steady or dep.get("climb")):
        evidence.append(
            Evidence(
                CODE,
                f"the updates point downhill (cosine(update, gradient) < 0 in "
                f"{num(100 * float(np.mean(cos < 0)))}% of them, median "
                f"{num(float(np.median(cos)))}) while the loss climbs: the direction is right, "
                "the step too long (a flipped sign would point them uphill)",
                {"downhill_fraction": float(np.mean(cos < 0)),
                 "median_update_cos": float(np.median(cos))},
            )
        )  # fmt: skip
    if cos.size >= 3 and float(np.mean(cos > 0)) > 0.8:
        confidence = min(confidence, 0.35)  # the updates climb the gradient: a sign error
        alternatives.append(("update_sign_error", 0.6))
    actions = [_cut_action(ctx)]
    if "adam" in optimizer.lower():
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
    if steady and not downhill:
        actions.append(
            "If the loss still climbs at a tenth of the learning rate, check the sign of the "
            "update: w = w - lr * grad."
        )
    actions.append("Record the learning rate that worked so the next run starts from it.")
    step_index = ctx.stop if ctx.stop is not None else (ctx.end - 1)
    return Finding(
        rule=CODE,
        cause=CAUSE,
        confidence=confidence,
        evidence=evidence,
        actions=actions,
        step=ctx.step_at(step_index),
        alternatives=alternatives,
    )


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
