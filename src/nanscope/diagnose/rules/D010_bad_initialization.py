"""D010 bad_initialization: the first update's loss or gradient is already absurd.

What it does
    Reads the first recorded update: a loss or a gradient norm of a million or more there is
    orders of magnitude beyond what a standard initialiser gives on standardised data, whatever
    the loss. It reports it unless the run then shows the loss coming down by an order of
    magnitude or more (a large loss that falls steadily is a fit on large targets, not a broken
    one). It needs no probe, so it also reads logs, where the first line is often all there is.

Why is this bad?
    At initialisation a standard network's output is of order one: cross-entropy starts near
    ln(classes) (about 2.3 for 10 classes, 11 for a 50,000-word vocabulary), squared error on
    standardised targets near 1, a detector's summed losses at a few units, and the gradient norm
    at most in the hundreds. A first loss of 2.5e9 or a gradient norm of 1e12 says the weights or
    the data are off by orders of magnitude: weights scaled up at initialisation, inputs or
    targets in raw units (prices, pixel values of 0-255 squared), or a loss summed where it should
    be averaged. Any step taken from there is either huge or, after clipping, meaningless.

Fingerprint
    The first loss or gradient norm is 1e6 or more, and the loss does not fall by an order of
    magnitude afterwards (or the log ends before it could show it). Not when the first batch
    was measured in raw units (a value past 10, or a column 100 times the median one): the data
    made the start, and bad initialisation is named only with evidence about the weights. Not
    when the initial weights were measured all zero or at a standard scale.

Evidence
    The first loss and gradient norm against the scale a standard start has; how far the loss
    came down over the updates recorded.

Action
    Check the first loss before training: standardise the inputs and the targets, average the loss
    over the batch; keep the framework's initialiser (do not scale the weights up); then rerun and
    look at the first loss and gradient norm.

Example
    A three-layer MLP whose initial weights were multiplied by 100 regresses standardised targets:
    its first squared error is 1e10, and Adam at 1e-3 barely moves it in the updates recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import initial_weights_sane, num, unit, unscaled_columns
from nanscope.diagnose.rules._logs import from_log
from nanscope.numerics import RAW_UNITS

CODE = "D010"
CAUSE = "bad_initialization"
TITLE = "Absurd loss or gradient from the first update"

#: a first loss or gradient norm this large is orders of magnitude beyond a standard start on
#: standardised data (cross-entropy <= ~12, squared error ~1, gradient norms <= ~1e2-1e3)
ABSURD = 1e6
#: the loss came down by this factor or more over the run: a fit on large targets, not broken
FELL = 10.0

ACTIONS = [
    "Check the first loss before training: standardise the inputs and the targets (or scale them "
    "to units of order one) and average the loss over the batch rather than summing it.",
    "Keep the framework's initialiser (nn.init defaults, kaiming/xavier); do not scale the "
    "initial weights up.",
]


@dataclass(frozen=True)
class Fingerprint:
    """A first loss or gradient norm orders of magnitude beyond a standard start, that the run
    never came down from."""

    first_loss: float  # the first loss (non-finite: not recorded or broken)
    first_grad: float  # the first gradient norm (NaN when not recorded)
    later: int  # finite losses recorded after the first, up to the failure
    best: float | None  # the least |loss| among them (None when there are none)


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The absurd start, or None: a sane start, or a fit on large numbers that came down."""
    if ctx.n == 0:
        return None
    if _raw_data(ctx):
        # the first batch was measured in raw units (or holds a typo): the data made the large
        # start, and nothing says the weights did (the column's story is the step size's, D001)
        return None
    if initial_weights_sane(ctx):
        return None  # the initial weights were measured: zero, or at a standard scale
    loss = ctx.loss
    grad = ctx.trace.column("grad_norm")
    first_loss = float(loss[0])
    first_grad = float(grad[0])
    big_loss = math.isfinite(first_loss) and abs(first_loss) >= ABSURD
    big_grad = math.isfinite(first_grad) and first_grad >= ABSURD
    if not (big_loss or big_grad):
        return None
    end = ctx.fail if ctx.fail is not None else ctx.n
    later = loss[1:end]
    later = later[np.isfinite(later)]
    if big_loss:
        if _came_down(later, abs(first_loss)):
            return None  # the loss came down: a fit on large numbers that learns
    else:
        grads = grad[1:end]
        if _came_down(grads[np.isfinite(grads)], first_grad):
            return None
    best = float(np.min(np.abs(later))) if later.size else None
    return Fingerprint(first_loss, first_grad, int(later.size), best)


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    first_loss, first_grad, each = found.first_loss, found.first_grad, unit(ctx)
    parts = []
    if math.isfinite(first_loss):
        parts.append(f"loss {num(first_loss)}")
    if math.isfinite(first_grad):
        parts.append(f"gradient norm {num(first_grad)}")
    evidence = [
        Evidence(
            CODE,
            f"the first {each} already has {' and '.join(parts)}: at a standard start on "
            "standardised data a loss is of order one (cross-entropy about ln(classes)) and a "
            f"gradient norm at most a few hundred, so this is {_orders(first_loss, first_grad)} "
            "orders of magnitude off: weights scaled up at initialisation, inputs or targets in "
            "raw units, or a loss summed where it should be averaged",
            {"first_loss": first_loss, "first_grad_norm": first_grad, "absurd": ABSURD},
        )
    ]
    best = found.best
    if best is not None:
        evidence.append(
            Evidence(
                CODE,
                f"over the next {found.later} {each}s the loss came down only to {num(best)} "
                f"({num(abs(first_loss) / best) if best > 0 else 'inf'}x): the fit did not "
                "recover from its start",
                {"best_loss": best, "records": found.later},
            )
        )
        confidence = 0.65
    else:
        evidence.append(
            Evidence(
                CODE,
                f"the {'log' if from_log(ctx) else 'trace'} ends there: nothing shows the loss "
                "coming down",
                {"records": ctx.n},
            )
        )
        confidence = 0.6
    actions = list(ACTIONS)
    if from_log(ctx):
        actions.append(
            "Rerun a few updates and print the first loss and gradient norm: of order one is a "
            "sane start; `nanscope scan DATA` shows columns in raw units."
        )
    else:
        actions.append("Scan the data for columns in raw units (`nanscope scan DATA`).")
    return Finding(CODE, CAUSE, confidence, evidence, actions, step=ctx.step_at(0),
                   alternatives=[("step_size_too_large", 0.3)])


def _raw_data(ctx: Context) -> bool:
    """The first batch's inputs or targets were measured in raw units (a value beyond what
    standardised data holds, or a column far out of scale with the others)."""
    for key in ("input_absmax", "target_absmax"):
        value = ctx.trace.column(key)
        if value.size and math.isfinite(float(value[0])) and float(value[0]) > RAW_UNITS:
            return True
    return unscaled_columns(ctx)


def _came_down(values: np.ndarray, first: float) -> bool:
    """The values fell to a tenth of ``first`` or less, and ended there."""
    if not values.size:
        return False
    size = np.abs(values)
    return float(np.min(size)) <= first / FELL and float(size[-1]) <= first / FELL


def _orders(loss: float, grad: float) -> str:
    """How many orders of magnitude the larger of the two is past a start of order one (loss)
    or a hundred (gradient norm)."""
    loss_orders = math.log10(abs(loss)) if math.isfinite(loss) and loss else 0.0
    grad_orders = math.log10(grad / 1e2) if math.isfinite(grad) and grad > 0 else 0.0
    return str(int(max(loss_orders, grad_orders)))
