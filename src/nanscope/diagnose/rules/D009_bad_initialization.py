"""D009 bad_initialization: the weights were absurd before the first update.

What it does
    Looks at a fit that broke at once, on its first updates, with clean inputs and no growth phase,
    and speaks only with evidence about the initial weights: their scale far from the standard
    one for their fan-in, or a first forward pass (update 1, the weights exactly as initialised)
    that overflowed on inputs in a sane scale. It follows the producer: an op of the model (an
    ``exp``, a matmul) that overflowed from finite inputs at update 1 is seen, not guessed. A
    failure after the first step, or on a batch with a column in raw units, is not the
    initialiser's without the weight scale to show it. With the PyTorch replay it also reads two
    measures of the first batch: the magnitude of each layer's output in forward order
    (``activations``: does it grow layer by layer?) and the scale of each weight matrix against
    the ``1 / sqrt(fan_in)`` that keeps
    activations of order one (``weight_scale``: ``std(W) * sqrt(fan_in)``, about 0.5 to 1.5 for
    the standard initialisers).

Why is this bad?
    Each layer multiplies its input's scale by about ``std(W) * sqrt(fan_in)``. Ten layers at 50x
    make activations 1e17 times the input: the first loss is absurd or inf, the first gradient
    overflows, and no learning rate helps. The mirror case (scale far below 1) vanishes instead.

Fingerprint
    A non-finite or absurd loss on the very first update, with clean inputs; forward activations
    grow layer by layer on the first batch; the weight scale is far from ``1/sqrt(fan_in)``.

Evidence
    The producer op that overflowed, its line and inputs; the first loss, the per-layer
    activation growth (first layer -> last, and the median ratio per layer), the weight scale
    ratio of the worst layer.

Action
    Use a standard initialiser (the framework's default, ``nn.init.kaiming_normal_`` for relu,
    ``xavier_uniform_`` for tanh); do not multiply initial weights; add normalisation layers in a
    deep stack.

Example
    A 20-layer MLP whose weights were initialised with ``normal_(std=1)`` on 256-wide layers (16x
    the right scale): the activations grow 16x per layer and the first loss is inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import (
    SCALE_FAR,
    initial_weights_sane,
    num,
    unscaled_columns,
)
from nanscope.diagnose.rules._producer import Producer, producer_of
from nanscope.numerics import RAW_UNITS

CODE = "D009"
CAUSE = "bad_initialization"
TITLE = "Bad initialisation: absurd from the first update"

#: activations growing this much from the first to the last layer on the first batch
GROWTH = 1e3
#: the failure must come within this many updates of the start
EARLY = 3
#: a first loss this large is orders of magnitude beyond a standard start (as D010 reads it)
ABSURD = 1e6

ACTIONS = [
    "Use a standard initialiser: keep the framework's default, or nn.init.kaiming_normal_ "
    "(relu) / nn.init.xavier_uniform_ (tanh); do not scale the initial weights up.",
    "For a deep stack add normalisation (LayerNorm / BatchNorm) or residual connections so the "
    "activations keep their scale layer after layer.",
    "Check the first loss before training: for standardised targets it should be of order one.",
]


def _early_break(ctx: Context) -> int | None:
    if ctx.fail is not None and ctx.fail < EARLY:
        return ctx.fail
    return None


@dataclass(frozen=True)
class Activations:
    """The layer outputs of the first batch, growing layer by layer (the probes' measure)."""

    growth: float  # from the first layer's output to the last finite one's
    median_ratio: Any  # the median growth per layer (None when not measured)
    nonfinite_at: Any  # the layer whose output overflowed (None when none did)
    layers: int  # how many layers were measured


@dataclass(frozen=True)
class WeightScale:
    """The layer whose std(W) * sqrt(fan_in) is furthest from a standard initialiser's."""

    ratio: float  # std(W) * sqrt(fan_in): about 0.5-1.5 for the standard initialisers
    layer: dict[str, Any]  # the probes' entry for it (param, fan_in), {} when not named


@dataclass(frozen=True)
class Fingerprint:
    """A fit that broke on its first updates with clean inputs, and what the weights showed."""

    fail: int  # index of the failing update (within EARLY of the start)
    first_loss: float
    located: dict[str, Any]  # the producer as the probes located it ({} when none was)
    first_forward: bool  # it broke on update one, on inputs in a sane scale
    half_only: bool  # the value passed float16's range (D008 names the dtype)
    overflow: Producer | None  # an op of the model that overflowed from finite inputs then
    activations: Activations | None  # the first batch's outputs growing layer by layer
    weight_scale: WeightScale | None  # a layer's weights far from the standard scale


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The early break and what the initial weights showed, or None when nothing points at
    them (bad data, a log or a division of 0, a failure after the first updates)."""
    i = _early_break(ctx)
    if i is None:
        return None
    if initial_weights_sane(ctx):
        return None  # measured before the first update: zero, or a standard scale
    nf = ctx.nonfinite
    upto = i + 1
    if np.any(nf["inputs"][:upto] > 0) or np.any(nf["targets"][:upto] > 0):
        return None
    located = ctx.located or {}
    inputs = str(located.get("inputs") or "")
    if inputs.startswith(("exactly zero", "non-finite")):
        return None  # a division or log of zero, or bad data: other rules
    half_only = str(located.get("dtype")) == "float16" and inputs == "past the half range"
    # the first forward says something of the initial weights only on inputs in a sane scale:
    # a raw-unit column overflows any initialiser (that is the column's story, D001's)
    first_forward = i == 0 and not unscaled_columns(ctx)
    prod = producer_of(located)
    overflow = None
    if (first_forward and prod is not None and prod.observed
            and prod.phase in ("forward", "loss", "backward")
            and prod.past_range() and not half_only and not prod.inputs_nonfinite()):  # fmt: skip
        # the producer overflowed from finite values, in the model, at the first updates: the
        # weights it multiplied were still (close to) the initial ones
        overflow = prod
    activations = _activations(ctx) if first_forward else None
    weight_scale = _weight_scale(ctx, at_start=i == 0)
    if overflow is None and activations is None and weight_scale is None:
        op = str(located.get("op") or "").lower()
        if not first_forward or not ctx.trace.has("input_absmax") or any(
            k in op for k in ("log", "div", "sqrt", "norm", "entropy")
        ):
            return None  # nothing about the weights, and clean inputs not measured
    return Fingerprint(i, ctx.loss[0], located, first_forward, half_only, overflow, activations,
                       weight_scale)  # fmt: skip


def _clean_first_batch(ctx: Context) -> bool:
    """The first update's inputs were measured finite and in standardised units."""
    value = ctx.trace.column("input_absmax")
    return bool(value.size) and math.isfinite(float(value[0])) and float(value[0]) <= RAW_UNITS


def _activations(ctx: Context) -> Activations | None:
    """The first batch's layer outputs when they grow layer by layer (or overflow)."""
    acts: dict[str, Any] = ctx.evidence.get("activations") or {}
    growth = acts.get("growth")
    median_ratio = acts.get("median_ratio")
    nonfinite_at = acts.get("nonfinite_at")
    if isinstance(growth, (int, float)) and (growth >= GROWTH or (
        nonfinite_at and isinstance(median_ratio, (int, float)) and median_ratio >= 2
    )):  # fmt: skip
        return Activations(growth, median_ratio, nonfinite_at, len(acts.get("layers") or []))
    return None


def _weight_scale(ctx: Context, at_start: bool) -> WeightScale | None:
    """The layer whose initial weights are furthest from the standard scale, when far from it:
    measured before the first update, or by the probes at a failure of update 1 (its weights are
    the initial ones; after a step they are what the step made, no evidence of the init)."""
    scale: dict[str, Any] = ctx.evidence.get("initial_weight_scale") or (
        (ctx.evidence.get("weight_scale") if at_start else None) or {}
    )
    worst = scale.get("max_ratio")
    least = scale.get("min_ratio")
    if isinstance(worst, (int, float)) and worst >= SCALE_FAR:
        value = worst  # scaled up: activations grow layer by layer
    elif isinstance(least, (int, float)) and 0 < least <= 1 / SCALE_FAR:
        value = least  # scaled down: they vanish
    else:
        return None
    candidates = scale.get("layers") or []
    return WeightScale(value, next((x for x in candidates if x.get("ratio") == value), {}))


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    i = found.fail
    evidence: list[Evidence] = []
    confidence = 0.0
    prod = found.overflow
    if prod is not None:
        confidence = 0.6
        text = (f"the producer is {prod.where()}: it overflowed from finite inputs at update "
                f"{ctx.step_at(i)}, from the initial weights")  # fmt: skip
        values = prod.values_text()
        if values:
            text += f" ({values})"
        text += f" [{prod.how()}]"
        evidence.append(Evidence(CODE, text, {"op": prod.op, "phase": prod.phase,
                                              "observed": True}))  # fmt: skip
    acts = found.activations
    if acts is not None:
        confidence = max(confidence, 0.6) + 0.15
        text = (
            f"on the batch of update {ctx.step_at(i)} the layer outputs grow layer by layer: "
            f"{num(acts.growth)}x from the first layer to the last finite one"
        )
        if isinstance(acts.median_ratio, (int, float)):
            text += f" (median {num(acts.median_ratio)}x per layer over {acts.layers} layers)"
        if acts.nonfinite_at:
            text += f", until {acts.nonfinite_at} overflows"
        evidence.append(Evidence(CODE, text, {"growth": acts.growth,
                                              "median_ratio": acts.median_ratio,
                                              "nonfinite_at": acts.nonfinite_at}))  # fmt: skip
    scale = found.weight_scale
    if scale is not None:
        value, layer = scale.ratio, scale.layer
        confidence = max(confidence, 0.6) + (0.15 if confidence else 0.0)
        first = float(found.first_loss)
        if not evidence and (not math.isfinite(first) or abs(first) >= ABSURD) and (
            not unscaled_columns(ctx) and _clean_first_batch(ctx)
        ):
            # the loss of the weights as initialised, before any step, on clean data
            confidence += 0.15
            evidence.append(Evidence(
                CODE, f"the first loss, from the initial weights before any step and on a clean "
                f"batch, was already {num(first)}", {"first_loss": first}))  # fmt: skip
        evidence.append(
            Evidence(
                CODE,
                f"the weights of {layer.get('param', 'a layer')} have std x sqrt(fan_in) = "
                f"{num(value)} (a standard initialiser gives about 0.5-1.5): "
                f"{num(value)}x the scale that keeps activations of order one",
                {"param": layer.get("param"), "ratio": value, "fan_in": layer.get("fan_in")},
            )
        )
    if not evidence:
        confidence = 0.4  # broke on update one with clean inputs; no layer measures to confirm
    if found.half_only:
        confidence -= 0.25  # D008 names the dtype; the init may still be what grew the values
    evidence.insert(
        0,
        Evidence(
            CODE,
            f"the fit broke at update {ctx.step_at(i)}, {i} update(s) from the start, with "
            f"clean inputs (first loss {num(found.first_loss)})",
            {"step": ctx.step_at(i), "first_loss": float(found.first_loss)},
        ),
    )
    alternatives = [("step_size_too_large", 0.2)]
    if found.half_only:
        alternatives.append(("fp16_overflow", 0.5))
    return Finding(CODE, CAUSE, confidence, evidence, list(ACTIONS), step=ctx.step_at(i),
                   located=found.located or None, alternatives=alternatives)
