"""D008 fp16_overflow: a value passed float16's range (65504) and became inf.

What it does
    Follows the producer (the first op whose inputs were finite and whose output was not): when it
    ran in float16 (a ``.half()`` model, autocast) and the same op recomputed in float32 is finite
    and past 65504, the overflow is a measured fact, with the value and the limit. A loss
    multiplied by a constant before ``backward()`` (a hand-rolled static loss scale, not only
    ``GradScaler``) that overflows the gradients is named as such. Without a replay it reads the
    gradient scaler's story: the loss scale falling again and again (``extra.loss_scale``, skipped
    steps, ``loss_scale_collapse``) or the log lines of a scaler that overflowed at its minimum.

Why is this bad?
    float16 holds numbers up to 65504 only. A matmul whose activations are a few hundred, a sum of
    squares, an ``exp`` of 12 or a loss multiplied by the loss scale all pass it and become inf,
    then NaN; float32 would have been fine. A dynamic loss scaler hides this for a while by
    skipping steps and halving the scale, until the scale cannot go lower.

Fingerprint
    inf in half precision: activations, the loss or the (scaled) gradients past 65504; the loss
    scale collapses; the same fit in float32 or bfloat16 runs.

Evidence
    The located op and module, the dtype float16, the largest input magnitude against 65504; the
    loss-scale history and the count of skipped steps.

Action
    Run that op (or the model) in bfloat16 or float32 (``torch.autocast(dtype=torch.bfloat16)``,
    keep the loss, softmax and norms in float32); use a dynamic loss scaler
    (``torch.amp.GradScaler``); normalise activations that grow.

Example
    A model cast with ``.half()`` whose second linear layer sees activations of a few thousand:
    its output passes 65504, the loss is inf on the first update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num
from nanscope.diagnose.rules._producer import Producer, flushed_eps, producer_of, producer_step
from nanscope.numerics import HALF_MAX, HALF_TINY

CODE = "D008"
CAUSE = "fp16_overflow"
TITLE = "float16 overflow (past 65504)"

#: this many halvings of the loss scale in the window before the failure is a collapse
HALVINGS = 8

ACTIONS = [
    "Run the op that overflowed in bfloat16 or float32: torch.autocast(device_type, "
    "dtype=torch.bfloat16), or keep that module in float32 (module.float()) and cast its input.",
    "Use a dynamic loss scaler (torch.amp.GradScaler) rather than a fixed scale or a bare "
    ".half() model; keep the loss, softmax, norms and exp in float32.",
    "Normalise the activations that grow (LayerNorm / smaller init) so they stay far below "
    "65504.",
]


@dataclass(frozen=True)
class ScaleStory:
    """What the loss scaler did up to the failure, from the records and the log's lines."""

    scales: tuple[float, ...]  # the loss scale of each record that carries one
    skipped: int  # steps skipped for inf/NaN gradients
    collapse: bool  # the recorder saw the scale collapse
    story: str  # what the recorder (or the log reader) saw, in its own words
    halvings: float  # how many times the scale was halved from its peak to its last value
    minimum: tuple[dict[str, Any], ...]  # log lines saying the scale is at its minimum
    overflows: int  # log lines reporting a loss-scale overflow (a skipped step)
    settled: bool  # it skipped steps and then trained on: it was finding its scale

    @property
    def collapsed(self) -> bool:
        return self.collapse or self.halvings >= HALVINGS or bool(self.minimum)

    @property
    def telling(self) -> bool:
        """The story says float16 overflowed: a collapse, or overflows again and again."""
        return not self.settled and (self.collapsed or self.overflows >= HALVINGS)


@dataclass(frozen=True)
class Fingerprint:
    """The op that passed float16's range, where one was located, and the loss scaler's story."""

    located: dict[str, Any]  # the producer as the probes located it ({} when none was)
    producer: Producer | None  # a view of ``located``
    #: what the producer shows: "recomputed" (finite and past the narrow dtype's limit when run
    #: wider), "past_range" (its result passed the half range), "underflow" (its input was
    #: exactly 0 in half precision), or None
    kind: str | None
    dtype: str  # the dtype the producer ran in ("" when not recorded)
    near: bool  # its inputs reached within 256x of the half range
    flushed_eps: float | None  # the optimizer's eps (above 0) that its float16 step made 0
    zero_input: bool  # the producer's input was exactly zero
    nan_filtered: bool  # the log shows 0.0 where a logging filter hid a NaN loss
    scale: ScaleStory


