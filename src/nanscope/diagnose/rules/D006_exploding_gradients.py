"""D006 exploding_gradients: the gradient norm jumps by orders of magnitude before the loss follows.

What it does
    Compares the gradient norm of the last updates before the failure with the run's own history
    (median of the earlier updates), and the loss's growth over the same span. It names the
    parameter whose gradient dominates the total and how fast it grew.

Why is this bad?
    Products of many Jacobians (deep or recurrent networks, relu inside recurrent cells) can
    multiply a gradient by orders of magnitude in one update; the step it produces throws the
    weights far away, and the next loss or gradient overflows.

Fingerprint
    The gradient norm rises 100x or more above its history while the loss has barely moved, or
    the gradient goes non-finite while the loss is still finite. When the loss grows as fast as
    the square of the gradient, it is a step size too large instead. Under an optimizer that
    normalises each weight's step (Adam, RMSprop, Adagrad) a finite climb of the gradient is
    weaker evidence: the gradient's scale does not set the step there, the lr does (a gradient
    that overflows while the loss is still finite is the backward's own, under any optimizer).

Evidence
    The gradient-norm ratio against the run's median, the loss ratio over the same span, the layer
    that dominates and its growth; whether the script clips (pre-clip norm recorded) and whether the
    norm merely overflowed float32 while every gradient element stayed finite.

Action
    Clip the gradient norm (when the script already clips, cut the learning rate instead: the
    recorded norm is then the pre-clip one); regularise the weights; for recurrent layers prefer
    tanh to relu and check the recurrent weights' scale; lower the learning rate.

Example
    A hand-written tanh RNN unrolled over many steps whose recurrent weights grow past 1: its
    gradient norm climbs from 1 to 1e6 while the loss stays near 1, then overflows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num, tenfold_action

CODE = "D006"
#: the per-layer gradient norms are looked for this many updates back from the peak
LAYER_LOOKBACK = 8
CAUSE = "exploding_gradients"
TITLE = "Exploding gradients"

JUMP = 100.0


@dataclass(frozen=True)
class Layer:
    """The parameter that carries the gradient norm, from the nearest per-layer norms."""

    update: int  # index of the record the per-layer norms were taken from
    name: str  # the parameter with the largest gradient norm
    share: float  # its share of the squared gradient norm
    growth: float  # its gradient norm against its first recorded one (NaN when not recorded)
    nonfinite: tuple[str, ...]  # the parameters with a non-finite gradient, when none is finite


@dataclass(frozen=True)
class Fingerprint:
    """The gradient norm's jump against its history, and the loss's over the same span."""

    peak: int  # index of the update where the gradient norm peaked (or went non-finite)
    at: int  # index of the update the finding names: the failure, the stop or the peak
    norm: float  # the gradient norm there (NaN or inf when it went non-finite at once)
    reference: float  # the norm it is compared with
    from_start: bool  # the reference is the climb's start (too few updates before it)
    ratio: float  # ``norm / reference`` (inf when it went non-finite at once)
    loss_ratio: float  # the loss there against the median loss before (NaN when unknown)
    fail: int | None  # index of the failing update
    fail_loss: float  # the loss at the failure (NaN without one)
    grad_first: bool  # the gradient went non-finite while the loss was still finite
    sudden: bool  # ordinary, then non-finite in one update: no finite climb was seen
    overflow: int | None  # the update whose norm overflowed float32 with every element finite
    extreme_rows: bool  # the batch of the peak (or the one before) held an extreme row
    scaler_collapsed: bool  # the loss scaler collapsed at the failure
    layer: Layer | None  # the parameter that dominates the gradient, where it was recorded
    clip: float | None  # the norm the script clips to (NaN: it clips, to an unknown norm)

    @property
    def elastic(self) -> bool:
        """The loss climbed along with the gradient (on a bowl, loss ~ gradient^2): an
        oversized step; an explosion is the gradient running ahead while the loss barely moved."""
        return (
            math.isfinite(self.loss_ratio)
            and self.loss_ratio > 1
            and math.log(self.loss_ratio) >= 0.5 * math.log(max(self.ratio, 1.0 + 1e-9))
        )


def _lasting(g: np.ndarray, k: int, ref: float) -> bool:
    """A finished run's gradient explosion that was more than one batch's spike: a climb of two
    updates or more at 10x the reference and above up to the peak at ``k``, or a gradient level
    after it (the median of the next updates) ten times away from the reference either way (the
    explosion saturated or threw the model, it did not just pass)."""
    run = 0
    j = k
    while j >= 0 and math.isfinite(g[j]) and g[j] >= 10 * ref:
        run += 1
        j -= 1
    if run >= 2:
        return True
    after = g[k + 1 : k + 11]
    after = after[np.isfinite(after) & (after > 0)]
    if after.size < 3:
        return False
    level = float(np.median(after))
    return level >= 10 * ref or level <= ref / 10


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The gradient norm's jump, or None when it did not outrun its history."""
    if not ctx.trace.has("grad_norm"):
        return None
    g = ctx.trace.column("grad_norm")
    upto = ctx.end + 1 if ctx.fail is not None else ctx.end
    upto = min(upto, ctx.n)
    broke = ctx.fail is not None or ctx.stop is not None
    # a broken run: the updates just before it broke; a finished one: anywhere in the run
    window = list(range(max(0, upto - 4), upto)) if broke else list(range(upto))
    finite_idx = [j for j in window if math.isfinite(g[j]) and g[j] > 0]
    nf = ctx.nonfinite
    grad_first = bool(
        ctx.fail is not None
        and nf["grads"][ctx.fail] > 0
        and math.isfinite(ctx.loss[ctx.fail])
        and not ctx.filtered_nan[ctx.fail]  # a 0.0 a logging filter wrote for a NaN loss
    )
    if not finite_idx and not grad_first:
        return None
    k = max(finite_idx, key=lambda j: g[j]) if finite_idx else ctx.fail
    overflow = _norm_overflow(ctx, upto)
    if overflow is not None:
        # the norm overflowed float32 before the run broke: the climb is what came before that
        climb = [j for j in range(overflow) if math.isfinite(g[j]) and g[j] > 0]
        if climb:
            k = max(climb, key=lambda j: g[j])
    assert k is not None
    reference = _reference(g, k, broke)
    if reference is None:
        return None
    ref, from_start = reference
    peak = float(g[k]) if math.isfinite(g[k]) else math.inf
    ratio = peak / ref if ref > 0 else math.inf
    loss_hist = ctx.loss[: max(0, k - 2)]
    loss_hist = loss_hist[np.isfinite(loss_hist)]
    loss_k = ctx.loss[k] if math.isfinite(ctx.loss[k]) else ctx.loss[max(0, k - 1)]
    loss_ratio = math.nan
    if loss_hist.size and float(np.median(loss_hist)) > 0 and math.isfinite(loss_k):
        loss_ratio = float(loss_k / np.median(loss_hist))
    sudden = False
    if (grad_first and overflow is None and ratio < JUMP and ctx.fail is not None
            and not math.isfinite(g[ctx.fail])):  # fmt: skip
        # ordinary, then non-finite in one update while the loss was finite
        sudden = True
        ratio = math.inf
        peak = float(g[ctx.fail])  # NaN or inf, as recorded
        k = ctx.fail
    if not (ratio >= JUMP or (grad_first and ratio >= 10)):
        return None
    if not broke and ratio < 1e3:
        return None
    if not broke and not _lasting(g, k, ref):
        return None  # one batch's spike the run absorbed: the next update was ordinary again
    if ctx.fail is not None:
        at = ctx.fail
    elif ctx.stop is not None:
        at = ctx.stop
    else:
        at = k
    return Fingerprint(
        peak=k,
        at=at,
        norm=peak,
        reference=ref,
        from_start=from_start,
        ratio=ratio,
        loss_ratio=loss_ratio,
        fail=ctx.fail,
        fail_loss=ctx.loss[ctx.fail] if ctx.fail is not None else math.nan,
        grad_first=grad_first,
        sudden=sudden,
        overflow=overflow,
        extreme_rows=bool(ctx.rows_near(k, ("extreme",), back=1)),
        scaler_collapsed=ctx.fail is not None and "loss_scale_collapse" in (
            ctx.records[ctx.fail].get("events") or ()),
        layer=_dominant_layer(ctx, k),
        clip=_clipping(ctx, upto),
    )  # fmt: skip


