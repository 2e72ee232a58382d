"""The torch record builder: one optimizer step's measures in, one trace record out.

Every torch entry point (``nanscope.watch``, ``nanscope run``'s autowatch, the Lightning and Hugging
Face callbacks) builds its records here, through a :class:`~nanscope.torch.watcher.Watcher`, so a
run is diagnosed from the same records whichever way it was watched. Two halves, so the device can
be read late (:mod:`nanscope.torch.deferred`):

* :meth:`RecordBuilder.pack` gathers the step's device-side values into one float32 vector: the
  loss, the batch's min/max (on full updates), the pre-clip norm, the loss scale and the fused
  parameter measures (:class:`~nanscope.torch.measure.ParamMeasure`), with a ``ctx`` saying where
  each sits;
* :meth:`RecordBuilder.unpack` turns the host copy of that vector into the record (keys of
  :mod:`nanscope.trace`), adding the sampled update statistics when a detector can use them and the
  skipped full measures at a non-finite update.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch
from nanscope.schedule import Every, Rises
from nanscope.torch.measure import ParamMeasure, batch_stats, column_scale
from nanscope.torch.sharded import measure_for
from nanscope.torch.window import StepWindow

__all__ = ["FULL_EVERY", "RecordBuilder", "count_nonfinite", "read_lr", "step_extra"]

#: default ``every``: the weight norm, per-layer gradient norms and batch max |x| every this many
#: updates (the loss, gradient finiteness and norm, and the sampled cosines on every update)
FULL_EVERY = 64


class RecordBuilder:
    """Builds the records of one optimizer (see the module docstring).

    every: take the full measures every ``every`` updates (:attr:`full`: the first of each
    ``every``, counted from 1); names: ``id(param) -> name``.
    """

    def __init__(self, every: int = FULL_EVERY) -> None:
        self.every = every
        #: the full updates: 1, every + 1, 2 * every + 1...
        self.full = Every(every, offset=1)
        #: the update after each full one (its direction sample is a point for the plots)
        self.after_full = Every(every, offset=2)
        self.names: dict[int, str] = {}
        self.measure: ParamMeasure | None = None
        self._groups_sig: list[tuple[int, int]] = []
        self._sampled_at = -1
        #: the first finite loss a record carried: where the run started
        self.first_loss: float | None = None
        self._scales_seen = False
        self._rises = Rises()
        # per-param gradient norms of recent updates, for the per-name norms at a stop
        self._gnorms: deque[tuple[int, list[float], Any]] = deque(maxlen=64)
        self._extra: dict[str, Any] = {}  # for the next record's ``extra``

    # ------------------------------------------------------------------ the parameters

    def params_changed(self, optimizer: Any) -> bool:
        """Cheap per-update test: a param group added, or a group's list replaced or resized."""
        groups = optimizer.param_groups
        sig = self._groups_sig
        if len(groups) != len(sig):
            return True
        for group, (list_id, size) in zip(groups, sig):
            params = group["params"]
            if id(params) != list_id or len(params) != size:
                return True
        return False

    def measure_for(self, optimizer: Any, params: list[torch.Tensor]) -> ParamMeasure:
        """The measure of these parameters (made anew when they are not the measured ones)."""
        key = (len(params), sum(id(p) for p in params))
        if self.measure is None or self.measure.key != key:
            self.measure = measure_for(params, self.names)
        self._groups_sig = _group_signature(optimizer)
        return self.measure

    def rename(self, names: dict[int, str]) -> None:
        """A model was bound: its parameter names (the measure is made anew)."""
        self.names = names
        self.measure = None

    def reset_history(self) -> None:
        """Forget the previous update (the sampled cosines start over): after a skip/rollback."""
        if self.measure is not None:
            self.measure.reset_history()

    def add_extra(self, extra: Mapping[str, Any]) -> None:
        """Fields for the next record's ``extra`` (a trainer's own logged values)."""
        self._extra.update(extra)

    def take_extra(self, record: dict[str, Any]) -> None:
        """The fields :meth:`add_extra` gave go into this record (its own win a clash)."""
        if self._extra:
            record["extra"] = {**self._extra, **record.get("extra", {})}
            self._extra = {}

    # ------------------------------------------------------------------ device side

    def pack(
        self,
        step: int,
        window: StepWindow,
        loss: Any,
        scale: torch.Tensor | None,
        *,
        interval: int,
        lr: float | None,
    ) -> tuple[torch.Tensor | None, dict[str, Any], tuple[Any, Any, Any]]:
        """This step's device vector, its ``ctx`` and its batch ``(inputs, targets, rows)``."""
        measure = self.measure
        assert measure is not None
        full = self.full.due(step)
        # read every update (CPU): the sample is taken after the read, only when it is wanted
        vec, layout = measure.device_vector(full, sample=interval > 1)
        if interval > 1:
            self._sampled_at = step
        targets = window.targets()
        inputs = window.inputs()
        dev = vec.device if vec is not None else _device_of(loss)
        if dev.type == "meta":
            dev = torch.device("cpu")
        parts: list[torch.Tensor] = []
        slots: dict[str, tuple[int, int]] = {}
        at = 0
        for name, t in (
            ("loss", loss),
            ("inputs", batch_stats(inputs) if full else None),
            ("targets", batch_stats(targets) if full else None),
            ("clip", window.clip_norm if window.clip_fresh else None),
            ("scale", scale),
            ("measure", vec),
        ):
            if t is None or t.device.type == "meta":
                continue
            if t.dtype != torch.float32:
                t = t.float()
            if t.device != dev:
                t = t.to(dev, non_blocking=True)
            if t.dim() != 1:
                t = t.reshape(-1)
            width = t.shape[0]
            slots[name] = (at, width)
            at += width
            parts.append(t)
        ctx = {"slots": slots, "layout": layout, "lr": lr, "micro": window.micro, "full": full,
               "interval": interval}  # fmt: skip
        device_vec = (torch.cat(parts) if len(parts) > 1 else parts[0]) if parts else None
        return device_vec, ctx, (inputs, targets, window.rows_of(inputs))

    # ------------------------------------------------------------------ host side

    def unpack(
        self, step: int, values: list[float], ctx: dict[str, Any], *, batch: Any, late: bool
    ) -> tuple[dict[str, Any], str, float | None]:
        """The record of ``step`` from its read ``values``; also what broke and the loss scale."""
        slots = ctx["slots"]
        record: dict[str, Any] = {"step": step}
        extra: dict[str, Any] = {}
        if "loss" in slots:
            loss = values[slots["loss"][0]]
            record["loss"] = loss
            record["nf_loss"] = 0 if math.isfinite(loss) else 1
        if ctx["lr"] is not None:
            record["lr"] = ctx["lr"]
        if "measure" in slots:
            start, width = slots["measure"]
            assert self.measure is not None
            measured = values[start : start + width]
            record.update(self.measure.record(measured, ctx["layout"]))
            n = int(ctx["layout"].get("n", 0))
            if n and "grad_norms" not in record:
                self._gnorms.append((step, measured[:n], ctx["layout"].get("has")))
        bad = bool(record.get("nf_loss") or record.get("nf_grads")
                   or record.get("grad_past_range"))  # fmt: skip
        if not late and not bad and "measure" in slots and not ctx["layout"].get("stats"):
            self.sample_if_wanted(step, record, full=ctx["full"])
        if bad and not ctx["full"]:
            self._full_at_failure(record, slots, batch, late=late)
        for source, prefix in (("inputs", "input"), ("targets", "target")):
            if source in slots:
                start, _ = slots[source]
                lo, hi = values[start], values[start + 1]
                absmax = max(abs(lo), abs(hi))
                if not math.isfinite(absmax):
                    record[f"nf_{source}"] = count_nonfinite(
                        batch[0 if source == "inputs" else 1]
                    )
                else:
                    record[f"nf_{source}"] = 0
                    record[f"{prefix}_absmax"] = absmax
                    if source == "inputs" and not self._scales_seen:
                        self._scales_seen = True  # the first batch's columns, once
                        scales = column_scale(batch[0])
                        if scales is not None:
                            record["input_scale_ratio"], record["input_scale_column"] = scales
        pre = values[slots["clip"][0]] if "clip" in slots else None
        step_extra(record, extra, pre_clip=pre, micro=ctx["micro"])
        scale = None
        if "scale" in slots:
            scale = values[slots["scale"][0]]
            extra["loss_scale"] = scale
        if late:
            extra["detected_late"] = True
        if extra:  # merged: the measures may have put their own (sharded: extra["shards"])
            record["extra"] = {**record.get("extra", {}), **extra}
        what = "loss"
        if record.get("nf_grads"):
            what = "grad"
        if record.get("nf_params"):
            what = "weight"
        if record.get("nf_loss"):
            what = "loss"
        return record, what, scale

    @property
    def last_loss(self) -> float | None:
        """The loss of the last record the sampling decision saw."""
        return self._rises.last

    @property
    def rises(self) -> int:
        """How many times in a row the loss rose, up to the last record."""
        return self._rises.count

    def keep_norms(self, step: int, gnorms: list[float]) -> None:
        """Keep this update's per-parameter gradient norms (the per-name norms at a stop)."""
        self._gnorms.append((step, gnorms, None))

    def sample_if_wanted(self, step: int, record: dict[str, Any], *, full: bool) -> float | None:
        """The sampled update norm, cosines and sign flips, when a detector can use them; returns
        the previous record's loss (the one :attr:`last_loss` said before this call).

        The divergence and ascent detectors read them only over a run of rising losses (four
        rises and more), so on the synchronous path (CPU) the sample is taken from the second
        rise in a row on, and on the full update and the one after it (a point every ``every``
        updates for the plots). A sample costs a dozen small ops, ~0.15 ms on a CPU right after
        the backward; a noisy loss rises every other update, twice in a row every fourth. The
        cosines need the previous update's sample: they appear from the third rise in a row on.
        """
        loss = record.get("loss")
        if self.first_loss is None and type(loss) is float and loss - loss == 0.0:
            self.first_loss = loss  # where the run started (finite)
        rises = self._rises
        prev = rises.last
        if not (rises.see(loss) >= 2 or full or self.after_full.due(step)):
            return prev
        measure = self.measure
        if measure is None:
            return prev
        if self._sampled_at != step - 1:
            measure.reset_history()
        self._sampled_at = step
        stats = measure._sample_stats([p.grad for p in measure.params])
        if stats is not None:
            layout = {"n": 0, "stats": True, "no_grads": True, "half": measure._half ^ 1}
            record.update(measure.record(stats.tolist(), layout))
        return prev

    def _full_at_failure(
        self, record: dict[str, Any], slots: dict[str, Any], batch: Any, *, late: bool
    ) -> None:
        """A non-finite update that was not a full one: take the skipped measures now.

        The batch's max |x| (from the kept references), the per-name gradient norms and, when
        the weights are still those of this update, the weight norms.
        """
        measure = self.measure
        if measure is not None and self._gnorms and self._gnorms[-1][0] == record["step"]:
            _, gnorms, have = self._gnorms[-1]
            names = measure.grad_norms(gnorms, have)
            if names:
                record["grad_norms"] = names
        if measure is not None and not late:
            vec, layout = measure.weight_vector()
            if vec is not None:
                record.update(measure.record(vec.tolist(), layout))
        for source, prefix, value in (("inputs", "input", batch[0]),
                                      ("targets", "target", batch[1])):  # fmt: skip
            if source in slots:
                continue
            stats = batch_stats(value)
            if stats is None:
                continue
            lo, hi = stats.float().tolist()
            absmax = max(abs(lo), abs(hi))
            if math.isfinite(absmax):
                record[f"nf_{source}"] = 0
                record[f"{prefix}_absmax"] = absmax
            else:
                record[f"nf_{source}"] = count_nonfinite(value)

    def backfill_grad_norms(self, records: list[dict[str, Any]]) -> None:
        """At a stop: per-name gradient norms into the recent records that went without them."""
        measure = self.measure
        if measure is None or not self._gnorms:
            return
        kept = {step: (gnorms, have) for step, gnorms, have in self._gnorms}
        for record in records[-len(kept) - 1 :]:
            step = record.get("step")
            if "grad_norms" in record or step not in kept:
                continue
            gnorms, have = kept[step]
            names = measure.grad_norms(gnorms, have)
            if names:
                record["grad_norms"] = names


