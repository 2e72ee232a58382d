"""What every rule needs to know about a trace, computed once.

Rules are pure functions of a :class:`Context`. The context finds the failing update, the window
before it, and the shapes the seed documents name: a growth phase (consecutive rising updates), a
long descent, a sudden spike. All measures are scale-free: ratios, signs, counts, and robust
statistics against the run's own history.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from nanscope.outcome import Outcome, judge
from nanscope.trace import HAND_WRITTEN_SGD, Trace

__all__ = ["ADAPTIVE_OPTIMIZERS", "LIVE_SOURCES", "Context", "Rise"]

#: what a watched run writes as its trace's ``source`` (a log reader writes the file's kind)
LIVE_SOURCES = ("monitor", "torch", "keras", "lightning", "transformers")
#: names (lower case, in part) of optimizers whose step is normalised per weight
ADAPTIVE_OPTIMIZERS = ("adam", "rmsprop", "adagrad", "adadelta", "adafactor", "lion")


@dataclass(frozen=True)
class Rise:
    """A run of consecutive rising updates ending just before the failure (or the end)."""

    start: int  # index of the last update before the rise
    end: int  # index of the last rising update
    length: int
    growth: float  # loss[end] / loss[start] for positive losses
    accelerating: int  # how many increments exceeded 1.2x the previous one
    median_ratio: float = math.nan  # median per-update growth factor (positive losses)
    top_share: float = math.nan  # share of the total log-growth made by the largest single update

    @property
    def geometric(self) -> bool:
        return self.length >= 2 and self.accelerating >= max(1, self.length - 2)

    @property
    def sustained(self) -> bool:
        """Growth carried by every update, not one jump on top of noise (scale-free)."""
        if math.isnan(self.median_ratio):
            return self.geometric
        if self.length >= 8 and not self.top_share > 0.5:
            return True  # a long climb by a steady factor: a slow divergence
        if self.length >= 3:
            return self.median_ratio >= 1.3 and not self.top_share > 0.8
        return self.median_ratio >= 2.0 and not self.top_share > 0.9


class Context:
    """A trace plus the evidence the probes gathered, with the derived series the rules share."""

    def __init__(self, trace: Trace, evidence: Mapping[str, Any] | None = None) -> None:
        self.trace = trace
        self.evidence: dict[str, Any] = dict(evidence or {})
        self.records = trace.records
        self.n = len(trace.records)
        self.granularity = trace.granularity
        self.loss = trace.column("loss")
        self.steps = trace.steps()

    @cached_property
    def adaptive(self) -> bool:
        """The optimizer normalises each weight's step by the gradient's running size (Adam,
        AdamW, RMSprop, Adagrad and kin): its step is about lr per weight whatever the
        gradient's scale, so a gradient that grew 1e9x does not make a step 1e9x larger."""
        name = str(self.trace.meta.get("optimizer") or "").lower()
        return any(k in name for k in ADAPTIVE_OPTIMIZERS)

    # ------------------------------------------------------------------ the failure

    @cached_property
    def nonfinite(self) -> dict[str, np.ndarray]:
        return {what: self.trace.nonfinite(what) for what in
                ("loss", "grads", "params", "inputs", "targets")}  # fmt: skip

    @cached_property
    def filtered_nan(self) -> np.ndarray:
        """Updates whose loss a logger replaced by 0.0 to hide a NaN (HF logging_nan_inf_filter)."""
        return np.array(
            ["loss_nan_filtered" in (r.get("events") or []) for r in self.records], dtype=bool
        )

    @cached_property
    def skipped(self) -> np.ndarray:
        """Updates a loss scaler (or the loop) skipped and the fit recovered from: their
        non-finite values never reached the weights (``skipped_step`` events, by the torch
        adapter or a log reader) and a finite loss comes after them; not where the scaler gave
        up (``loss_scale_collapse``). A live run stopped at a skipped NaN stops there."""
        tagged = np.array(
            [
                "skipped_step" in events and "loss_scale_collapse" not in events
                for events in (r.get("events") or () for r in self.records)
            ],
            dtype=bool,
        )
        finite = np.isfinite(self.loss).astype(np.int64)
        after = np.cumsum(finite[::-1])[::-1] - finite  # finite losses after each update
        return tagged & (after > 0)

    @cached_property
    def fail(self) -> int | None:
        """Index of the first update with a non-finite loss, gradient or weight (a skipped
        update is not where the fit broke)."""
        nf = self.nonfinite
        bad = (nf["loss"] > 0) | (nf["grads"] > 0) | (nf["params"] > 0) | self.filtered_nan
        hits = np.flatnonzero(bad & ~self.skipped)
        return int(hits[0]) if hits.size else None

    @cached_property
    def first_nonfinite(self) -> dict[str, Any] | None:
        i = self.fail
        if i is None:
            return None
        nf = self.nonfinite
        if nf["inputs"][i] > 0 or nf["targets"][i] > 0:
            what = "input"
        elif nf["loss"][i] > 0 or self.filtered_nan[i]:
            what = "loss"
        elif nf["grads"][i] > 0:
            what = "grad"
        else:
            what = "weight"
        return {"step": int(self.steps[i]), "what": what}

    @cached_property
    def alarm(self) -> dict[str, Any] | None:
        """The detector alarm that stopped the run; for traces read after the fact (logs, a
        killed run), the alarm the same detectors raise when replayed over the records."""
        alarm = self.evidence.get("alarm")
        if isinstance(alarm, Mapping):
            return dict(alarm)
        if self.evidence.get("replayed") is False:
            return None
        from nanscope.detectors import Ascent, Departure, Divergence, Explosion

        detectors: list[Ascent | Divergence | Departure | Explosion] = [
            Ascent(), Divergence(), Departure(), Explosion()]
        # alarms the run held (an experiment showed the data stepped up, not the weights)
        held = {e.get("step") for e in self.trace.meta.get("events") or []
                if isinstance(e, Mapping) and e.get("event") == "held"}  # fmt: skip
        for record in self.records:
            loss = record.get("loss")
            if loss is None or not math.isfinite(loss):
                return None  # the first non-finite update comes first
            for detector in detectors:
                fired = detector.step(dict(record))
                if fired is not None and fired.step not in held:
                    return {"kind": fired.kind, "step": fired.step, "text": fired.text,
                            "replayed": True, **fired.data}  # fmt: skip
        return None

    @cached_property
    def stop(self) -> int | None:
        """Index where a divergence/ascent detector stopped the run before any NaN."""
        alarm = self.alarm
        if not alarm or alarm.get("kind") not in ("diverging", "ascending"):
            return None
        hits = np.flatnonzero(self.steps == int(alarm.get("step", -1)))
        return int(hits[0]) if hits.size else self.n - 1

    @cached_property
    def end(self) -> int:
        """Exclusive end of the 'before it broke' window."""
        if self.fail is not None:
            return self.fail
        if self.stop is not None:
            return self.stop + 1
        return self.n

    @cached_property
    def break_index(self) -> int:
        """Index of the update a finding about the whole run names: the failure, else where a
        detector stopped the run, else the last update."""
        if self.fail is not None:
            return self.fail
        if self.stop is not None:
            return self.stop
        return self.n - 1

    def step_ratio_at(self, index: int) -> float | None:
        """||update|| / ||weights before it|| of the step that led into update ``index`` (the
        update norm is recorded on the update after the step, the weight norm the step started
        from on an update before it), or None where they were not recorded or the weights were
        all zero (every first step from zero moves them by all of their norm: that says
        nothing of its size)."""
        un = self.trace.column("update_norm")
        wn = self.trace.column("weight_norm")
        if self.trace.meta.get("optimizer") == HAND_WRITTEN_SGD:
            # a loop that updates by hand: w -= lr * g, its lr read off the update (carried by
            # the record after it) and g the gradient the update before applied
            lr, gn = self.trace.column("lr"), self.trace.column("grad_norm")
            sgd = np.full_like(un, np.nan)
            sgd[1:] = np.abs(lr[1:]) * gn[:-1]
            un = np.where(np.isfinite(un), un, sgd)
        for j in (index, index - 1):
            if 0 <= j < self.n and math.isfinite(un[j]):
                before = wn[:j][np.isfinite(wn[:j])]
                if before.size and before[-1] > 0:
                    return float(un[j] / before[-1])
                return None
        return None

    def step_at(self, index: int | None) -> int | None:
        if index is None or not 0 <= index < self.n:
            return None
        return int(self.steps[index])

    @cached_property
    def live(self) -> bool:
        """The trace was recorded by a watched run (a Monitor, the torch adapter, a trainer
        callback), not read from a log after the fact."""
        meta = self.trace.meta
        # a nanscope trace read from its file: the file's path is its source, the format says it
        return str(meta.get("source") or "").startswith(LIVE_SOURCES) or (
            meta.get("format") == "nanscope")

    # ------------------------------------------------------------------ shapes of the curve

    @cached_property
    def outcome(self) -> Outcome:
        """How the loss ended (:func:`nanscope.outcome.judge`), over the updates that carry one.
        A watched run's trace begins at the fit's first update; a log may begin anywhere."""
        return judge(self.loss[self.trace.present("loss")].tolist(), from_init=self.live)

    @cached_property
    def finite_loss(self) -> np.ndarray:
        return self.loss[: self.end][np.isfinite(self.loss[: self.end])]

    def rise_before(self, end: int | None = None) -> Rise | None:
        """The run of consecutive rising losses that ends at ``end - 1``."""
        end = self.end if end is None else end
        loss = self.loss
        i = end - 1
        if i < 1 or not math.isfinite(loss[i]):
            return None
        j = i
        while j >= 1 and math.isfinite(loss[j - 1]) and loss[j] > loss[j - 1]:
            j -= 1
        length = i - j
        if length == 0:
            return None
        window = loss[j : i + 1]
        deltas = np.diff(window)
        accelerating = int(np.sum(deltas[1:] >= 1.2 * deltas[:-1]))
        median_ratio = top_share = math.nan
        if window[0] > 0:
            growth = float(window[-1] / window[0])
            with np.errstate(all="ignore"):
                logs = np.log(window[1:] / window[:-1])
            median_ratio = float(np.exp(np.median(logs)))
            total = float(np.sum(logs))
            top_share = float(np.max(logs) / total) if total > 0 else math.nan
        else:
            growth = float(deltas[-1] / deltas[0]) if deltas[0] > 0 else math.inf
        return Rise(j, i, length, growth, accelerating, median_ratio, top_share)

    def spike_onset(self, index: int, factor: float = 10.0) -> int:
        """First update of the jump that ends at ``index``: walk back over updates that each
        multiplied the loss by ``factor`` or more (or went non-finite)."""
        loss = self.loss
        j = index
        while j >= 1:
            a, b = loss[j - 1], loss[j]
            jump = not math.isfinite(b) or (math.isfinite(a) and a > 0 and b / a >= factor)
            if not jump or not math.isfinite(a):
                break
            j -= 1
        # j is now the last update before the jump, unless no update jumped at all
        return j + 1 if j < index else index

    @cached_property
    def rise(self) -> Rise | None:
        return self.rise_before()

    def descended_before(self, end: int) -> bool:
        """The loss went down over a good number of updates before index ``end``."""
        loss = self.loss[:end]
        if end < 6:
            return False
        head = loss[: max(2, min(5, end // 5))]
        tail = loss[max(0, end - 5) : end]
        head, tail = head[np.isfinite(head)], tail[np.isfinite(tail)]
        if not head.size or not tail.size:
            return False
        first, last = float(np.median(head)), float(np.median(tail))
        return last < first - 0.02 * abs(first)

    def spike_ratio(self, index: int) -> float:
        """Loss at ``index`` over the median of the few updates before it (inf when non-finite)."""
        if not 0 <= index < self.n:
            return math.nan
        value = self.loss[index]
        before = self.loss[max(0, index - 6) : index]
        before = before[np.isfinite(before)]
        if not before.size:
            return math.nan
        ref = float(np.median(before))
        if not math.isfinite(value):
            return math.inf
        if ref <= 0:
            return math.nan
        return float(value / ref)

    # ------------------------------------------------------------------ update direction

    def column(self, key: str, end: int | None = None) -> np.ndarray:
        return self.trace.column(key)[: self.end if end is None else end]

    @cached_property
    def update_cos(self) -> np.ndarray:
        """Cosine(update, gradient) in the convention the caller follows.

        ``update_cos`` assumes ``update()`` is called before the step (the documented way);
        ``update_cos_same`` fits callers that pass the weights after stepping. The one whose values
        sit closer to +-1 is the caller's convention.
        """
        prev = self.trace.column("update_cos")
        same = self.trace.column("update_cos_same")
        a, b = np.abs(prev[np.isfinite(prev)]), np.abs(same[np.isfinite(same)])
        if b.size and (not a.size or float(np.median(b)) > float(np.median(a)) + 0.05):
            return same
        return prev

    # ------------------------------------------------------------------ rows

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        """Every bad row seen: the records' own and the probes', tagged with their update."""
        seen: set[tuple[Any, ...]] = set()
        out: list[dict[str, Any]] = []
        for row in self.evidence.get("rows") or []:
            key = (row.get("step"), row.get("source"), row.get("batch_row"), row.get("why"))
            if key not in seen:
                seen.add(key)
                out.append(dict(row))
        for record in self.records:
            for row in record.get("rows") or []:
                row = {"step": record.get("step"), **row}  # a probe's own step wins
                key = (row.get("step"), row.get("source"), row.get("batch_row"), row.get("why"))
                if key not in seen:
                    seen.add(key)
                    out.append(row)
        return out

    def rows_near(
        self, index: int | None, why: tuple[str, ...], back: int = 1
    ) -> list[dict[str, Any]]:
        """Rows of the given kinds seen at update ``index`` or up to ``back`` updates before it."""
        if index is None:
            return []
        steps = {self.step_at(i) for i in range(max(0, index - back), index + 1)}
        found = [r for r in self.rows if r.get("why") in why and r.get("step") in steps]
        found.sort(key=lambda r: (-(r.get("step") or 0), -(r.get("z") or 0.0)))
        return found

    # ------------------------------------------------------------------ logs

    @cached_property
    def messages(self) -> list[dict[str, Any]]:
        msgs = list(self.trace.meta.get("messages") or [])
        msgs.extend(self.evidence.get("messages") or [])
        return msgs

    def messages_of(self, *kinds: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("kind") in kinds]

    @cached_property
    def lr_now(self) -> float | None:
        lr = self.trace.column("lr")[: max(self.end, 1)]
        lr = lr[np.isfinite(lr)]
        return float(lr[-1]) if lr.size else None

    @property
    def located(self) -> dict[str, Any] | None:
        located = self.evidence.get("located")
        return dict(located) if isinstance(located, Mapping) else None