def _reference(g: np.ndarray, k: int, broke: bool) -> tuple[float, bool] | None:
    """The norm the peak at ``k`` is compared with, and whether it is the climb's start: the
    median of the updates before, or (a climb from the first updates) where it started."""
    history = g[: max(0, k - 2)]
    history = history[np.isfinite(history) & (history > 0)]
    if history.size >= 3:
        return float(np.median(history)), False
    early = g[:k]
    early = early[np.isfinite(early) & (early > 0)]
    if broke or early.size < 2:
        return None
    return float(early.min()), True


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    confidence = 0.85 if found.grad_first else 0.75
    if found.sudden:
        confidence = 0.55  # no finite climb seen: a 0/0 in the gradient looks the same
    if found.elastic:
        confidence = 0.3
    if found.extreme_rows:
        confidence -= 0.35
    if found.scaler_collapsed:
        confidence = min(confidence, 0.5)  # the loss scaler overflowed there: D008's story
    evidence = _evidence(ctx, found)
    alternatives = [("step_size_too_large", 0.3)] if not found.elastic else []
    if ctx.adaptive and not found.sudden and not found.grad_first:
        # the gradient's scale does not set this optimizer's step: a step as large as the lr
        # took the weights where the gradient is large, and clipping would change little (a
        # gradient that overflowed on its own while the loss held is the backward's, whatever
        # the optimizer)
        confidence = min(confidence, 0.55)
        alternatives = [("step_size_too_large", 0.6)]
        evidence.append(Evidence(
            CODE, f"but {ctx.trace.meta.get('optimizer')} normalises each weight's step (about "
            "lr whatever the gradient's size): the gradient's growth did not make the steps "
            "larger, and clipping it bounds little; the step size set by the lr is the likelier "
            "cause", {"adaptive": True}))  # fmt: skip
    if found.clip is not None:
        clip = found.clip
        evidence.append(
            Evidence(
                CODE,
                "the script clips the gradient norm"
                + (f" (to about {num(clip)})" if math.isfinite(clip) else "")
                + ": the recorded norm is the one before clipping; clipping kept it from the "
                "weights but not from growing",
                {"clipped": True, "clip_norm": clip},
            )
        )
        actions = [
            tenfold_action(ctx.lr_now)
            + " The script already clips the gradient norm; a pre-clip norm that keeps growing "
            "says the weights are being driven somewhere the gradient explodes.",
            "Regularise the weights (L2 / weight decay) so they cannot grow without bound.",
            "In recurrent layers use tanh rather than relu and check the scale of the recurrent "
            "weights.",
        ]
    else:
        actions = [
            "Clip the gradient norm before the optimizer step (e.g. "
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)).",
            "Regularise the weights (L2 / weight decay) so they cannot grow without bound.",
            "In recurrent layers use tanh rather than relu and check the scale of the recurrent "
            "weights; lower the learning rate if the gradient stays large after clipping.",
        ]
    return Finding(CODE, CAUSE, confidence, evidence, actions, step=ctx.step_at(found.at),
                   alternatives=alternatives)


