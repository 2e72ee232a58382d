"""The Monitor: per-update records, cheap detectors, and the policy when they fire.

::

    mon = nanscope.Monitor()
    for step in range(n):
        loss, g = loss_and_grad(w, X[b], y[b])
        mon.update(loss, params={"w": w}, grads={"w": g}, lr=lr, inputs=X[b], targets=y[b])
        w = w - lr * g

Call ``update`` after the loss and gradient are computed and *before* the step is applied: then a
non-finite gradient stops the fit before it reaches the weights, and ``mon.last_good`` holds the
weights of the last update where everything was finite.

An update no detector can fire on (each default detector's ``quiet``) is judged a little later,
with up to ``DEFER_RECORDS`` others, in a warm loop; one that could fire is judged at once, after
them, so every alarm still stops the fit at its own update. Reads of the trace, :meth:`flush`,
:meth:`diagnose` and :meth:`close` judge the waiting ones first.

Extension points (what adapters use; none of them needs the Monitor's private state):

* ``Monitor(detectors=..., writer=...)``: the detectors it runs (a factory, a list, or one
  :class:`~nanscope.detectors.Detector`; default :func:`~nanscope.detectors.default_detectors`) and
  the trace writer (default: a :class:`~nanscope.trace.TraceWriter` opened on the first record);
* :meth:`Monitor.wrap_detectors` wraps the detectors in a combinator (the cross-rank agreement:
  ``mon.wrap_detectors(lambda inner: nanscope.torch.distributed.agree(inner))``);
* :meth:`Monitor.observe` takes a record measured elsewhere; :meth:`Monitor.write` writes one line;
  :meth:`Monitor.reset_detectors` forgets the detectors' history (after a rollback);
  :meth:`Monitor.move_run_dir` moves the run's files before anything was written;
* ``probes``, ``rollback_handler`` and ``on_stop``: called when a detector fired;
* ``pending``: callables ``drain(stop=True)`` that hand over records measured but not observed
  yet (the torch watcher checks every update for non-finite values at once but runs the
  detectors on its finite records in batches); :meth:`flush`, :meth:`diagnose`, :meth:`close`
  and every read of ``trace.records`` call them first (a read with ``stop=False``: a stop found
  then is raised at the source's next update, not from the read);
* :data:`observers` (process-wide): called with ``(monitor, record)`` after every update any
  Monitor takes, even one that stops the fit (the sweep's child process counts updates this way).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import secrets
import sys
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nanscope import trace as trace_module
from nanscope._guard import FaultGuard
from nanscope._messages import status
from nanscope.capture.arrays import (
    BatchChecker,
    ParamTracker,
    as_array,
    as_named,
    nonfinite_rows,
    robust_rows,
)
from nanscope.capture.init_scale import array_stats, weight_scale
from nanscope.detectors import Alarm, AlarmKind, Detector, default_detectors
from nanscope.errors import DivergenceError, UsageError
from nanscope.numerics import finite_float
from nanscope.trace import FLUSH_LINES, Trace, TraceWriter

if TYPE_CHECKING:
    from nanscope.diagnose.diagnosis import Diagnosis

__all__ = ["DEFER_RECORDS", "DEFER_SECONDS", "POLICIES", "DetectorChain", "Monitor",
           "active_monitors", "observers", "runs_root", "set_defaults"]  # fmt: skip

POLICIES = ("raise", "warn", "rollback")
#: causes the rollback policy recovers from by skipping the batch alone (the lr is kept)
DATA_CAUSES = ("nonfinite_input", "extreme_batch")

#: records of updates no detector can fire on are judged together, at most this many ...
DEFER_RECORDS = 8
#: ... or once the oldest waited this long (a slow fit is judged update by update)
DEFER_SECONDS = 0.25

_DEFAULTS: dict[str, Any] = {}
#: the Monitors not closed yet: flushed on SIGTERM, closed at exit
_OPEN_MONITORS: weakref.WeakSet[Monitor] = weakref.WeakSet()
_CREATED: list[weakref.ref[Monitor]] = []
#: strong references while ``nanscope run`` collects every Monitor the script makes
_KEPT: list[Monitor] = []

#: what a probe receives and returns: evidence merged into the diagnosis
Probe = Callable[["Monitor", Alarm], Mapping[str, Any]]

#: called with ``(monitor, record)`` after every update of every Monitor in this process, after
#: the detectors ran and also when the update stopped the fit (in a ``finally``); what one raises
#: goes to the caller of ``update``/``observe``
observers: list[Callable[[Monitor, Mapping[str, Any]], None]] = []


def set_defaults(**values: Any) -> None:
    """Defaults for Monitors created later (``nanscope run`` sets --policy and the run root)."""
    for key, value in values.items():
        if value is None:
            _DEFAULTS.pop(key, None)
        else:
            _DEFAULTS[key] = value


def active_monitors() -> list[Monitor]:
    """Every Monitor created in this process that is still alive, oldest first."""
    return [m for m in (ref() for ref in _CREATED) if m is not None]


class DetectorChain:
    """Several detectors run as one: every one sees every record, the first alarm wins.

    ``factory`` makes the detectors; :meth:`reset` makes them anew (the Monitor calls it after a
    rollback). Built from a list instead (``DetectorChain.of([...])``), reset calls the ``reset()``
    of each detector that has one and keeps the others as they are.
    """

    def __init__(
        self,
        factory: Callable[[], Sequence[Detector]] = default_detectors,
        detectors: Sequence[Detector] | None = None,
    ) -> None:
        self.factory = factory
        self.detectors: list[Detector] = list(factory() if detectors is None else detectors)
        self._quiet = _quiet_of(self.detectors)

    @classmethod
    def of(cls, detectors: Sequence[Detector]) -> DetectorChain:
        kept = list(detectors)
        for detector in kept:
            if not callable(getattr(detector, "step", None)):
                raise UsageError(
                    f"a detector needs a step(record) method; got {type(detector).__name__}"
                )
        return cls(lambda: _reset_each(kept), kept)

    def step(self, record: dict[str, Any]) -> Alarm | None:
        alarm: Alarm | None = None
        for detector in self.detectors:
            fired = detector.step(record)
            if fired is not None and alarm is None:
                alarm = fired
        return alarm

    def quiet(self, record: dict[str, Any], rises: int, behind: int) -> bool:
        """No detector of the chain can fire on ``record`` (False when one cannot tell)."""
        checks = self._quiet
        if checks is None:
            return False
        for quiet in checks:  # noqa: SIM110 (a loop: cheaper than all() over a generator here)
            if not quiet(record, rises, behind):
                return False
        return True

    def reset(self) -> None:
        self.detectors = list(self.factory())
        self._quiet = _quiet_of(self.detectors)


def _quiet_of(detectors: list[Detector]) -> list[Callable[..., bool]] | None:
    """Each detector's ``quiet``, or None when one has none (it sees every record at once)."""
    checks = [getattr(detector, "quiet", None) for detector in detectors]
    if any(not callable(check) for check in checks):
        return None
    return cast("list[Callable[..., bool]]", checks)


