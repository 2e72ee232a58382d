"""D004 extreme_batch: one extreme row produced one huge update after a long, healthy descent.

What it does
    When the loss descended for many updates and then spiked (to inf/NaN, or a finite jump far
    above its recent history), looks in the batch of the spike and the one before it for a finite
    row that sits far out from the others (robust z-score: distance from the batch median in units
    of the median absolute deviation).

Why is this bad?
    A single extreme row makes a residual, and so a gradient, orders of magnitude larger than usual;
    one update then throws the weights far out, and the loss overflows. A globally wrong step size
    would have failed at the start; this fit was fine until that batch.

Fingerprint
    Loss descends for many updates, then one spike to inf/NaN with no growth phase before it,
    or one jump to a plateau the run never comes back from (the weights thrown far out), or one
    jump whose aftermath (an update or two more of growth) ended the run or was stopped as a
    climb: the jump's own update carries most of the growth, and a cascade of spikes is named
    at its first update, whose batch threw the weights. Or the
    fit broke within its first three updates and the batch of update 1 holds a row 50 robust
    standard deviations out: there is no loss before it to jump from, and the row was seen.

Evidence
    The spike (its ratio to the recent loss), how long the descent lasted, and the extreme row:
    batch row, dataset row where known, column, value and robust z-score; where the row's value
    overflowed, the producer (an ``exp`` or a squared error that got finite, huge inputs, or an op
    whose non-finite output was in the extreme row's batch row alone, a backward node included)
    with its module and line.

Action
    Inspect or drop that row; clip the gradient norm so one row cannot dominate an update; a robust
    loss (Huber) or winsorising the column limits the damage of outliers under squared error.

Example
    Minibatch SGD on clean data where one row carries a value 1e4 times the others': the loss
    falls for 60 updates and goes inf at the update after that row's batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import OUTLIER_Z, num, row_text, unit
from nanscope.diagnose.rules._producer import Producer, producer_of

CODE = "D004"
CAUSE = "extreme_batch"
TITLE = "One extreme batch after a long descent"

SPIKE = 10.0
#: a fit that broke within this many updates of its start, on a first batch holding an outlier
EARLY = 3


def _departed(ctx: Context) -> bool:
    """Stopped on a jump: a departure's plateau or an explosion (not a sustained climb)."""
    alarm = ctx.alarm or {}
    return ctx.fail is None and ctx.stop is not None and alarm.get("shape") in (
        "departure", "explosion")


def _spike_index(ctx: Context) -> int | None:
    if ctx.fail is not None:
        return ctx.fail
    if _departed(ctx):
        # stopped on a plateau after a jump: the jump is the spike
        alarm = ctx.alarm or {}
        step = alarm.get("jump_to_step", alarm.get("jump_step"))
        hits = np.flatnonzero(ctx.steps == int(step)) if step is not None else np.array([])
        if hits.size:
            return int(hits[0])
    # no NaN: the largest finite spike tagged by the detector
    best, best_ratio = None, SPIKE
    for i, record in enumerate(ctx.records):
        if "loss_spike" in (record.get("events") or []):
            ratio = ctx.spike_ratio(i)
            if math.isfinite(ratio) and ratio >= best_ratio:
                best, best_ratio = i, ratio
    # a cascade (1.09 -> 570 -> 2.7e4 -> 5.7e4) measures largest at its end, against a recent
    # level it has not yet moved: it began at its first update, whose batch threw the weights
    while best is not None and best >= 1 and ctx.spike_ratio(best - 1) >= SPIKE:
        best -= 1
    return best


