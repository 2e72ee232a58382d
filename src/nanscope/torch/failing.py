"""What a watcher does when a detector fired on one of its records: the Monitor's probe, hold and
rollback callbacks (:class:`AlarmHandlers`), and what they hand the probes: the model to replay,
the replay's inputs beside the failure, the torch part of the evidence.

The :class:`~nanscope.torch.watcher.Watcher` shows each record to the Monitor through
:meth:`AlarmHandlers.observe`, which remembers which update is being observed (the failing one, if
a detector fires); the failure itself is built from the watcher's window.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from nanscope.detectors import Alarm
from nanscope.monitor import Monitor
from nanscope.outcome import UNSCALED_RATIO
from nanscope.probes.failure import TorchFailure
from nanscope.torch import _hooks, sharded
from nanscope.torch.history import History

if TYPE_CHECKING:
    from nanscope.torch.watcher import Watcher

__all__ = ["AlarmHandlers", "eager_model", "give_replay_inputs", "torch_evidence"]


class AlarmHandlers:
    """The Monitor's callbacks for one watcher: :meth:`probe` (the evidence, the failure),
    :meth:`hold` (a data step is not stopped) and :meth:`rollback`; each acts only on a record
    this watcher is observing (:meth:`observe`)."""

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher
        #: the :class:`~nanscope.probes.failure.TorchFailure` of the stop, once one happened
        self.failure: TorchFailure | None = None
        self._failing: dict[str, Any] = {}  # the update being observed: step, late, what
        self._observing = False
        self._replayed = False

    def connect(self, monitor: Monitor) -> None:
        monitor.probes.append(self.probe)
        monitor.holds.append(self.hold)
        if monitor.rollback_handler is None:
            monitor.rollback_handler = self.rollback

    def observe(
        self,
        record: dict[str, Any],
        *,
        what: str,
        batch: Any = None,
        step: int | None = None,
        late: bool = False,
    ) -> None:
        """Show ``record`` to the Monitor as update ``step`` (default: the record's), ``what``
        broke if it broke; ``late``: read after later updates ran (its weights are gone)."""
        self._failing = {"step": record["step"] if step is None else step, "late": late,
                         "what": what, "nf_params": bool(record.get("nf_params"))}  # fmt: skip
        self._observing = True
        try:
            self.watcher.monitor.observe(record, batch=batch)
        finally:
            self._observing = False
            self._failing = {}

    def probe(self, monitor: Monitor, alarm: Alarm) -> dict[str, Any]:
        if not self._observing:
            return {}
        watcher = self.watcher
        evidence: dict[str, Any] = {}
        watcher.guard.run("grad norms", watcher.records.backfill_grad_norms,
                          monitor.trace.records)  # fmt: skip
        watcher.note(watcher.last_good.save(watcher.model, watcher.params(), self._failing,
                                            alarm, watcher.deferred))  # fmt: skip
        failure = self.failure = self._make_failure(alarm)
        evidence["torch"] = torch_evidence(
            failure, notes=watcher.notes, scale_history=list(watcher.precision.scale_history),
            faults={**_hooks.GUARD.faults, **watcher.guard.faults},
        )  # fmt: skip
        give_replay_inputs(failure, monitor.trace.records, alarm, watcher.history)
        if alarm.data.get("shape") not in ("departure", "explosion"):
            # (a finite plateau or jump: no op produced a non-finite value to locate)
            try:
                from nanscope.probes.locate import locate
            except ImportError:
                return evidence
            found = locate(failure)
            if found:
                evidence.update(found)
        if not self._replayed:
            self._replayed = True  # one decisive experiment per watcher
            from nanscope.probes.replay import experiments

            entries = experiments(failure, evidence)
            if entries:
                evidence["confirmation"] = [*(evidence.get("confirmation") or []), *entries]
        return evidence

    def hold(self, monitor: Monitor, alarm: Alarm) -> str | None:
        """A departure whose frozen pre-jump weights give the same high loss on the batches after
        the jump is the data's step, not a divergence (probes/replay.py): not stopped."""
        if not self._observing or alarm.data.get("shape") != "departure":
            return None
        from nanscope.probes.replay import data_step

        failure = self._make_failure(alarm)
        give_replay_inputs(failure, monitor.trace.records, alarm, self.watcher.history)
        return data_step(failure, dict(alarm.data))

    def rollback(self, monitor: Monitor, alarm: Alarm) -> bool:
        """Policy ``rollback`` (:meth:`nanscope.torch.rollback.LastGood.rollback`)."""
        if not self._observing:
            return False
        watcher = self.watcher
        done = watcher.last_good.rollback(watcher.optimizer, watcher.params(), self._failing, alarm)
        if done:
            watcher.records.reset_history()
        return done

    def _make_failure(self, alarm: Alarm) -> TorchFailure:
        watcher = self.watcher
        step = int(self._failing.get("step") or alarm.step)
        extra: dict[str, Any] = {"alarm": alarm.kind}
        if self._failing.get("late"):
            extra["replay_from"] = watcher.deferred.replay_from()
        # a replay of a sharded model would run its collectives on this rank alone
        model = None if sharded.is_sharded(watcher.model) else eager_model(watcher.model)
        precision = watcher.precision
        return watcher.window.failure(
            model, step, str(self._failing.get("what", "loss")),
            kept=watcher.deferred.batch_at(step), current=step == watcher.step,
            scaler=precision.scaler, scale_history=list(precision.scale_history), extra=extra,
        )  # fmt: skip


def eager_model(model: Any) -> Any:
    """The module a ``torch.compile`` wrapper runs (the replay watches its ops one by one, which
    a compiled graph hides), else ``model`` itself."""
    frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(frame, "OptimizedModule", None)
    if wrapper is not None and isinstance(model, wrapper):
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            return inner
    return model


def give_replay_inputs(
    failure: TorchFailure, records: list[dict[str, Any]], alarm: Alarm, history: History
) -> None:
    """What the replay needs besides the failure: the history, the recorded losses and
    gradient norms, where the trouble began, the unscaled column (from the trace's
    ``records``)."""
    from nanscope.probes.replay import onset_of

    records = records[-4096:]
    losses = [(int(r["step"]), float(r["loss"])) for r in records
              if isinstance(r.get("loss"), (int, float))]  # fmt: skip
    failure.extra["history"] = history
    failure.extra["losses"] = losses
    failure.extra["grad_norms"] = [(int(r["step"]), float(r["grad_norm"])) for r in records
                                   if isinstance(r.get("grad_norm"), (int, float))]
    failure.extra["onset"] = onset_of(losses, dict(alarm.data), int(failure.step or 1))
    rows = [{"step": r.get("step"), **row} for r in records[-64:] for row in
            r.get("rows") or [] if isinstance(row, dict)]  # fmt: skip
    failure.extra["rows"] = rows
    for record in records[:8]:
        ratio = record.get("input_scale_ratio")
        if isinstance(ratio, (int, float)) and ratio >= UNSCALED_RATIO:
            failure.extra["unscaled_column"] = record.get("input_scale_column")
            break


def torch_evidence(
    failure: TorchFailure,
    *,
    notes: list[str],
    scale_history: list[float],
    faults: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``torch`` evidence of a stop: the failing update and what broke, the notes of what
    was skipped, the last loss scales and the hooks' faults (where any)."""
    evidence: dict[str, Any] = {"step": failure.step, "what": failure.what}
    if notes:
        evidence["notes"] = list(notes)
    if scale_history:
        evidence["scale_history"] = list(scale_history)[-16:]
    if faults:
        evidence["hook_faults"] = dict(faults)
    return evidence
