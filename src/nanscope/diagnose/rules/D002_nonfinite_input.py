"""D002 nonfinite_input: a NaN or inf in the inputs or targets poisoned the update.

What it does
    Checks the batch of the failing update (and the one before) for NaN or inf in the inputs or
    the targets, and names the rows and columns that hold them. It defers (confidence 0.3) to an
    op of the training loop seen making those values from finite data (the producer), and a
    column non-finite in every row of every batch is reported as a column, not as rows to drop.

Why is this bad?
    One missing value in a feature or a target makes the averaged loss and gradient NaN, and a NaN
    gradient turns every weight into NaN in one update. The fit is lost at once, whatever the
    learning rate.

Fingerprint
    The loss is NaN on the first update with no growth phase, or suddenly at any update whose
    batch holds a NaN or inf; it never climbs first.

Evidence
    The count of non-finite values in the batch and the rows holding them (batch row, dataset row
    where known, column, value).

Action
    Drop or impute those rows; check the data pipeline that produced them (``nanscope scan DATA``
    finds them all before training); never replace the NaN loss with zero.

Example
    A CSV with one empty cell read by ``np.genfromtxt`` becomes a NaN feature; the minibatch that
    contains that row gives a NaN loss at its update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num, row_text, unit
from nanscope.diagnose.rules._logs import from_log
from nanscope.diagnose.rules._producer import Producer, producer_of

CODE = "D002"
CAUSE = "nonfinite_input"
TITLE = "NaN or inf in the inputs or targets"


@dataclass(frozen=True)
class BadBatch:
    """A batch of the failing update (or the one before) that held NaN or inf."""

    fail: int  # index of the failing update
    batch: int  # index of the update whose batch held them: ``fail`` or ``fail - 1``
    inputs: int  # how many non-finite values its inputs held
    targets: int  # how many its targets held
    rows: tuple[dict[str, Any], ...]  # the rows holding them, as the probes named them
    climbed: bool  # a growth phase of two updates or more came before that batch
    made: Producer | None  # an op of the training loop seen making them from finite data
    columns: tuple[dict[str, Any], ...]  # columns non-finite in every row of every batch


@dataclass(frozen=True)
class UncheckedStart:
    """A failure on the very first update of a run whose inputs were not recorded."""

    loss: float  # the first loss
    loss_nonfinite: bool  # the loss itself was non-finite (or a NaN a logging filter wrote as 0.0)
    grad_norm: float  # the first gradient norm (NaN when not recorded)


def fingerprint(ctx: Context) -> BadBatch | UncheckedStart | None:
    """What this rule measures at the failure, or None when it has nothing to say."""
    i = ctx.fail
    if i is None:
        return None
    nf = ctx.nonfinite
    for j in (i, i - 1):
        if j >= 0 and (nf["inputs"][j] > 0 or nf["targets"][j] > 0):
            rise = ctx.rise_before(j)
            return BadBatch(
                fail=i,
                batch=j,
                inputs=int(nf["inputs"][j]),
                targets=int(nf["targets"][j]),
                rows=tuple(ctx.rows_near(i, ("nan", "inf"), back=1)),
                climbed=not (rise is None or rise.length < 2),
                made=_made_in_loop(ctx),
                columns=tuple(_whole_columns(ctx, j)),
            )
    measured = ctx.trace.has("nf_inputs") or ctx.trace.has("input_absmax")
    if measured or i > 0:
        return None
    return UncheckedStart(
        loss=ctx.loss[0],
        loss_nonfinite=bool(nf["loss"][0] > 0 or ctx.filtered_nan[0]),
        grad_norm=ctx.trace.column("grad_norm")[0],
    )


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if isinstance(found, BadBatch):
        return _bad_batch(ctx, found)
    if isinstance(found, UncheckedStart):
        return _unchecked_start(ctx, found)
    return None


def _bad_batch(ctx: Context, found: BadBatch) -> Finding:
    rows = list(found.rows)
    parts = []
    if found.inputs:
        parts.append(f"{found.inputs} in the inputs")
    if found.targets:
        parts.append(f"{found.targets} in the targets")
    batch = ctx.step_at(found.batch)
    evidence = [
        Evidence(
            CODE,
            f"the batch of update {batch} holds non-finite values: " + " and ".join(parts),
            {"step": batch, "inputs": found.inputs, "targets": found.targets},
        )
    ]
    if rows:
        evidence.append(
            Evidence(CODE, "; ".join(row_text(r) for r in rows[:3]), {"rows": rows[:5]})
        )
    if not found.climbed:
        evidence.append(
            Evidence(CODE, "no growth phase before it: the loss did not climb first", {})
        )
    where = ", ".join(f"row {r.get('dataset_row', r.get('batch_row'))}" for r in rows[:5])
    actions = [
        f"Drop or impute the non-finite rows ({where})."
        if where
        else "Drop or impute the rows holding NaN or inf.",
        "Check the data pipeline that produced them; `nanscope scan DATA` lists every such "
        "row before training.",
        "Do not replace the NaN loss with zero: that hides the bad rows and keeps training on "
        "garbage.",
    ]
    confidence = 0.95 if found.batch == found.fail else 0.85
    made = found.made
    if made is not None:
        # an op of the training loop was seen making the batch's NaN from finite values:
        # the data is not what is broken (the producer's rule names it)
        confidence = 0.3
        evidence.append(Evidence(
            CODE,
            f"but the non-finite values were made in the training loop by {made.where()} "
            "from finite inputs [observed]: computed, not read from the data",
            {"computed": True, "op": made.op, "phase": made.phase}))  # fmt: skip
        actions = [
            f"Fix the computation at {made.where()}: the data it starts from is finite.",
            "Fix the computation rather than dropping rows: every batch goes through it.",
        ]
    elif found.columns:
        confidence = 0.6
        columns = list(found.columns)
        text = "; ".join(
            f"column {', '.join(str(c) for c in e['columns'][:5])} of the {e['source']} is "
            f"non-finite in every row ({e['rows']} of {e['rows']})"
            for e in columns
        )
        evidence.append(Evidence(
            CODE,
            f"{text}, in every batch seen: a whole column is computed (a division or a log "
            "over it) or empty in the data, not a few bad rows",
            {"columns": columns}))  # fmt: skip
        actions = [
            "Find where that column is made: a per-column division by a std or a range of 0, "
            "or a log of a column of zeros, breaks every row at once; if it is empty in the "
            "data file, drop the column, not rows.",
            "Do not drop rows: every row holds the same broken column.",
        ]
    step = ctx.step_at(found.fail)
    return Finding(CODE, CAUSE, confidence, evidence, actions, step=step, rows=rows)


def _unchecked_start(ctx: Context, found: UncheckedStart) -> Finding:
    # NaN on the very first update and nobody checked the data: the usual suspect
    what = (
        f"the loss is {num(found.loss)}"
        if found.loss_nonfinite
        else f"the gradient norm is {num(found.grad_norm)} (the loss {num(found.loss)})"
    )
    evidence = [
        Evidence(
            CODE,
            f"{what} on the very first {unit(ctx)}, with no growth phase; the inputs were not "
            "recorded, so they could not be checked",
            {"first_loss": float(found.loss)},
        )
    ]
    actions = [
        "Check the inputs and targets for NaN or inf before training (`nanscope scan DATA`"
        + (", and next run log them per update: `nanscope run` does" if from_log(ctx)
           else ", or pass inputs= and targets= to Monitor.update") + ").",
        "If the data is clean, check the loss code for a log of zero or a division by zero.",
    ]  # fmt: skip
    return Finding(CODE, CAUSE, 0.45, evidence, actions, step=ctx.step_at(0),
                   alternatives=[("log_of_zero", 0.3), ("bad_initialization", 0.25)])


def _made_in_loop(ctx: Context) -> Producer | None:
    """The producer, when an op of the training loop's preprocessing was seen making the value."""
    prod = producer_of(ctx.located)
    if prod is None or not prod.known or not prod.observed or prod.phase != "preprocess":
        return None
    if prod.inputs_nonfinite():
        return None
    return prod


def _whole_columns(ctx: Context, hit: int) -> list[dict]:
    """Columns non-finite in every row of the failing batch, when every batch before it (as
    counted in the trace) held non-finite inputs too."""
    found = [
        e
        for e in ctx.evidence.get("nonfinite_columns") or []
        if isinstance(e, dict) and e.get("columns") and int(e.get("rows") or 0) >= 2
    ]
    if not found:
        return []
    counts = ctx.nonfinite["inputs"][: hit + 1] + ctx.nonfinite["targets"][: hit + 1]
    if len(counts) and not bool((counts > 0).all()):
        return []  # the earlier batches were clean: rows that arrived with this batch
    return found