def fingerprint(ctx: Context) -> Fingerprint | None:
    """The overflow in half precision, or None when neither a producer nor the scaler shows it."""
    located: dict[str, Any] = ctx.located or {}
    dtype = str(located.get("dtype") or "")
    inputs = str(located.get("inputs") or "")
    absmax = located.get("input_absmax")
    half = dtype in ("float16", "bfloat16") or str(located.get("autocast") or "") == "float16"
    prod = producer_of(located)
    near = isinstance(absmax, (int, float)) and absmax >= HALF_MAX / 256
    kind = None
    if prod is not None and half and prod.precision and not prod.inputs_nonfinite():
        kind = "recomputed"
    elif located and half and not inputs.startswith("non-finite"):
        if inputs == "past the half range" or near:
            kind = "past_range"
        elif inputs.startswith("exactly zero"):
            kind = "underflow"
    scale = scale_story(ctx)
    if kind is None and not scale.telling:
        return None
    return Fingerprint(
        located=located,
        producer=prod,
        kind=kind,
        dtype=dtype,
        near=near,
        flushed_eps=flushed_eps(ctx, located) if located.get("phase") == "optimizer" else None,
        zero_input=inputs.startswith("exactly zero"),
        nan_filtered=bool(ctx.filtered_nan.any()),
        scale=scale,
    )  # fmt: skip


def scale_story(ctx: Context) -> ScaleStory:
    """The loss-scale history and the scaler's log lines, up to the failure."""
    scales: list[float] = []
    skipped = 0
    collapse = False
    story = ""
    for record in ctx.records[: (ctx.fail + 1) if ctx.fail is not None else ctx.n]:
        extra = record.get("extra") or {}
        events = record.get("events") or []
        if isinstance(extra, dict) and isinstance(extra.get("loss_scale"), (int, float)):
            scales.append(float(extra["loss_scale"]))
        if "skipped_step" in events or (isinstance(extra, dict) and extra.get("skipped_step")):
            skipped += 1
        if "loss_scale_collapse" in events:
            collapse = True
            if isinstance(extra, dict) and isinstance(extra.get("fp16_story"), str):
                story = extra["fp16_story"]  # what the trace showed, in the recorder's words
    halvings = 0.0
    if len(scales) >= 2 and scales[0] > 0 and scales[-1] > 0:
        peak = max(scales)
        halvings = math.log2(peak / scales[-1]) if scales[-1] < peak else 0.0
    minimum = ctx.messages_of("loss_scale_min")
    overflow = ctx.messages_of("loss_scale_overflow")
    # a scaler that skipped steps and then trained on was finding its scale (from 2^32 at
    # DeepSpeed's start) or probing upwards, which it does in every healthy fp16 run
    settled = not (collapse or minimum) and ctx.fail is None and _recovered(ctx, overflow)
    return ScaleStory(tuple(scales), skipped, collapse, story, halvings, tuple(minimum),
                      len(overflow), settled)  # fmt: skip


def _recovered(ctx: Context, overflow: list[dict[str, Any]]) -> bool:
    """Finite updates were applied after the last step the scaler skipped (a skipped record,
    or an overflow message, which comes after the record of its step)."""
    last = -1
    for index, record in enumerate(ctx.records):
        if "skipped_step" in (record.get("events") or ()):
            last = index
    steps = [int(m["step"]) for m in overflow if isinstance(m.get("step"), int)]
    if steps:
        after = max(steps)
        last = max([last, *(i for i in range(ctx.n) if ctx.step_at(i) == after)])
    elif overflow:
        return False  # messages with no update to place them: nothing says it recovered
    return any(
        math.isfinite(ctx.loss[i]) and not ctx.skipped[i] for i in range(last + 1, ctx.n)
    )


def check(ctx: Context) -> Finding | None:
    found = fingerprint(ctx)
    if found is None:
        return None
    confidence, evidence = _producer_evidence(found)
    if found.scale.telling:
        scale_conf, scale_ev = _scale_evidence(found.scale)
        confidence = max(confidence, scale_conf) + (0.05 if confidence else 0.0)
        evidence.extend(scale_ev)
    actions = list(ACTIONS)
    if found.nan_filtered:
        actions.append(
            "The log shows 0.0 where the loss was NaN (the Trainer's logging_nan_inf_filter, on "
            "by default): turn it off next run so the log shows the NaN; with the Trainer, "
            "bf16=True instead of fp16=True avoids the overflow where the GPU supports it."
        )
    located, prod = found.located, found.producer
    source = (located.get("source") or {}) if located else {}
    if source.get("file"):
        actions.insert(0, f"The overflow is at {source['file']}:{source.get('line')}.")
    if prod is not None and prod.loss_scale is not None:
        actions.insert(0, f"Drop the fixed loss scale ({num(prod.loss_scale)}): use "
                          "torch.amp.GradScaler, which lowers the scale when the gradients "
                          "overflow, or a scale small enough that the largest gradient stays "
                          "below 65504.")  # fmt: skip
    return Finding(CODE, CAUSE, confidence, evidence, actions, step=producer_step(ctx, located),
                   located=located or None,
                   alternatives=[("zero_division", 0.3)] if found.zero_input else [])