def read_lr(optimizer: Any) -> float | None:
    """The learning rate of the optimizer's first group, as a record's ``lr``."""
    try:
        lr = optimizer.param_groups[0].get("lr")
    except (AttributeError, IndexError):
        return None
    if type(lr) is float:  # the common case first: it is read on every update
        return lr
    if isinstance(lr, torch.Tensor):
        return float(lr.detach().cpu())
    return float(lr) if isinstance(lr, (int, float)) else None


def step_extra(
    record: dict[str, Any], extra: dict[str, Any], *, pre_clip: float | None, micro: int
) -> None:
    """What every record of a step says of its window: with ``clip_grad_norm_``, ``grad_norm``
    is the pre-clip norm it returned and the norm the optimizer saw goes to ``extra``; the
    number of micro-batches (backward calls) when more than one."""
    if pre_clip is not None:
        extra["grad_norm_clipped"] = record.get("grad_norm")
        record["grad_norm"] = pre_clip
        extra["grad_norm_source"] = "pre_clip"
    if micro > 1:
        extra["micro_batches"] = micro


def _group_signature(optimizer: Any) -> list[tuple[int, int]]:
    return [(id(g["params"]), len(g["params"])) for g in optimizer.param_groups]


def _device_of(value: Any) -> torch.device:
    return value.device if isinstance(value, torch.Tensor) else torch.device("cpu")


def count_nonfinite(value: Any) -> int:
    """How many elements of ``value`` are inf/NaN (at least 1: it is called on a broken one)."""
    if not isinstance(value, torch.Tensor):
        return 1
    count = int((~torch.isfinite(value.detach())).sum().item())
    return count if count else 1