def _evidence(ctx: Context, found: Fingerprint) -> list[Evidence]:
    """The jump, the non-finite gradient, the norm's overflow and the dominant layer."""
    peak, ref, step = found.norm, found.reference, ctx.step_at(found.peak)
    ref_text = ("its value at the start of the climb" if found.from_start
                else "the median of the updates before")  # fmt: skip
    reached = (
        f"the gradient norm reached {num(peak)} at update {step}, {num(found.ratio)}x "
        f"{ref_text} ({num(ref)})"
        if math.isfinite(peak)
        else f"the gradient norm went from {ref_text} ({num(ref)}) to {num(peak)} at update "
        f"{step}"
    )
    evidence = [
        Evidence(
            CODE,
            reached
            + (f", while the loss moved only {num(found.loss_ratio)}x"
               if math.isfinite(found.loss_ratio) else ""),
            {"grad_norm": peak, "median_grad_norm": ref, "ratio": found.ratio,
             "loss_ratio": found.loss_ratio},
        )
    ]  # fmt: skip
    if found.grad_first:
        evidence.append(
            Evidence(
                CODE,
                f"the gradient went non-finite at update {ctx.step_at(found.fail)} while the "
                f"loss was still finite ({num(found.fail_loss)})",
                {"step": ctx.step_at(found.fail)},
            )
        )
    if found.overflow is not None:
        evidence.append(
            Evidence(
                CODE,
                f"the gradient norm overflowed float32 at update {ctx.step_at(found.overflow)} "
                "(inf) while every gradient element was still finite: the sum of squares passed "
                "3.4e38, no element was NaN or inf",
                {"norm_overflow_step": ctx.step_at(found.overflow)},
            )
        )
    layer = found.layer
    if layer is not None and layer.nonfinite:
        bad = list(layer.nonfinite)
        evidence.append(
            Evidence(CODE, f"non-finite gradient in {', '.join(bad[:3])}", {"layers": bad})
        )
    elif layer is not None:
        when = f" at update {ctx.step_at(layer.update)}" if layer.update != found.peak else ""
        evidence.append(Evidence(
            CODE,
            f"'{layer.name}' carries {num(100 * layer.share)}% of the squared gradient norm{when}"
            + (f" and its gradient grew {num(layer.growth)}x since the start"
               if math.isfinite(layer.growth) else ""),
            {"layer": layer.name, "share": layer.share, "growth": layer.growth,
             "step": ctx.step_at(layer.update)},
        ))  # fmt: skip
    return evidence