def _producer_evidence(found: Fingerprint) -> tuple[float, list[Evidence]]:
    """The confidence and evidence the located op gives (0 and none without one)."""
    located, prod = found.located, found.producer
    if found.kind == "recomputed" and prod is not None and prod.precision:
        # measured: the op recomputed in a wider dtype is finite and past the narrow one's limit
        precision = prod.precision
        text = (f"the producer is {prod.where()} in {precision.get('dtype', found.dtype)}: "
                f"{precision.get('text')} [{prod.how()}, {prod.phase or '?'}]")  # fmt: skip
        evidence = [Evidence(CODE, text, {"op": prod.op, "module": located.get("module"),
                                          "dtype": precision.get("dtype"),
                                          "value": precision.get("value"),
                                          "limit": precision.get("limit"),
                                          "observed": prod.observed})]  # fmt: skip
        if prod.loss_scale is not None:
            evidence.append(Evidence(CODE, prod.scale_text() + (
                f"; unscaled, the largest value would be "
                f"{num(float(precision.get('value') or 0.0) / prod.loss_scale)}"),
                {"loss_scale": prod.loss_scale}))  # fmt: skip
        chain = prod.chain_text()
        if chain:
            evidence.append(Evidence(CODE, chain, {"chain": located.get("chain")}))
        return (0.95 if prod.observed else 0.7), evidence
    where = f"{located.get('op')}" + (f" in {located['module']}" if located.get("module")
                                      else "")  # fmt: skip
    absmax = located.get("input_absmax")
    if found.kind == "past_range":
        evidence = [
            Evidence(
                CODE,
                f"the first non-finite value appeared in float16, at {where}"
                + (f", whose inputs reached {num(absmax)}" if found.near else "")
                + f": its result passed the half range ({num(HALF_MAX)})",
                {"op": located.get("op"), "module": located.get("module"),
                 "dtype": "float16", "input_absmax": absmax},
            )
        ]  # fmt: skip
        if prod is not None and prod.loss_scale is not None:
            evidence.append(Evidence(CODE, prod.scale_text(), {"loss_scale": prod.loss_scale}))
        return (0.92 if (prod is None or prod.observed) else 0.65), evidence
    if found.kind == "underflow":
        # an underflow to 0 in half precision, then a log/division of it
        evidence = [
            Evidence(
                CODE,
                f"{where} ran in float16 and its input was exactly 0: small values "
                "underflow to 0 in half precision (below 6e-8)",
                {"op": located.get("op"), "dtype": "float16"},
            )
        ]
        eps = found.flushed_eps
        if eps is None:
            return 0.4, evidence
        # the optimizer's epsilon itself is 0 in half precision: its denominator
        # sqrt(v) + eps is exactly 0 wherever the second moment underflowed
        evidence.append(Evidence(
            CODE, f"the optimizer's eps ({num(eps)}) is 0 in float16 (below its smallest "
            f"value, {num(HALF_TINY)}): the step's denominator sqrt(v) + eps is exactly 0 "
            "wherever the second moment underflowed, so the weights' dtype, not the "
            "eps the script set, made the 0/0", {"eps": eps}))  # fmt: skip
        return 0.85, evidence
    return 0.0, []


def _scale_evidence(scale: ScaleStory) -> tuple[float, list[Evidence]]:
    """The confidence and evidence of the scaler's story (a collapse, or repeated overflows)."""
    scales, story, minimum, halvings = scale.scales, scale.story, scale.minimum, scale.halvings
    if not scale.collapsed:
        return 0.6, [
            Evidence(
                CODE,
                f"the log reports {scale.overflows} loss-scale overflows (skipped steps): the "
                "float16 gradients overflow again and again",
                {"overflows": scale.overflows},
            )
        ]
    confidence = 0.85 if (scale.collapse or minimum) else 0.75
    if story and not scales and not minimum:
        confidence = 0.7  # the skipped steps were inferred (a frozen schedule), not seen
    text = "the loss scale collapsed"
    if story:
        text = story  # what the recorder (or the log reader) saw, in its own words
        if halvings >= 1:
            text += f"; the scale went {num(max(scales))} -> {num(scales[-1])}"
    elif scales:
        text += f": {num(max(scales))} -> {num(scales[-1])} ({num(halvings)} halvings)"
    if scale.skipped:
        text += f", {scale.skipped} steps skipped for inf/NaN gradients"
    if minimum and str(minimum[0].get("line")) not in text:
        text += f"; the log says the scale is at its minimum (line {minimum[0].get('line')})"
    return confidence, [Evidence(CODE, text, {"scales": list(scales[-16:]),
                                              "skipped": scale.skipped, "halvings": halvings})]