@dataclass(frozen=True)
class Fingerprint:
    """A jump after a long descent (or a long steady stretch), and what its batch held."""

    spike: int  # index of the update that broke, of the jump that stopped the run, or the spike
    onset: int  # index of the update where the jump began
    at: int  # index of the update the finding names (the stop, when a detector stopped the run)
    descended: bool  # the loss descended before the jump (else it held steady)
    first: float  # the first finite loss
    last: float  # the last finite loss before the jump
    jumped_to: float  # the loss at the onset
    filtered: bool  # that loss is a NaN a logging filter wrote as 0.0
    ratio: float  # the onset's loss against the recent loss
    broke: bool  # the loss went non-finite (not only stopped)
    departed: bool  # a detector stopped the run on a jump to a plateau or an explosion
    rows: tuple[dict[str, Any], ...]  # the extreme rows of the jump's batches, largest z first
    inputs_measured: bool  # the inputs' magnitudes were recorded
    overflow: Producer | None  # the op where an extreme row's value went non-finite
    at_row: bool  # that op's non-finite output was in the extreme rows' batch rows alone


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The jump and its batch (or the first batch's outlier that broke the fit at once), or
    None when the loss grew into it or broke early with no outlier seen."""
    return _jump(ctx) or _first_batch(ctx)


def _jump(ctx: Context) -> Fingerprint | None:
    k = _spike_index(ctx)
    if k is None:
        return None
    onset = ctx.spike_onset(k)
    # an outlier row in the jump's own batch was seen: the jump's timing need not tell it from
    # an early oversized step
    outlier = any((r.get("z") or 0) >= OUTLIER_Z
                  for r in ctx.rows_near(onset, ("extreme",), back=0))  # fmt: skip
    late = k >= 5 or (ctx.step_at(k) or 0) >= 10  # an epoch log may start late in the run
    if not late and not outlier:
        return None
    before = ctx.rise_before(onset)
    if before is not None and before.length >= 3 and before.growth >= 10 and before.sustained:
        return None  # a growth phase before the jump, not a sudden spike
    if not ctx.descended_before(onset) and onset < 5 and not outlier:
        return None  # neither a long descent nor a long stretch before the jump
    stopped = ctx.fail is None and ctx.stop is not None
    if stopped and not _departed(ctx) and not _one_jump(ctx, onset):
        return None  # stopped on a sustained climb
    rows = ctx.rows_near(k, ("extreme",), back=k - onset + 2)
    finite_loss = ctx.loss[:onset][np.isfinite(ctx.loss[:onset])]
    if not finite_loss.size:
        return None
    overflow, at_row = _overflow(ctx, rows) if rows else (None, False)
    return Fingerprint(
        spike=k,
        onset=onset,
        at=ctx.stop if ctx.fail is None and ctx.stop is not None else k,
        descended=ctx.descended_before(onset),
        first=finite_loss[0],
        last=finite_loss[-1],
        jumped_to=ctx.loss[onset],
        filtered=bool(ctx.filtered_nan[onset]),
        ratio=ctx.spike_ratio(onset),
        broke=ctx.fail is not None,
        departed=_departed(ctx),
        rows=tuple(rows),
        inputs_measured=ctx.trace.has("input_absmax"),
        overflow=overflow,
        at_row=at_row,
    )


def _one_jump(ctx: Context, onset: int) -> bool:
    """Stopped as a climb, but the climb is one jump: the onset's own update carries most (over
    half) of the loss's growth from before it to the stop, where an oversized step multiplies
    the loss update after update (1.13 -> 1144 -> 2.9e4 -> 3.1e4 is a jump and its aftermath;
    x3 an update for ten updates is a climb)."""
    if onset < 1 or ctx.stop is None:
        return False
    before, at, stop = ctx.loss[onset - 1], ctx.loss[onset], ctx.loss[ctx.stop]
    if not (math.isfinite(before) and before > 0 and math.isfinite(at) and math.isfinite(stop)):
        return False
    if at < SPIKE * before or stop <= before:
        return False
    return math.log(at / before) > 0.5 * math.log(stop / before)


def _first_batch(ctx: Context) -> Fingerprint | None:
    """The fit broke (or was stopped) within ``EARLY`` updates of its start, and the batch of
    update 1 holds an outlier row: there is no loss before it to jump from, and the row, seen,
    is what threw the first update (a typo of 5e7 among values of order one)."""
    end = ctx.fail if ctx.fail is not None else ctx.stop
    if end is None or end >= EARLY:
        return None
    rows = [r for r in ctx.rows_near(0, ("extreme",), back=0) if (r.get("z") or 0) >= OUTLIER_Z]
    if not rows:
        return None
    overflow, at_row = _overflow(ctx, rows)
    first = float(ctx.loss[0])
    return Fingerprint(spike=end, onset=0, at=end, descended=False, first=first, last=first,
                       jumped_to=first, filtered=bool(ctx.filtered_nan[0]), ratio=math.nan,
                       broke=ctx.fail is not None, departed=False, rows=tuple(rows),
                       inputs_measured=True, overflow=overflow, at_row=at_row)  # fmt: skip


def _overflow(ctx: Context, rows: list[dict[str, Any]]) -> tuple[Producer | None, bool]:
    """Where the extreme row's value overflowed: an op that got finite (huge) inputs, or one
    whose non-finite output was in the extreme row's own batch row."""
    prod = producer_of(ctx.located)
    at_row = prod is not None and _made_at(prod, rows)
    if prod is not None and prod.known and (prod.past_range() or at_row) and (
        not prod.inputs_nonfinite()
    ):
        return prod, at_row
    return None, False


