"""The lean check of a CPU update, and the batched judging of the records it makes.

On CPU the check of an ordinary update is lean: one fused gradient norm and the loss read at its
backward decide at once whether the update is finite (a non-finite one goes to the full check,
which measures everything and stops it before its step). A finite update's record is kept and
shown to the detectors later, with the next ones, in batches of :data:`BATCH_RECORDS` or every
:data:`BATCH_SECONDS`: the Python of a record costs several times less in a warm loop than right
after ``optimizer.step()``. A finite divergence is found at most one batch late, and a record a
detector could fire on now (a climb, a jump) is judged at once.

:class:`LeanCheck` holds the records waiting; the :class:`~nanscope.torch.watcher.Watcher` asks it
:meth:`~LeanCheck.applies` and :meth:`~LeanCheck.check` on each update, and the Monitor drains it
(:meth:`~LeanCheck.drain`) before the trace is read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from nanscope.detectors import Divergence
from nanscope.errors import DivergenceError
from nanscope.monitor import DetectorChain, Monitor
from nanscope.monitor import observers as _observers
from nanscope.outcome import FAR
from nanscope.torch.deferred import DeferredReads
from nanscope.torch.measure import ParamMeasure
from nanscope.torch.precision import Precision
from nanscope.torch.records import RecordBuilder, step_extra
from nanscope.torch.window import StepWindow

__all__ = ["BATCH_RECORDS", "BATCH_SECONDS", "CLIMB_RISES", "LeanCheck"]

#: finite records shown to the detectors together, at most this many ...
BATCH_RECORDS = 16
#: ... or once the oldest waited this long (a slow fit is judged update by update)
BATCH_SECONDS = 0.25
#: a climb is judged at once from this many rises in a row on: the divergence detector decides
#: from the fourth, the ascent detector from the fifth; one before, as a margin (the watcher
#: counts the rises of its own records, the detectors those they are shown). A noisy loss rises
#: three times in a row about half as often as twice, and each judgment out of turn is a cold one.
CLIMB_RISES = Divergence.RISES - 1

#: ``observe(step, record, batch)``: show one record to the Monitor as update ``step``'s
Observe = Callable[[int, dict[str, Any], Any], None]


class LeanCheck:
    """The lean check of one watcher's updates and the records it holds (module docstring)."""

    def __init__(
        self,
        monitor: Monitor,
        window: StepWindow,
        records: RecordBuilder,
        deferred: DeferredReads,
        precision: Precision,
        observe: Observe,
    ) -> None:
        self.monitor = monitor
        self.window = window
        self.records = records
        self.deferred = deferred
        self.precision = precision
        self._observe = observe
        #: finite updates checked, their records not yet shown to the detectors: [step, record,
        #: batch references] (references for the last three only, what the Monitor keeps)
        self._batched: list[list[Any]] = []
        self._batched_since = 0.0
        self._draining = False
        self._held: DivergenceError | None = None
        self._last_grad: float | None = None  # the last lean check's gradient norm

    @property
    def waiting(self) -> list[int]:
        """The updates whose records wait to be judged, oldest first."""
        return [item[0] for item in self._batched]

    def raise_held(self) -> None:
        """Raise the stop found while the trace was read between two steps, if one was."""
        if self._held is not None:
            error, self._held = self._held, None
            raise error

    def applies(self, step: int) -> bool:
        """The lean check serves this update: CPU, read at once, not a full update, no loss
        scale; and nothing needs each record the moment it is made (the rollback policy, a
        sweep's observers, the cross-rank agreement, which runs its collectives per record)."""
        window = self.window
        floats = window.loss_floats
        return (
            self.deferred.sync_every in (None, 1)
            and not self.records.full.due(step)
            and bool(floats) and len(floats) == len(window.losses)
            and window.scaled_by is None and self.precision.scaler is None
            and self.monitor.policy != "rollback"
            and not _observers
            and type(self.monitor.detectors) is DetectorChain
        )  # fmt: skip

    def check(self, step: int, measure: ParamMeasure, lr: float | None) -> bool:
        """Check a CPU update with one norm pass; False hands it to the full check (a
        non-finite value, a missing gradient), which then measures everything at once.

        It runs on every update, right after the backward (a cold cache): the record is made
        here with as few calls as it takes, and judged later with the next ones
        (:meth:`drain`), unless a detector could fire on it now."""
        window = self.window
        floats = window.loss_floats
        loss = floats[0] if len(floats) == 1 else math.fsum(floats)
        if not math.isfinite(loss):
            return False
        clip = None
        # (a clip called before backward() read stale gradients: its total is not this step's)
        if window.clip_norm is not None and window.clip_fresh:
            clip = float(window.clip_norm)
            if not math.isfinite(clip):
                return False
        clipped = self.clipped_norm(clip, measure) if clip is not None else None
        if clipped is not None:
            g_sq, gnorms = clipped * clipped, None  # the script's own norm said it: finite
        else:
            measured = measure.lean_norms()
            if measured is None:
                return False
            g_sq, gnorms = measured
            if not math.isfinite(g_sq):
                return False
        record: dict[str, Any] = {"step": step, "loss": loss, "nf_loss": 0}
        if lr is not None:
            record["lr"] = lr
        grad_norm = math.sqrt(g_sq)
        record["grad_norm"] = grad_norm
        record["nf_grads"] = 0
        records = self.records
        if gnorms is not None:
            records.keep_norms(step, gnorms)
        prev_grad = self._last_grad
        self._last_grad = grad_norm
        prev_loss = records.sample_if_wanted(step, record, full=False)
        # judged now, not with the batch: a climb (:data:`CLIMB_RISES`) and a jump of the loss
        # or the gradient (a spike's batch rows)
        first = records.first_loss
        urgent = records.rises >= CLIMB_RISES or (
            prev_loss is not None and loss - prev_loss > 3.0 * abs(prev_loss)
        ) or (prev_grad is not None and grad_norm > 10.0 * prev_grad) or (
            first is not None and first > 0 and loss > FAR * first)  # fmt: skip
        if clip is not None or len(floats) > 1:
            extra: dict[str, Any] = {}
            step_extra(record, extra, pre_clip=clip, micro=len(floats))
            record["extra"] = extra
        records.take_extra(record)
        batched = self._batched
        if len(batched) >= 3:
            batched[-3][2] = None  # the Monitor keeps the last three batches: so do we
        batched.append([step, record, window.refs()])
        window.reset()
        window.forget_update()  # a finite update is never replayed
        now = time.monotonic()
        if len(batched) == 1:
            self._batched_since = now
        if urgent or len(batched) >= BATCH_RECORDS or now - self._batched_since >= BATCH_SECONDS:
            self.drain()
        return True

    def clipped_norm(self, pre: float | None, measure: ParamMeasure) -> float | None:
        """The gradient norm the optimizer sees after ``clip_grad_norm_``, from that call alone:
        its pre-clip total (finite) is the 2-norm over every one of this optimizer's parameters,
        and clipping scales it by ``min(1, max_norm / (total + 1e-6))``, torch's own factor.
        None when the call does not cover them all, used another norm or cannot be read."""
        call = self.window.clip_call
        if pre is None or call is None:
            return None
        params, max_norm, norm_type = call
        try:
            if float(norm_type) != 2.0:
                return None
            limit = float(max_norm)
        except (TypeError, ValueError, RuntimeError):
            return None
        if not math.isfinite(limit) or limit < 0:
            return None
        clipped_ids = {id(p) for p in params}
        if not all(id(p) in clipped_ids for p in measure.params):
            return None
        return pre * min(1.0, limit / (pre + 1e-6))

    def drain(self, *, stop: bool = True) -> None:
        """Show the detectors the finite records held, in order; the Monitor calls it (through
        the watcher) before the trace is read. An alarm stops the fit as at its own update; the
        updates after it ran too and are written to the trace. ``stop=False`` (a read of the
        trace): the stop is raised at the next update's check instead of here."""
        if self._draining or not self._batched:
            return
        if not stop:
            try:
                self.drain()
            except DivergenceError as exc:
                self._held = exc
            return
        self._draining = True
        items, self._batched = self._batched, []
        try:
            for k, (step, record, refs) in enumerate(items):
                # (None, None, None): this update's batch is not known any more, not an older one
                batch = StepWindow.batch_of(refs) if refs is not None else (None, None, None)
                try:
                    self._observe(step, record, batch)
                except DivergenceError:
                    # the updates after the alarm ran too (it was judged with its batch)
                    for _, later, _ in items[k + 1 :]:
                        self.monitor.write(later)
                        self.monitor.trace.append(later)
                    self.records.backfill_grad_norms(self.monitor.trace.records)
                    raise
        finally:
            self._draining = False