def _clipping(ctx: Context, upto: int) -> float | None:
    """The norm the script clips to (the largest post-clip norm seen), when it clips."""
    found = False
    clipped: list[float] = []
    for record in ctx.records[:upto]:
        extra = record.get("extra") or {}
        if extra.get("grad_norm_source") == "pre_clip":
            found = True
            value = extra.get("grad_norm_clipped")
            if isinstance(value, (int, float)) and math.isfinite(value):
                clipped.append(float(value))
    if not found:
        return None
    return max(clipped) if clipped else math.nan


def _norm_overflow(ctx: Context, upto: int) -> int | None:
    """First update whose gradient norm is inf while its gradient elements were counted finite."""
    g = ctx.trace.column("grad_norm")[:upto]
    counted = ctx.trace.column("nf_grads")[:upto]
    hits = np.flatnonzero(np.isinf(g) & (counted == 0))
    return int(hits[0]) if hits.size else None


def _dominant_layer(ctx: Context, k: int) -> Layer | None:
    # the per-layer norms are recorded on sampled updates and at a failure, not on every one:
    # the nearest record at or before k that has them, a few updates back at most
    at = next((j for j in range(k, max(-1, k - LAYER_LOOKBACK), -1)
               if isinstance(ctx.records[j].get("grad_norms"), dict)), k)  # fmt: skip
    norms = ctx.records[at].get("grad_norms")
    if not isinstance(norms, dict) or len(norms) < 2:
        return None
    finite = {n: v for n, v in norms.items() if v is not None and math.isfinite(v)}
    if not finite:
        bad = [n for n, v in norms.items() if v is None or not math.isfinite(v)]
        return Layer(at, "", math.nan, math.nan, tuple(bad))
    total = sum(v * v for v in finite.values())
    name = max(finite, key=lambda n: finite[n])
    share = finite[name] ** 2 / total if total > 0 else math.nan
    first = None
    for record in ctx.records[:k]:
        gn = record.get("grad_norms")
        if isinstance(gn, dict) and gn.get(name) is not None and math.isfinite(gn[name]):
            first = gn[name]
            break
    growth = finite[name] / first if first else math.nan
    return Layer(at, name, share, growth, ())