def _reset_each(detectors: list[Detector]) -> list[Detector]:
    for detector in detectors:
        reset = getattr(detector, "reset", None)
        if callable(reset):
            reset()
    return detectors


def _as_detector(detectors: Any) -> Detector:
    if detectors is None:
        return DetectorChain()
    if isinstance(detectors, Sequence) and not isinstance(detectors, (str, bytes)):
        return DetectorChain.of(detectors)
    if callable(getattr(detectors, "step", None)):
        return detectors  # type: ignore[no-any-return]
    if callable(detectors):
        return DetectorChain(detectors)
    raise UsageError(
        "detectors must be a list of detectors, a function making them, or one object with a "
        f"step(record) method; got {type(detectors).__name__}"
    )


def runs_root() -> Path:
    """The folder run folders go in: ``set_defaults(root=...)``, else ``$NANSCOPE_DIR``, else
    ``./.nanscope/runs``."""
    root = _DEFAULTS.get("root") or os.environ.get("NANSCOPE_DIR")
    return Path(root) if root else Path.cwd() / ".nanscope" / "runs"


#: what nanscope writes into a ``.nanscope/`` folder it creates: git leaves its runs alone
GITIGNORE = "# written by nanscope: run folders (traces, weights) are not source\n*\n"


def _ignore_folder(folder: Path) -> None:
    """``folder/.gitignore`` (ignore everything), unless the folder has one: written the first
    time nanscope writes a run under ``./.nanscope/``, as pytest does for its cache."""
    marker = folder / ".gitignore"
    if marker.exists():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(marker, "x", encoding="utf-8") as fh:
            fh.write(GITIGNORE)
    except OSError:
        pass  # (another process wrote it, or the folder is read-only: the run goes on)


