"""What a log shows beyond its values, established once its records are read.

A log holds numbers and messages; some facts follow from them by mechanism, and the rules should
not have to rediscover them. :func:`establish` writes them into the records, in the convention the
PyTorch adapter uses for the same facts seen live (:mod:`nanscope.torch.precision`):

- **skipped steps**: non-finite values followed by finite ones. A NaN gradient that reaches the
  weights makes them NaN for good, so a log whose values are finite again after a non-finite loss
  or gradient norm shows an update that was not applied: a loss scaler skipped it (or the loop
  did). Those records get ``events: ["skipped_step"]`` and ``extra.skipped_step``; they keep their
  ``nf_*`` flags (the values were non-finite) but are not where the fit broke. A framework message
  that the loss became non-finite and a checkpoint was reloaded vetoes this reading.
- **the NaN filter**: a loss of exactly ``0.0`` logged where the gradient norm is NaN, or where
  the learning rate stops advancing (a scheduler that moved every logged step before): the Hugging
  Face Trainer's ``logging_nan_inf_filter`` writes 0.0 for a window of NaN losses, and its
  scheduler does not step when the gradient scaler skipped the optimizer step. Those records get
  ``events: ["loss_nan_filtered"]``.
- **the loss scaler gave up**: its scale at or below 1 (the gradients overflow float16 unscaled),
  a message that it is at its minimum, or every update skipped from some point to the end of the
  log (the learning rate frozen while the loss stays NaN or filtered). The record where that run
  starts gets ``events: ["loss_scale_collapse"]``, ``nf_grads = 1`` and ``extra.fp16_story`` (what
  the log shows, in words).
- **a non-finite loss the framework reported** (detectron2's ``Loss became infinite or NaN at
  iteration=N``, mmdetection's, Ultralytics'): when no record shows it, a record at that update
  (or right after the last one) with ``nf_loss = 1`` and ``events: ["loss_nonfinite_reported"]``.
- a log that holds only loss-scaler messages gets one record per skipped step, with its scale.

``meta["loss_scale"]`` summarises the scale seen (first, least, last, overflows, floor) and
``meta["skipped_steps"]`` counts the skipped updates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from nanscope.logs._common import Record

__all__ = ["SCALE_FLOOR", "SKIP_LIMIT", "establish"]

#: a loss scale at or below this while the scaler still overflows: the gradients overflow
#: float16 unscaled (DeepSpeed and Megatron stop at 1; fairseq goes on to 1e-4)
SCALE_FLOOR = 1.0
#: this many updates skipped in a row with no recovery is a collapse (as the live adapter counts)
SKIP_LIMIT = 25
#: a run of non-finite records that stops before the end by at least this many finite records
#: recovered (one is enough in principle; a finite value right before the log is cut is weak)
RECOVERED = 1

_SCALER_KINDS = ("loss_scale_overflow", "loss_scale_min")


def establish(records: list[Record], meta: dict[str, Any]) -> list[Record]:
    """Write the facts above into ``records`` (in place) and ``meta``; returns the records (new
    ones made from messages where the log had none)."""
    messages = [m for m in meta.get("messages") or [] if isinstance(m, Mapping)]
    if not records:
        records = _from_scaler_messages(messages)
        if not records:
            return records
    _reported(records, messages)
    _nan_filter(records)
    reloaded = any(m.get("kind") == "nonfinite_loss" for m in messages)
    skipped = 0 if reloaded else _skipped_steps(records)
    _gave_up(records, messages)
    scales = _scale_summary(records, messages)
    if scales:
        meta["loss_scale"] = scales
    if skipped:
        meta["skipped_steps"] = skipped
    return records


def _bad(record: Record) -> bool:
    events = record.get("events") or ()
    return bool(record.get("nf_loss") or record.get("nf_grads") or "loss_nan_filtered" in events)


def _clean(record: Record) -> bool:
    """A record whose logged loss (and gradient norm, if logged) are finite, not filtered."""
    if _bad(record):
        return False
    loss = record.get("loss")
    grad = record.get("grad_norm")
    if loss is None and grad is None:
        return False
    return (loss is None or math.isfinite(loss)) and (grad is None or math.isfinite(grad))


def _tag(record: Record, event: str) -> None:
    events = record.get("events")
    if not isinstance(events, list):
        events = record["events"] = []
    if event not in events:
        events.append(event)


def _extra(record: Record) -> dict[str, Any]:
    extra = record.get("extra")
    if not isinstance(extra, dict):
        extra = record["extra"] = {}
    return extra


def _runs(records: list[Record]) -> list[tuple[int, int]]:
    """``(start, end)`` of every maximal run of non-finite (or filtered) records."""
    runs = []
    i, n = 0, len(records)
    while i < n:
        if _bad(records[i]):
            j = i
            while j < n and _bad(records[j]):
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def _recovered(records: list[Record], end: int) -> bool:
    """Finite records follow the run that ends at ``end``, on increasing steps (a log restarted
    from a checkpoint counts its steps again: that is no recovery of the same weights)."""
    after = records[end : end + RECOVERED]
    if len(after) < RECOVERED or not all(_clean(r) for r in after):
        return False
    before = records[end - 1].get("step")
    step = after[0].get("step")
    return not (isinstance(before, int) and isinstance(step, int) and step <= before)


def _skipped_steps(records: list[Record]) -> int:
    count = 0
    for start, end in _runs(records):
        if not _recovered(records, end):
            continue
        for k, record in enumerate(records[start:end], 1):
            _tag(record, "skipped_step")
            extra = _extra(record)
            extra["skipped_step"] = True
            extra["consecutive_skips"] = k
        count += end - start
    return count


def _nan_filter(records: list[Record]) -> None:
    """Mark the zeros the Trainer's NaN filter wrote (see the module docstring)."""
    seen_nonzero = False
    for i, record in enumerate(records):
        loss = record.get("loss")
        if loss is None:
            continue
        if loss != 0.0:
            seen_nonzero = seen_nonzero or math.isfinite(loss)
            continue
        if not seen_nonzero:
            continue  # zero from the start: not a loss that collapsed
        grad = record.get("grad_norm")
        if (grad is not None and not math.isfinite(grad)) or _lr_frozen(records, i):
            _tag(record, "loss_nan_filtered")


