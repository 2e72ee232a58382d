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
    or one jump to a plateau the run never comes back from (the weights thrown far out).

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
from typing import Any

import numpy as np

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num, row_text
from nanscope.diagnose.rules._producer import producer_of

CODE = "D004"
CAUSE = "extreme_batch"
TITLE = "One extreme batch after a long descent"

SPIKE = 10.0


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
    return best


def _made_at(prod: Any, rows: list[dict[str, Any]]) -> bool:
    """The producer's non-finite output was in the extreme rows' batch rows and no other."""
    made = prod.d.get("producer_rows")
    extreme = {r.get("batch_row") for r in rows if r.get("why") == "extreme"}
    return bool(made) and isinstance(made, list) and set(made) <= extreme


def _value(ctx: Context, index: int) -> str:
    """The loss at ``index`` as it was: a 0.0 a logging filter wrote for a NaN is a NaN."""
    if ctx.filtered_nan[index]:
        return "NaN (logged as 0.0 by a NaN filter)"
    return num(ctx.loss[index])


def check(ctx: Context) -> Finding | None:
    k = _spike_index(ctx)
    if k is None:
        return None
    late = k >= 5 or (ctx.step_at(k) or 0) >= 10  # an epoch log may start late in the run
    if not late:
        return None
    onset = ctx.spike_onset(k)
    before = ctx.rise_before(onset)
    if before is not None and before.length >= 3 and before.growth >= 10 and before.sustained:
        return None  # a growth phase before the jump, not a sudden spike
    if not ctx.descended_before(onset) and onset < 5:
        return None  # neither a long descent nor a long stretch before the jump
    if ctx.fail is None and ctx.stop is not None and not _departed(ctx):
        return None  # stopped on a sustained climb
    ratio = ctx.spike_ratio(onset)
    rows = ctx.rows_near(k, ("extreme",), back=k - onset + 2)
    finite_loss = ctx.loss[:onset][np.isfinite(ctx.loss[:onset])]
    if not finite_loss.size:
        return None
    unit = "epoch" if ctx.granularity == "epoch" else "update"
    trend = "descended" if ctx.descended_before(onset) else "held steady"
    evidence = [
        Evidence(
            CODE,
            f"the loss {trend} for {onset} {unit}s ({num(finite_loss[0])} -> "
            f"{num(finite_loss[-1])}), then jumped to {_value(ctx, onset)} at {unit} "
            f"{ctx.step_at(onset)}"
            + (f" ({num(ratio)}x the recent loss)"
               if math.isfinite(ratio) and not ctx.filtered_nan[onset] else ""),
            {"descent_updates": onset, "spike_step": ctx.step_at(onset), "spike_ratio": ratio},
        )
    ]
    actions: list[str] = []
    alternatives: list[tuple[str, float]] = []
    if rows:
        top = rows[0]
        confidence = 0.85 if ctx.fail is not None else 0.7
        evidence.append(
            Evidence(
                CODE,
                f"the batch of update {top.get('step')} holds an extreme row: {row_text(top)}",
                {"rows": rows[:5]},
            )
        )
        where = f"batch row {top.get('batch_row')}"
        if top.get("dataset_row") is not None:
            where = f"dataset row {top['dataset_row']}"
        actions.append(
            f"Inspect or drop {where} (column {top.get('column')} = {num(top.get('value'))}, "
            f"{num(top.get('z'))} robust standard deviations out)."
        )
        prod = producer_of(ctx.located)
        at_row = prod is not None and _made_at(prod, rows)
        if prod is not None and prod.known and (prod.past_range() or at_row) and (
            not prod.inputs_nonfinite()
        ):
            # where that row's value overflowed: an op that got finite (huge) inputs, or one
            # whose non-finite output was in the extreme row's own batch row
            text = f"the first non-finite value came from {prod.where()}"
            if at_row:
                made = ", ".join(str(r) for r in prod.d.get("producer_rows") or [])
                text += f", non-finite in the extreme row's batch row ({made}) alone"
            values = prod.values_text()
            if values:
                text += f" ({values})"
            text += f" [{prod.how()}, {prod.phase or '?'}]"
            evidence.append(Evidence(CODE, text, {"op": prod.op, "phase": prod.phase,
                                                  "observed": prod.observed}))  # fmt: skip
    else:
        measured = ctx.trace.has("input_absmax")
        confidence = 0.3 if measured or _departed(ctx) else 0.5
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
    return Finding(
        rule=CODE,
        cause=CAUSE,
        confidence=confidence,
        evidence=evidence,
        actions=actions,
        step=ctx.step_at(ctx.stop if ctx.fail is None and ctx.stop is not None else k),
        rows=rows,
        alternatives=alternatives,
    )