class _RunFiles:
    """A Monitor's files: the run folder (made on the first write; the ``.nanscope/`` folder
    above it marked ignored by git), the trace file opened on the first record, and
    ``diagnosis.json``; and nanscope's own faults, one warning per part. (A base of
    :class:`Monitor`, whose ``__init__`` sets the attributes below.)"""

    run_dir: Path
    meta: dict[str, Any]
    guard: FaultGuard
    _write: bool
    _writer: Any
    _ignore_in: Path | None

    @property
    def writes(self) -> bool:
        """Whether this Monitor writes files (``write=True``, the default)."""
        return self._write

    @property
    def writing(self) -> bool:
        """Whether the trace file is open (something was written, or a writer was given)."""
        return self._writer is not None

    def write(self, record: Mapping[str, Any]) -> None:
        """Write one line to the trace (opening ``run_dir/trace.jsonl`` first if needed).

        :meth:`observe` writes each record it takes; call this only for a line that is not an
        update (the record is not added to ``trace`` nor seen by the detectors).
        """
        writer = self._open_writer()
        if writer is not None:
            writer.write(record)

    def _open_writer(self) -> Any:
        """The trace writer, opened on first use; None when this Monitor writes no files."""
        if not self._write:
            return None
        if self._writer is None:
            self._make_run_dir()
            self._writer = TraceWriter(self.run_dir / "trace.jsonl", self.meta)
        return self._writer

    def _make_run_dir(self) -> None:
        if self._ignore_in is not None:
            _ignore_folder(self._ignore_in)
            self._ignore_in = None
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def move_run_dir(self, run_dir: str | os.PathLike[str]) -> bool:
        """Put this run's files under ``run_dir`` instead; only before any was written.

        Returns False (and moves nothing) once the trace file is open.
        """
        if self._writer is not None:
            return False
        self.run_dir = Path(run_dir)
        self._ignore_in = None  # not under ./.nanscope/ any more
        return True

    def save_diagnosis(self, diagnosis: Diagnosis) -> None:
        """Write ``diagnosis`` as ``run_dir/diagnosis.json`` (``nanscope run``: once enriched)."""
        if not self._write:
            return
        try:
            self._make_run_dir()
            (self.run_dir / "diagnosis.json").write_text(diagnosis.to_json() + "\n")
        except Exception as exc:
            self._internal_fault("write diagnosis.json", exc)

    def _internal_fault(self, where: str, exc: BaseException) -> None:
        # only the measures turn off: the detectors, writes and probes run again next update
        self.guard.fault(where, exc, disable=where == "measure", stacklevel=4)


class _Measures(_RunFiles):
    """What a Monitor measures of the arrays of an update: the weights' and gradients' measures
    and the batch checks, the bad rows of the last batches, the last good weights. (A base of
    :class:`Monitor`, whose ``__init__`` sets the attributes below.)"""

    trace: Trace
    _params: ParamTracker
    _inputs: BatchChecker
    _targets: BatchChecker
    _recent: deque[tuple[int, Any, Any, Any]]
    _last_good: dict[str, np.ndarray]
    _count: int
    evidence: dict[str, Any]

    def _initial_scale(self, params: Mapping[str, np.ndarray], inputs: Any) -> None:
        """The weights of the first update, before its step: their scale against a standard
        initialiser's (the rules' evidence about the initialisation)."""
        def read() -> None:
            widths: set[int] = set()
            if inputs is not None:
                shape = as_array(inputs, "inputs").shape
                widths = {int(shape[-1])} if shape else set()
            scale = weight_scale(array_stats(params.items()), widths)
            if scale:
                self.evidence["initial_weight_scale"] = scale

        self.guard.run("initial weight scale", read)

    def _measure(
        self,
        loss: Any,
        params: Any,
        grads: Any,
        lr: float | None,
        inputs: Any,
        targets: Any,
        step: int | None,
        index: Any,
    ) -> dict[str, Any]:
        if isinstance(loss, float):  # a Python or numpy float: the common case, inline
            loss_value = float(loss)
            nf_loss = 0 if loss_value - loss_value == 0.0 else 1
        else:
            loss_value, nf_loss = _loss_value(loss)
        if lr is not None:
            if type(lr) is not float and (
                isinstance(lr, (str, bytes)) or not isinstance(lr, (int, float, np.number))
            ):
                raise UsageError(f"lr must be a number, got {type(lr).__name__}")
            if not lr >= 0:
                raise UsageError(f"lr must be a non-negative number, got {lr!r}")
        named_params = as_named(params, "params") if params is not None else {}
        named_grads = as_named(grads, "grads") if grads is not None else {}
        if self._count == 0 and named_params and "initial_weight_scale" not in self.evidence:
            self._initial_scale(named_params, inputs)
        record: dict[str, Any] = {"step": step, "loss": loss_value, "nf_loss": nf_loss}
        if lr is not None:
            record["lr"] = float(lr)
        if self.guard.is_off("measure"):
            return record
        try:
            if named_params or named_grads:
                record.update(self._params.measure(named_params, named_grads, loss_value))
            rows_index = None if index is None else np.asarray(index).reshape(-1)
            # a non-finite update has its batch checked in full: it is the evidence
            broken = bool(nf_loss or record.get("nf_grads") or record.get("nf_params"))
            if inputs is not None:
                checked = self._inputs.check(inputs, rows_index, force=broken)
                if checked:  # {} between the scheduled checks
                    _merge_batch(record, checked)
            if targets is not None:
                checked = self._targets.check(targets, rows_index, force=broken)
                if checked:
                    _merge_batch(record, checked)
        except UsageError:
            raise
        except Exception as exc:  # a bug in nanscope must never stop the user's fit
            self._internal_fault("measure", exc)
        return record

    @property
    def last_good(self) -> dict[str, np.ndarray]:
        """Weights of the last update whose loss, gradient and weights were all finite (copies)."""
        if self._last_good:
            return {k: v.copy() for k, v in self._last_good.items()}
        return self._params.snapshot_current()

    def _freeze_last_good(self, alarm: Alarm) -> None:
        last = self.trace.records[-1] if self.trace.records else {}
        if last.get("nf_params"):
            self._last_good = self._params.snapshot_previous()
        else:
            self._last_good = self._params.snapshot_current()
        if self._last_good and self._write:
            try:
                self._make_run_dir()
                np.savez(self.run_dir / "last_good.npz", **self._last_good)  # type: ignore[arg-type]
                self.meta["last_good"] = str(self.run_dir / "last_good.npz")
            except Exception as exc:
                self._internal_fault("save last good weights", exc)

    def _probe_rows(self, last: int | None = None) -> list[dict[str, Any]]:
        """Rows of the last batches that hold non-finite or extreme values, newest batch first."""
        found: list[dict[str, Any]] = []
        recent = list(self._recent)[-last:] if last else list(self._recent)
        # A loop that refills one buffer in place hands the same array every update: it holds
        # the newest batch only, so an older update's rows (or row numbers) are not read from it.
        newer: set[int] = set()
        for step, inputs, targets, index in reversed(recent):
            rows_index = None
            if index is not None and id(index) not in newer:
                rows_index = np.asarray(index).reshape(-1)
            for source, batch in (("inputs", inputs), ("targets", targets)):
                if batch is None or id(batch) in newer:
                    continue
                try:
                    array = as_array(batch, source)
                    count, bad = nonfinite_rows(array, source, rows_index)
                    if not count and array.dtype.kind == "f":
                        _, bad = robust_rows(array, source, rows_index)
                except Exception:
                    continue
                for row in bad:
                    row["step"] = step
                found.extend(bad)
            newer.update(id(a) for a in (inputs, targets, index) if a is not None)
        return found