#: a scheduler "moves at every logged step" when the last this many learning rates before a
#: frozen one all differ (a step schedule, flat between its drops, never looks so)
MOVING = 3


def _lr_frozen(records: list[Record], index: int) -> bool:
    """The learning rate of record ``index`` equals the last one logged with a real loss, while
    each of the :data:`MOVING` before that differed from the one before it: a scheduler that
    moved at every logged step stopped moving."""
    lr = records[index].get("lr")
    if not isinstance(lr, float) or not math.isfinite(lr):
        return False
    before: list[float] = []
    for record in reversed(records[:index]):
        value = record.get("lr")
        if record.get("loss") == 0.0 or _bad(record):
            continue  # (the frozen run itself)
        if isinstance(value, float) and math.isfinite(value):
            before.append(value)
        if len(before) > MOVING:
            break
    if len(before) <= MOVING or before[0] != lr:
        return False
    return all(a != b for a, b in pairwise(before))


def _gave_up(records: list[Record], messages: list[Mapping[str, Any]]) -> None:
    """Mark where the loss scaler gave up (see the module docstring): at the first non-finite
    record it never recovered from, when the scale reached its floor after it."""
    at_floor = _floor_record(records, messages)
    if at_floor is not None:
        index, story = at_floor
        start = _last_run_start(records)
        if start is not None and start < index:
            story = (f"from update {records[start].get('step')} on no update was applied with "
                     f"finite values again, and {story}")  # fmt: skip
            index = start
        _collapse(records[index], story)
        return
    runs = _runs(records)
    if not runs:
        return
    start, end = runs[-1]
    if end != len(records) or _recovered(records, end):
        return
    frozen = [_lr_frozen(records, i) for i in range(start, end)]
    skipped_in_row = _skipped_in_a_row(records, start)
    if all(frozen) and end - start >= 2:
        lr = records[start].get("lr")
        hidden = any("loss_nan_filtered" in (r.get("events") or ()) for r in records[start:end])
        story = (
            f"the learning rate stopped at {lr:g} from update {records[start].get('step')} to the "
            f"end of the log ({end - start} records) while it moved at every record before, and "
            "the loss stayed " + ("NaN (logged as 0.0 by the Trainer's NaN filter)" if hidden
                                   else "non-finite")
            + ": a scheduler stops when the optimizer step is skipped, as a dynamic loss scaler "
            "does when the gradients hold inf/NaN at every scale it tries; inferred from the log "
            "(the scale itself was not logged)"
        )  # fmt: skip
        _collapse(records[start], story)
    elif skipped_in_row >= SKIP_LIMIT:
        story = (
            f"every update from {records[start].get('step')} to the end of the log was skipped "
            f"({skipped_in_row} in a row, as the log's skip counts say): the gradients overflow "
            "float16 at every scale tried"
        )
        _collapse(records[start], story)


def _last_run_start(records: list[Record]) -> int | None:
    """The first non-finite record after the last record with finite values (None when the
    log ends on finite values)."""
    last_clean = max((i for i, r in enumerate(records) if _clean(r)), default=-1)
    return next((i for i in range(last_clean + 1, len(records)) if _bad(records[i])), None)