def _made_at(prod: Producer, rows: list[dict[str, Any]]) -> bool:
    """The producer's non-finite output was in the extreme rows' batch rows and no other."""
    made = prod.d.get("producer_rows")
    extreme = {r.get("batch_row") for r in rows if r.get("why") == "extreme"}
    return bool(made) and isinstance(made, list) and set(made) <= extreme


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    rows = list(found.rows)
    each = unit(ctx)
    trend = "descended" if found.descended else "held steady"
    jumped_to = "NaN (logged as 0.0 by a NaN filter)" if found.filtered else num(found.jumped_to)
    if found.onset == 0:
        broke = "broke" if found.broke else "was stopped"
        evidence = [Evidence(
            CODE, f"the fit {broke} at {each} {ctx.step_at(found.at)}, {found.at} {each}(s) from "
            f"the start (first loss {num(found.first)}), with no loss before to jump from",
            {"descent_updates": 0, "spike_step": ctx.step_at(found.at)})]  # fmt: skip
    else:
        evidence = [
            Evidence(
                CODE,
                f"the loss {trend} for {found.onset} {each}s ({num(found.first)} -> "
                f"{num(found.last)}), then jumped to {jumped_to} at {each} "
                f"{ctx.step_at(found.onset)}"
                + (f" ({num(found.ratio)}x the recent loss)"
                   if math.isfinite(found.ratio) and not found.filtered else ""),
                {"descent_updates": found.onset, "spike_step": ctx.step_at(found.onset),
                 "spike_ratio": found.ratio},
            )
        ]  # fmt: skip
    actions: list[str] = []
    alternatives: list[tuple[str, float]] = []
    if rows:
        confidence = 0.85 if found.broke else 0.7
        if found.onset == 0:
            confidence = 0.7  # no jump seen: the row is observed, that it threw the fit is not
        evidence.extend(_row_evidence(found))
        top = rows[0]
        where = f"batch row {top.get('batch_row')}"
        if top.get("dataset_row") is not None:
            where = f"dataset row {top['dataset_row']}"
        actions.append(
            f"Inspect or drop {where} (column {top.get('column')} = {num(top.get('value'))}, "
            f"{num(top.get('z'))} robust standard deviations out)."
        )
    else:
        confidence = 0.3 if found.inputs_measured or found.departed else 0.5
        if ctx.granularity == "epoch":
            evidence.append(
                Evidence(
                    CODE,
                    "the log has one loss per epoch: the batch that caused the jump cannot be "
                    "seen; per-update logging would show whether it was one batch or a growth",
                    {"granularity": "epoch"},
                )
            )
        alternatives = [("exploding_gradients", 0.4), ("log_of_zero", 0.25),
                        ("zero_division", 0.2)]  # fmt: skip
        actions.append(
            "Log the loss and the gradient norm per update (not per epoch) and keep the batch of "
            "the failing update: it settles whether one batch or a growing gradient broke the fit "
            "(`nanscope run` does this)."
        )
    actions.append(
        "Clip the gradient norm (e.g. torch.nn.utils.clip_grad_norm_(params, 1.0)) so one row "
        "cannot dominate an update."
    )
    actions.append(
        "Look for outliers in the data (`nanscope scan DATA`); squared error punishes them "
        "quadratically: consider a Huber loss or winsorising."
    )
    if not rows:
        actions.append("Regularise the weights (L2 / weight decay) if they grow over the run.")
    return Finding(CODE, CAUSE, confidence, evidence, actions, step=ctx.step_at(found.at),
                   rows=rows, alternatives=alternatives)  # fmt: skip


def _row_evidence(found: Fingerprint) -> list[Evidence]:
    """The extreme row, and the op where its value overflowed when one was located."""
    top = found.rows[0]
    evidence = [
        Evidence(
            CODE,
            f"the batch of update {top.get('step')} holds an extreme row: {row_text(top)}",
            {"rows": list(found.rows[:5])},
        )
    ]
    prod = found.overflow
    if prod is not None:
        text = f"the first non-finite value came from {prod.where()}"
        if found.at_row:
            made = ", ".join(str(r) for r in prod.d.get("producer_rows") or [])
            text += f", non-finite in the extreme row's batch row ({made}) alone"
        values = prod.values_text()
        if values:
            text += f" ({values})"
        text += f" [{prod.how()}, {prod.phase or '?'}]"
        evidence.append(Evidence(CODE, text, {"op": prod.op, "phase": prod.phase,
                                              "observed": prod.observed}))  # fmt: skip
    return evidence