class _Policy(_Measures):
    """What a Monitor does when a detector fires: roll the update back (policy ``rollback``,
    through the adapter, as the diagnosis of the failure says), hold it (an adapter's experiment
    shows it is no failure), or stop the fit: the last good weights kept, the diagnosis saved,
    the error raised (or a warning). (A base of :class:`Monitor`, whose ``__init__`` sets the
    attributes below.)"""

    policy: str
    alarm: Alarm | None
    rollback_handler: Callable[[Any, Alarm], bool] | None
    rollbacks: list[dict[str, Any]]
    holds: list[Callable[[Any, Alarm], str | None]]
    on_stop: list[Callable[[Any, Alarm], None]]
    _warned: set[str]

    if TYPE_CHECKING:  # the Monitor's own

        def diagnose(self) -> Diagnosis: ...

        def record_event(self, name: str, **fields: Any) -> None: ...

        def reset_detectors(self) -> None: ...

    def _try_rollback(self, alarm: Alarm, rec: dict[str, Any]) -> bool:
        """Policy rollback: recover as the diagnosis of this failure says, through the adapter.

        A data row (``nonfinite_input``, ``extreme_batch``): the batch is skipped, the learning
        rate kept (a smaller step cannot help a bad row), and the rows are named. Any other cause
        (a step size): the batch is skipped and the adapter cuts the learning rate. What it did
        is one status line, an entry of :attr:`rollbacks`, and the record's ``extra.rollback``;
        the rows go into the record, so the final diagnosis names them too.
        """
        if self.policy != "rollback" or self.rollback_handler is None:
            return False
        cause, rows = self._recovery_cause(alarm, rec)
        data = cause in DATA_CAUSES
        alarm.data["lr_factor"] = 1.0 if data else None  # None: the adapter's own cut
        try:
            handled = bool(self.rollback_handler(self, alarm))
        except Exception as exc:
            self._internal_fault("rollback", exc)
            handled = False
        if not handled:
            return False
        action = _recovery_action(alarm, rows, data)
        entry: dict[str, Any] = {"step": alarm.step, "kind": alarm.kind, "cause": cause,
                                 "why": alarm.text, "action": action}  # fmt: skip
        if rows:
            entry["rows"] = rows[:5]
        for key in ("lr_before", "lr_after"):
            if alarm.data.get(key) is not None:
                entry[key] = alarm.data[key]
        self.rollbacks.append(entry)
        rec.setdefault("events", []).append("rollback")
        rec.setdefault("extra", {})["rollback"] = entry
        status(f"nanscope: recovered update {alarm.step} ({cause}): {entry['action']}")
        self.reset_detectors()
        return True

    def _recovery_cause(
        self, alarm: Alarm, rec: dict[str, Any]
    ) -> tuple[str, list[dict[str, Any]]]:
        """The cause of this failure, diagnosed from the records since the last recovery (the
        detectors' own window), with the bad rows of its batch; ``unknown`` when the rules
        cannot run."""
        seen = {(r.get("source"), r.get("batch_row"), r.get("why")) for r in rec.get("rows") or []}
        rows = [r for r in self._probe_rows(last=1)
                if (r.get("source"), r.get("batch_row"), r.get("why")) not in seen]  # fmt: skip
        if rows:
            rec["rows"] = list(rec.get("rows") or []) + rows
        rows = list(rec.get("rows") or [])
        since = self.rollbacks[-1]["step"] if self.rollbacks else None
        # the records judged so far (read without handing over pending ones: we are judging one)
        window = [r for r in self.trace._records if since is None or (r.get("step") or 0) > since]
        try:
            from nanscope.diagnose import diagnose

            found = diagnose(Trace([*window, rec], meta=self.meta), evidence={"rows": rows})
            return found.cause, rows
        except Exception as exc:
            self._internal_fault("rollback diagnosis", exc)
            return "unknown", rows

    def _fire(self, alarm: Alarm) -> None:
        first = self.alarm is None
        if alarm.kind == AlarmKind.SPIKE:
            return  # only ever a reason to roll back, never to stop
        if not first and self.policy == "warn":
            return
        if self._held(alarm):
            return
        self.alarm = alarm
        try:  # the trace up to the alarm is on disk whatever happens next
            flush = getattr(self._writer, "flush", None)
            if callable(flush):
                flush()
        except Exception as exc:
            self._internal_fault("flush", exc)
        self._freeze_last_good(alarm)
        diagnosis = self.diagnose()
        self.save_diagnosis(diagnosis)
        for callback in self.on_stop:
            try:
                callback(self, alarm)
            except Exception as exc:
                self._internal_fault("on_stop", exc)
        message = diagnosis.message()
        if self.policy == "warn":
            if alarm.kind not in self._warned:
                self._warned.add(alarm.kind)
                warnings.warn(message, RuntimeWarning, stacklevel=4)
            return
        raise DivergenceError(message, diagnosis)

    def _held(self, alarm: Alarm) -> bool:
        """An adapter's experiment showed the alarm is no failure (a loss that stepped up with
        its data): recorded as a ``held`` event, and the fit goes on."""
        for hold in self.holds:
            try:
                reason = hold(self, alarm)
            except Exception as exc:
                self._internal_fault("hold", exc)
                continue
            if reason:
                self.record_event("held", step=alarm.step, kind=alarm.kind, text=str(reason))
                # the data stepped up: the detectors measure from the new stage on, so a real
                # divergence later in the run is still caught (a fired detector stays silent)
                self.reset_detectors()
                return True
        return False