def _skipped_in_a_row(records: list[Record], start: int) -> int:
    """Updates skipped in a row from ``start`` to the end, from per-interval skip counts
    (Megatron's ``number of skipped iterations``): an interval whose count equals its length."""
    total = 0
    before = records[start - 1].get("step") if start > 0 else None
    for record in records[start:]:
        skipped = (record.get("extra") or {}).get("skipped")
        step = record.get("step")
        if not isinstance(skipped, (int, float)) or not isinstance(step, int):
            return total
        length = step - before if isinstance(before, int) else int(skipped)
        if skipped < length:
            return 0
        total += int(skipped)
        before = step
    return total


def _collapse(record: Record, story: str) -> None:
    _tag(record, "loss_scale_collapse")
    record["nf_grads"] = 1  # the gradients are non-finite at every scale tried
    events = record.get("events") or []
    if "skipped_step" in events:
        events.remove("skipped_step")
        _extra(record).pop("skipped_step", None)
    _extra(record)["fp16_story"] = story


def _floor_record(
    records: list[Record], messages: list[Mapping[str, Any]]
) -> tuple[int, str] | None:
    """The record where the loss scale reached its floor, and what the log says about it."""
    for message in messages:
        if message.get("kind") == "loss_scale_min":
            index = _index_at(records, message)
            scale = message.get("scale")
            story = f"log line {message.get('line')}: {message.get('text')}" + (
                f" (the scale had reached {scale:g})" if isinstance(scale, float) else ""
            )
            return index, story
    for index, record in enumerate(records):
        scale = (record.get("extra") or {}).get("loss_scale")
        if isinstance(scale, (int, float)) and 0 <= scale <= SCALE_FLOOR:
            story = (
                f"the loss scale reached {scale:g} at update {record.get('step')}: at or below "
                f"{SCALE_FLOOR:g} the gradients overflow float16 even unscaled"
            )
            return index, story
    for message in messages:
        scale = message.get("scale")
        kind = message.get("kind")
        if kind == "loss_scale_overflow" and isinstance(scale, float) and scale <= SCALE_FLOOR:
            story = (
                f"log line {message.get('line')}: the loss scaler overflowed again at a "
                f"scale of {scale:g}: the gradients overflow float16 even unscaled"
            )
            return _index_at(records, message), story
    return None


def _index_at(records: list[Record], message: Mapping[str, Any]) -> int:
    """The record a message belongs to: the one made from it (a log of messages only), else the
    last one at or before its step (the last record for a message after all of them)."""
    line = message.get("line")
    for index, record in enumerate(records):
        if line is not None and (record.get("extra") or {}).get("line") == line:
            return index
    step = message.get("step")
    if not isinstance(step, int):
        return len(records) - 1
    found = 0
    for index, record in enumerate(records):
        if isinstance(record.get("step"), int) and record["step"] <= step:
            found = index
    return found


def _reported(records: list[Record], messages: list[Mapping[str, Any]]) -> None:
    """A record for a non-finite loss a framework reported that no record shows."""
    for message in messages:
        if message.get("kind") != "nonfinite_loss":
            continue
        at = message.get("at_step")
        last = records[-1].get("step")
        step = at if isinstance(at, int) else message.get("step")
        if not isinstance(step, int) or not isinstance(last, int):
            continue
        if at is None:
            step = step + 1 if step >= last else step
        if any(_bad(r) for r in records if isinstance(r.get("step"), int) and r["step"] >= step):
            continue  # the records show it already
        if step <= last:
            continue
        records.append(
            {
                "step": step,
                "nf_loss": 1,
                "events": ["loss_nonfinite_reported"],
                "extra": {"reported": str(message.get("text"))[:200]},
            }
        )
        return


def _from_scaler_messages(messages: list[Mapping[str, Any]]) -> list[Record]:
    """One record per skipped step of a log that holds only loss-scaler messages."""
    records: list[Record] = []
    for number, message in enumerate(messages, 1):
        if message.get("kind") not in _SCALER_KINDS:
            continue
        record: Record = {"step": number, "events": ["skipped_step"],
                          "extra": {"skipped_step": True, "line": message.get("line")}}  # fmt: skip
        scale = message.get("scale")
        if isinstance(scale, float):
            record["extra"]["loss_scale"] = scale
        records.append(record)
    return records


def _scale_summary(records: list[Record], messages: list[Mapping[str, Any]]) -> dict[str, Any]:
    scales = [
        float(r["extra"]["loss_scale"])
        for r in records
        if isinstance(r.get("extra"), dict) and isinstance(r["extra"].get("loss_scale"), float)
    ]
    if not scales:
        scales = [
            float(m["scale"])
            for m in messages
            if m.get("kind") == "loss_scale_overflow" and isinstance(m.get("scale"), float)
        ]
    overflows = sum(1 for m in messages if m.get("kind") == "loss_scale_overflow")
    if not scales and not overflows:
        return {}
    out: dict[str, Any] = {"overflows": overflows}
    if scales:
        out.update(first=scales[0], least=min(scales), last=scales[-1])
    out["floor"] = any("loss_scale_collapse" in (r.get("events") or ()) for r in records)
    return out
