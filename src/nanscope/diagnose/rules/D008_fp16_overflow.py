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
from typing import Any

from nanscope.diagnose.context import Context
from nanscope.diagnose.diagnosis import Evidence, Finding
from nanscope.diagnose.rules._common import num
from nanscope.diagnose.rules._producer import producer_of
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


def _scale_story(ctx: Context) -> tuple[float, list[Evidence]]:
    """Confidence and evidence from the loss-scale history and scaler log lines."""
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
    evidence: list[Evidence] = []
    confidence = 0.0
    if not (collapse or minimum) and ctx.fail is None and _recovered(ctx, overflow):
        # a scaler that skipped steps and then trained on: it was finding its scale (from 2^32
        # at DeepSpeed's start) or probing upwards, which it does in every healthy fp16 run
        return confidence, evidence
    if collapse or halvings >= HALVINGS or minimum:
        confidence = 0.85 if (collapse or minimum) else 0.75
        if story and not scales and not minimum:
            confidence = 0.7  # the skipped steps were inferred (a frozen schedule), not seen
        text = "the loss scale collapsed"
        if story:
            text = story  # what the recorder (or the log reader) saw, in its own words
            if halvings >= 1:
                text += f"; the scale went {num(max(scales))} -> {num(scales[-1])}"
        elif scales:
            text += f": {num(max(scales))} -> {num(scales[-1])} ({num(halvings)} halvings)"
        if skipped:
            text += f", {skipped} steps skipped for inf/NaN gradients"
        if minimum and str(minimum[0].get("line")) not in text:
            text += f"; the log says the scale is at its minimum (line {minimum[0].get('line')})"
        evidence.append(Evidence(CODE, text, {"scales": scales[-16:], "skipped": skipped,
                                              "halvings": halvings}))  # fmt: skip
    elif len(overflow) >= HALVINGS:
        confidence = 0.6
        evidence.append(
            Evidence(
                CODE,
                f"the log reports {len(overflow)} loss-scale overflows (skipped steps): the "
                "float16 gradients overflow again and again",
                {"overflows": len(overflow)},
            )
        )
    return confidence, evidence


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
    located: dict[str, Any] = ctx.located or {}
    dtype = str(located.get("dtype") or "")
    autocast = str(located.get("autocast") or "")
    inputs = str(located.get("inputs") or "")
    absmax = located.get("input_absmax")
    evidence: list[Evidence] = []
    confidence = 0.0
    half = dtype in ("float16", "bfloat16") or autocast == "float16"
    prod = producer_of(located)
    precision = prod.precision if prod is not None else None
    if prod is not None and half and precision and not prod.inputs_nonfinite():
        # measured: the op recomputed in a wider dtype is finite and past the narrow one's limit
        confidence = 0.95 if prod.observed else 0.7
        text = (f"the producer is {prod.where()} in {precision.get('dtype', dtype)}: "
                f"{precision.get('text')}")  # fmt: skip
        text += f" [{prod.how()}, {prod.phase or '?'}]"
        evidence.append(Evidence(CODE, text, {"op": prod.op, "module": located.get("module"),
                                              "dtype": precision.get("dtype"),
                                              "value": precision.get("value"),
                                              "limit": precision.get("limit"),
                                              "observed": prod.observed}))  # fmt: skip
        if prod.loss_scale is not None:
            evidence.append(Evidence(CODE, prod.scale_text() + (
                f"; unscaled, the largest value would be "
                f"{num(float(precision.get('value') or 0.0) / prod.loss_scale)}"),
                {"loss_scale": prod.loss_scale}))  # fmt: skip
        chain = prod.chain_text()
        if chain:
            evidence.append(Evidence(CODE, chain, {"chain": located.get("chain")}))
    elif located and half and not inputs.startswith("non-finite"):
        near = isinstance(absmax, (int, float)) and absmax >= HALF_MAX / 256
        where = f"{located.get('op')}" + (f" in {located['module']}" if located.get("module")
                                          else "")  # fmt: skip
        if inputs == "past the half range" or near:
            confidence = 0.92 if (prod is None or prod.observed) else 0.65
            evidence.append(
                Evidence(
                    CODE,
                    f"the first non-finite value appeared in float16, at {where}"
                    + (f", whose inputs reached {num(absmax)}" if near else "")
                    + f": its result passed the half range ({num(HALF_MAX)})",
                    {"op": located.get("op"), "module": located.get("module"),
                     "dtype": "float16", "input_absmax": absmax},
                )
            )
            if prod is not None and prod.loss_scale is not None:
                evidence.append(Evidence(CODE, prod.scale_text(),
                                         {"loss_scale": prod.loss_scale}))  # fmt: skip
        elif inputs.startswith("exactly zero"):
            confidence = 0.4  # an underflow to 0 in half precision, then a log/division of it
            evidence.append(
                Evidence(
                    CODE,
                    f"{where} ran in float16 and its input was exactly 0: small values "
                    "underflow to 0 in half precision (below 6e-8)",
                    {"op": located.get("op"), "dtype": "float16"},
                )
            )
            eps = ctx.trace.meta.get("optimizer_eps")
            if (located.get("phase") == "optimizer" and dtype == "float16"
                    and isinstance(eps, (int, float)) and 0 < eps < HALF_TINY):  # fmt: skip
                # the optimizer's epsilon itself is 0 in half precision: its denominator
                # sqrt(v) + eps is exactly 0 wherever the second moment underflowed
                confidence = 0.85
                evidence.append(Evidence(
                    CODE, f"the optimizer's eps ({num(eps)}) is 0 in float16 (below its smallest "
                    f"value, {num(HALF_TINY)}): the step's denominator sqrt(v) + eps is exactly 0 "
                    "wherever the second moment underflowed, so the weights' dtype, not the "
                    "eps the script set, made the 0/0", {"eps": eps}))  # fmt: skip
    scale_conf, scale_ev = _scale_story(ctx)
    if scale_conf:
        confidence = max(confidence, scale_conf) + (0.05 if confidence else 0.0)
        evidence.extend(scale_ev)
    if not evidence:
        return None
    actions = list(ACTIONS)
    if ctx.filtered_nan.any():
        actions.append(
            "The log shows 0.0 where the loss was NaN (the Trainer's logging_nan_inf_filter, on "
            "by default): turn it off next run so the log shows the NaN; with the Trainer, "
            "bf16=True instead of fp16=True avoids the overflow where the GPU supports it."
        )
    source = (located.get("source") or {}) if located else {}
    if source.get("file"):
        actions.insert(0, f"The overflow is at {source['file']}:{source.get('line')}.")
    if prod is not None and prod.loss_scale is not None:
        actions.insert(0, f"Drop the fixed loss scale ({num(prod.loss_scale)}): use "
                          "torch.amp.GradScaler, which lowers the scale when the gradients "
                          "overflow, or a scale small enough that the largest gradient stays "
                          "below 65504.")  # fmt: skip
    i = ctx.fail
    return Finding(
        rule=CODE,
        cause=CAUSE,
        confidence=confidence,
        evidence=evidence,
        actions=actions,
        step=ctx.step_at(i) if i is not None else located.get("step"),
        located=located or None,
        alternatives=[("zero_division", 0.3)] if inputs.startswith("exactly zero") else [],
    )