class Monitor(_Policy):
    """Watches a fit update by update and stops it loudly when it breaks.

    policy: ``"raise"`` (default) raises :class:`nanscope.DivergenceError` at the first non-finite
        loss, gradient or weight, or when the divergence fingerprint is confirmed; ``"warn"`` warns
        once and lets the fit go on; ``"rollback"`` asks the framework adapter to restore the last
        good state (plain numpy fits have none, so it raises). No policy ever replaces a NaN.
    run_dir: where ``trace.jsonl`` and ``diagnosis.json`` go (default
        ``./.nanscope/runs/<time>-<id>/``; the ``NANSCOPE_DIR`` environment variable moves it).
    write: ``False`` keeps the trace in memory only.
    detectors: what runs on every update: a list of :class:`~nanscope.detectors.Detector`, a
        function returning one (called again by :meth:`reset_detectors`), or one detector object;
        default :func:`nanscope.detectors.default_detectors`.
    writer: where the records go: any object with ``write(record)`` and ``close()`` (default: a
        :class:`nanscope.trace.TraceWriter` on ``run_dir/trace.jsonl``, opened on the first
        record). With ``write=False`` nothing is written, whatever the writer.
    """

    def __init__(
        self,
        *,
        policy: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        write: bool = True,
        meta: Mapping[str, Any] | None = None,
        detectors: Sequence[Detector] | Callable[[], Sequence[Detector]] | Detector | None = None,
        writer: Any = None,
    ) -> None:
        policy = policy or _DEFAULTS.get("policy") or os.environ.get("NANSCOPE_POLICY") or "raise"
        if policy not in POLICIES:
            raise UsageError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
        self.policy = policy
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        self.name = name or "fit"
        #: the ``.nanscope/`` folder to mark as ignored by git when the first file is written
        self._ignore_in: Path | None = None
        if run_dir is None:
            root = runs_root()
            run_dir = root / self.run_id
            if root.name == "runs" and root.parent.name == ".nanscope":
                self._ignore_in = root.parent
        self.run_dir = Path(run_dir)
        self.meta: dict[str, Any] = {
            "run_id": self.run_id,
            "name": self.name,
            "started": time.time(),
            "source": "monitor",
            "granularity": "update",
            "policy": policy,
            "argv": list(sys.argv),
            **dict(meta or {}),
        }
        self.trace = Trace()
        # one dict: what an adapter adds to the Monitor's meta later (the optimizer) is what the
        # live diagnosis reads, as it is in the trace file's header
        self.trace.meta = self.meta
        self.trace.sync = self._sync_pending
        if writer is not None and not callable(getattr(writer, "write", None)):
            raise UsageError(f"writer needs a write(record) method; got {type(writer).__name__}")
        self._writer: Any = writer
        self._write = write
        self._params = ParamTracker()
        self._inputs = BatchChecker("inputs")
        self._targets = BatchChecker("targets")
        self._detector: Detector = _as_detector(detectors)
        self._recent: deque[tuple[int, Any, Any, Any]] = deque(maxlen=3)
        self._count = 0
        #: records admitted (counted, numbered) but not judged yet: (record, batch)
        self._deferred: list[tuple[dict[str, Any], Any]] = []
        self._deferred_since = 0.0
        self._judging = False
        self._late_stop: DivergenceError | None = None  # found by a read of the trace
        self._rise_prev: float | None = None  # the last finite loss
        self._rises = 0  # the finite loss rose this many updates in a row
        #: nanscope's own faults: one warning per part, the measures off after theirs
        self.guard = FaultGuard("check")
        self._warned: set[str] = set()
        self.alarm: Alarm | None = None
        self.diagnosis: Diagnosis | None = None
        self.evidence: dict[str, Any] = {}
        self.probes: list[Probe] = []
        #: asked before a stop: a reason the alarm is no failure (a departure that is the data's
        #: doing, by the torch adapter's replay), or None
        self.holds: list[Callable[[Monitor, Alarm], str | None]] = []
        from nanscope.probes import fperrors  # numpy's fp errors name the producer op and line

        self.probes.append(fperrors.watch(self))
        self.rollback_handler: Callable[[Monitor, Alarm], bool] | None = None
        #: what the rollback policy did: ``{"step", "kind", "why", "action"}`` per rollback
        self.rollbacks: list[dict[str, Any]] = []
        self.on_stop: list[Callable[[Monitor, Alarm], None]] = []
        #: called before the trace is read whole: they observe the records they still hold
        self.pending: list[Callable[..., None]] = []
        self._last_good: dict[str, np.ndarray] = {}
        self._closed = False
        #: run events (``{"event": "interrupted", "signal": ..., "step": ...}``), see record_event
        self.events: list[dict[str, Any]] = []
        _OPEN_MONITORS.add(self)
        _CREATED.append(weakref.ref(self))
        if _DEFAULTS.get("keep"):
            _KEPT.append(self)

    # ------------------------------------------------------------------ capture

    def update(
        self,
        loss: Any,
        *,
        params: Any = None,
        grads: Any = None,
        lr: float | None = None,
        inputs: Any = None,
        targets: Any = None,
        step: int | None = None,
        index: Any = None,
    ) -> dict[str, Any]:
        """Record one update and run the detectors; returns the record.

        ``loss`` is a float, a 0-d array or tensor (per-sample losses are averaged); ``params`` and
        ``grads`` are ``{name: array}`` (or one array, or a list); ``inputs``/``targets`` the batch;
        ``index`` the dataset row numbers of the batch rows, when known. Raises ``ValueError`` on
        arguments that cannot be right, :class:`nanscope.DivergenceError` when the fit broke.
        """
        record = self._measure(loss, params, grads, lr, inputs, targets, step, index)
        if type(self).observe is not Monitor.observe:
            return self.observe(record, batch=(inputs, targets, index))  # a subclass's own
        # the record is ours: observed without a copy
        if self._late_stop is not None:
            self._raise_late_stop()
        rises = self._admit(record)
        deferred = self._deferred
        quiet = getattr(self._detector, "quiet", None)
        if (
            quiet is not None
            and self._count > FLUSH_LINES  # the first are written at once: a short run is whole
            and self.policy != "rollback"  # a spike can be rolled back: judged at once
            and not observers  # they see each update as it is made
            and quiet(record, rises, len(deferred))
        ):
            # no detector can fire on it: judged later with the next ones, in a warm loop
            now = time.monotonic()
            if not deferred:
                self._deferred_since = now
            deferred.append((record, (inputs, targets, index)))
            if len(deferred) >= DEFER_RECORDS or now - self._deferred_since > DEFER_SECONDS:
                self._judge_deferred()
            return record
        if deferred:
            self._judge_deferred()
        return self._judge(record, (inputs, targets, index))

    def observe(self, record: Mapping[str, Any], *, batch: Any = None) -> dict[str, Any]:
        """Record an update whose measures were computed elsewhere (framework adapters).

        ``record`` uses the keys of :mod:`nanscope.trace`; ``batch`` is kept by reference (the last
        three) so the probes can look at the rows of a failing update.
        """
        return self._observe(dict(record), batch)

    def _observe(self, rec: dict[str, Any], batch: Any) -> dict[str, Any]:
        """:meth:`observe` of a record this Monitor owns already (no copy)."""
        if self._late_stop is not None:
            self._raise_late_stop()
        self._admit(rec)
        if self._deferred:
            self._judge_deferred()
        return self._judge(rec, batch)

    def _admit(self, rec: dict[str, Any]) -> int:
        """Count and number the update; the finite loss's rises in a row up to it."""
        self._count += 1
        if rec.get("step") is None:
            rec["step"] = self._count
        loss = finite_float(rec.get("loss"))
        if loss is None:
            self._rise_prev, self._rises = None, 0
            return 0
        prev, self._rise_prev = self._rise_prev, loss
        self._rises = self._rises + 1 if prev is not None and loss > prev else 0
        return self._rises

    def _judge_deferred(self) -> None:
        """Judge the deferred records, in order (their detectors cannot fire: see update)."""
        if self._judging:
            return
        self._judging = True
        items, self._deferred = self._deferred, []
        try:
            for k, (record, batch) in enumerate(items):
                try:
                    self._judge(record, batch)
                except DivergenceError:
                    # a detector whose quiet() was wrong: the updates after it ran too
                    for later, _ in items[k + 1 :]:
                        self.write(later)
                        self.trace.append(later, copy=False)
                    raise
        finally:
            self._judging = False

    def _raise_late_stop(self) -> None:
        error, self._late_stop = self._late_stop, None
        assert error is not None
        raise error

    def _judge(self, rec: dict[str, Any], batch: Any) -> dict[str, Any]:
        """Run the detectors on an admitted record, write it, add it to the trace, and stop
        the fit when one fired."""
        step = int(rec["step"])
        if batch is not None:
            if isinstance(batch, tuple):
                self._recent.append((step, *batch))
            else:
                self._recent.append((step, batch, None, None))
        alarm: Alarm | None = None
        try:
            alarm = self._detector.step(rec)
            events = rec.get("events")
            if events and alarm is None and ("loss_spike" in events or "grad_jump" in events):
                # a finite spike the run may survive: look at its batches now, while we have them
                spotted = self._probe_rows(last=2)
                if spotted:
                    rec["rows"] = list(rec.get("rows") or []) + spotted
                    extreme = any(r.get("why") == "extreme" for r in spotted)
                    if self.policy == "rollback" and extreme:
                        # a spike with an extreme row in its batch is confirmed: roll it back too
                        text = f"loss spike at update {step} with an extreme row in its batch"
                        alarm = Alarm(AlarmKind.SPIKE, step, text, {"rows": len(spotted)})
            if alarm is not None and self._try_rollback(alarm, rec):
                alarm = None
            writer = self._writer if self._writer is not None else self._open_writer()
            if writer is not None:
                writer.write(rec)
        except Exception as exc:
            self._internal_fault("observe", exc)
        self.trace.append(rec, copy=False)  # rec is already this Monitor's own copy
        try:
            if alarm is not None:
                self._fire(alarm)
        finally:
            if observers:
                for observer in list(observers):
                    observer(self, rec)
        return rec

    # ------------------------------------------------------------------ extension points

    def flush(self) -> None:
        """Observe the records still pending, then write the trace lines the writer buffers (it
        writes on its own every half second)."""
        self.drain_pending()
        flush = getattr(self._writer, "flush", None)
        if callable(flush):
            flush()

    def drain_pending(self, *, stop: bool = True) -> None:
        """Judge the deferred records, and have every :attr:`pending` source observe the records
        it still holds (in order)."""
        if self._deferred:
            try:
                self._judge_deferred()
            except DivergenceError as exc:
                if stop:
                    raise
                self._late_stop = exc  # raised from the next update, not from a read
        if not self.pending:
            return
        for drain in list(self.pending):
            try:
                drain(stop=stop)
            except DivergenceError:
                raise
            except Exception as exc:
                self._internal_fault("pending records", exc)

    def _sync_pending(self) -> None:
        if self.pending or self._deferred:
            self.drain_pending(stop=False)

    @property
    def detectors(self) -> Detector:
        """The detector this Monitor runs on every update (by default a :class:`DetectorChain`)."""
        return self._detector

    def wrap_detectors(self, wrapper: Callable[[Detector], Detector]) -> Detector:
        """Replace the detectors by ``wrapper(current)`` (a combinator); returns the new one.

        The wrapper runs the detectors it was given and decides what their alarms mean (the
        cross-rank agreement is one: :func:`nanscope.torch.distributed.agree`). Its ``reset()``,
        if any, is what :meth:`reset_detectors` calls from then on.
        """
        wrapped = wrapper(self._detector)
        if not callable(getattr(wrapped, "step", None)):
            raise UsageError(
                f"a detector wrapper must return a detector; got {type(wrapped).__name__}"
            )
        self._detector = wrapped
        return wrapped

    def reset_detectors(self) -> None:
        """Forget the detectors' history (the rollback policy calls it after restoring)."""
        reset = getattr(self._detector, "reset", None)
        if callable(reset):
            reset()

    def record_event(self, name: str, **fields: Any) -> None:
        """Record a run event (``"interrupted"``, ...): one ``{"event": name, **fields}`` line in
        the trace file (flushed) and an entry in ``self.events``. Never raises."""
        event = {"event": str(name), **fields}
        self.events.append(event)
        try:
            with contextlib.suppress(DivergenceError):  # a stop found in them: already saved
                self.drain_pending()  # the updates before the event come before it in the file
            self.write(event)
            self.flush()
        except Exception as exc:
            self._internal_fault("record_event", exc)
        # after the header is written: the rules read the events from the trace's meta
        self.trace.meta.setdefault("events", []).append(event)

    # ------------------------------------------------------------------ diagnosis

    def diagnose(self) -> Diagnosis:
        """Run the probes (only now: they may be expensive) and the rules on the trace so far."""
        from nanscope.diagnose import diagnose

        self.drain_pending()
        evidence = dict(self.evidence)
        if self.alarm is not None:
            evidence["alarm"] = {
                "kind": self.alarm.kind,
                "step": self.alarm.step,
                "text": self.alarm.text,
                **self.alarm.data,
            }
            evidence.setdefault("rows", self._probe_rows())
            for probe in self.probes:
                try:
                    found = dict(probe(self, self.alarm))
                except Exception as exc:
                    self._internal_fault("probe", exc)
                    continue
                # rows from several probes add up (the rules drop duplicates); the rest replaces
                evidence["rows"] = list(evidence.get("rows") or []) + list(found.pop("rows", []))
                evidence.update(found)
        run = {"id": self.run_id, "dir": str(self.run_dir)}
        if self._write:
            run["trace"] = str(self.run_dir / "trace.jsonl")
        if self.meta.get("last_good"):
            run["last_good"] = self.meta["last_good"]
        evidence["run"] = run
        diagnosis = diagnose(self.trace, evidence=evidence)
        if self.rollbacks:
            diagnosis.extra["rollbacks"] = list(self.rollbacks)
        self.diagnosis = diagnosis
        return diagnosis

    def close(self) -> Diagnosis:
        """Finish the run: diagnose it (if nothing stopped it) and write ``diagnosis.json``."""
        if self._closed and self.diagnosis is not None:
            return self.diagnosis
        self._closed = True
        with contextlib.suppress(DivergenceError):  # a stop in the last records: already saved
            self.drain_pending()
        diagnosis = self.diagnosis if self.alarm is not None and self.diagnosis else None
        if diagnosis is None:
            diagnosis = self.diagnose()
        self.save_diagnosis(diagnosis)
        if self._writer is not None:
            self._writer.close()
        _OPEN_MONITORS.discard(self)
        return diagnosis

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _recovery_action(alarm: Alarm, rows: list[dict[str, Any]], data: bool) -> str:
    """What one recovery did, in words (one line): the row it skipped, or the lr it cut."""
    from nanscope.formatting import lr as lr_text
    from nanscope.formatting import row as row_text

    if data:
        if rows:
            more = f" and {len(rows) - 1} more row(s)" if len(rows) > 1 else ""
            held = f"which holds {row_text(rows[0])}{more}"
        else:
            held = "whose inputs or targets hold the bad values"
        return f"skipped its batch, {held}; weights and lr unchanged"
    before, after = alarm.data.get("lr_before"), alarm.data.get("lr_after")
    cut = f" ({lr_text(before)} -> {lr_text(after)})" if before is not None else ""
    return f"skipped its batch and cut the lr tenfold{cut}"


def _loss_value(loss: Any) -> tuple[float, int]:
    if isinstance(loss, bool) or loss is None:
        raise UsageError(f"loss must be a number or a 0-d array, got {loss!r}")
    if isinstance(loss, (int, float)):
        value = float(loss)
        return value, 0 if math.isfinite(value) else 1
    if isinstance(loss, (str, bytes)):
        raise UsageError(f"loss must be a number, not a string ({loss!r})")
    array = as_array(loss, "loss")
    if array.size == 1:
        value = float(array.reshape(-1)[0].real)
        return value, 0 if math.isfinite(value) else 1
    if array.size == 0:
        raise UsageError("loss is an empty array")
    nonfinite = int(array.size - np.count_nonzero(np.isfinite(array)))
    return float(np.mean(array)), nonfinite


def _merge_batch(record: dict[str, Any], result: Mapping[str, Any]) -> None:
    for key, value in result.items():
        if key == "rows":
            record.setdefault("rows", []).extend(value)
        else:
            record[key] = value


def _sync_all() -> None:
    """SIGTERM: the records the Monitors' sources hold go to their traces before the flush."""
    for monitor in list(_OPEN_MONITORS):
        with contextlib.suppress(Exception):
            monitor._sync_pending()


trace_module.before_flush_all.append(_sync_all)


@atexit.register
def _close_all() -> None:  # pragma: no cover - runs at interpreter exit
    for monitor in list(_OPEN_MONITORS):
        with contextlib.suppress(Exception):
            monitor.close()
