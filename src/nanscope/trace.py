"""Per-update records, held in memory as columns and on disk as JSONL.

A *record* is a plain ``dict`` describing one update (or one logged line of a log). Every capture
path -- :class:`nanscope.Monitor`, the PyTorch adapter, the log readers -- produces the same keys,
so the rules never need to know where a trace came from. All keys but ``step`` are optional; a
missing key means "not measured".

=================  ======  ===============================================================
key                type    meaning
=================  ======  ===============================================================
step               int     the update number (1 is the first update)
epoch              int     epoch, when known (logs)
loss               float   training loss of this update (NaN / inf kept as such)
val_loss           float   validation loss (logs)
lr                 float   learning rate used for this update
grad_norm          float   global L2 norm of the gradient
grad_norms         dict    per-name gradient L2 norms ``{name: float}``
weight_norm        float   global L2 norm of the parameters
update_norm        float   L2 norm of the applied update (params now minus params before)
update_cos         float   cosine(applied update, gradient of the previous update);
                           negative for descent, positive when the update ascends
update_cos_same    float   cosine(applied update, gradient of this update) -- for callers
                           that report params *after* stepping
grad_cos           float   cosine(gradient now, gradient before); negative = reversal
flip_frac          float   fraction of weights whose sign flipped since the last update
nf_loss            int     count of non-finite values in the loss
nf_grads           int     ... in the gradients
nf_params          int     ... in the parameters
grad_past_range    bool    the gradient's elements are finite but its norm lies past the
                           range of its dtype (float32: 3.4e38): any step with it overflows
nf_inputs          int     ... in the input batch
nf_targets         int     ... in the targets
input_absmax       float   max |x| over the input batch
target_absmax      float   max |y| over the targets
input_scale_ratio  float   largest column scale over the median column scale (first batch)
input_scale_column int     the column with that largest scale
row_z              float   largest robust z-score of a row in the batch (when computed)
rows               list    bad rows: ``{"source", "batch_row", "column", "value", "why", "z"}``
events             list    short tags of what detectors saw (``"loss_spike"``, ``"grad_jump"``...)
extra              dict    anything else (loss scale, skipped steps, rank, messages from logs)
=================  ======  ===============================================================

On disk a trace is JSONL: a header line ``{"schema": "nanscope.trace/1", ...meta}`` followed by one
record per line. Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` so
that every line is strict JSON; :func:`read_trace` turns them back into floats. The writer buffers
records for at most half a second (or 64 lines) and writes events, alarms, closes, interpreter
exit and SIGTERM at once, so a killed process leaves a readable trace missing only its last
moments (a truncated last line is skipped with a warning, and ``trace.meta["truncated"]`` says
so).

Besides records, a trace may hold *event* lines, ``{"event": "<name>", ...fields}``, written by
:meth:`TraceWriter.event` (for example ``{"event": "interrupted", "signal": "SIGINT", "step": 41}``
when the run was stopped from outside). :func:`read_trace` puts them in ``trace.meta["events"]``,
never among the records.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import signal
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from nanscope.errors import TraceError

#: the meta ``optimizer`` of a torch loop that updates its weights by hand (``w -= lr * g``)
HAND_WRITTEN_SGD = "manual update (no torch.optim)"

try:  # the fast encoder of the common line; the standard library's where it is missing
    import orjson
except ImportError:  # pragma: no cover - a dependency, but never a reason to stop a run
    orjson = None  # type: ignore[assignment]

__all__ = [
    "HAND_WRITTEN_SGD",
    "NUMERIC_KEYS",
    "RECORD_KEYS",
    "TRACE_SCHEMA",
    "Trace",
    "TraceWriter",
    "decode_record",
    "encode_record",
    "flush_all",
    "is_event",
    "read_trace",
]

TRACE_SCHEMA = "nanscope.trace/1"

#: Keys whose values are floats (and may hold NaN / inf).
NUMERIC_KEYS: frozenset[str] = frozenset(
    {
        "loss",
        "val_loss",
        "lr",
        "grad_norm",
        "weight_norm",
        "update_norm",
        "update_cos",
        "update_cos_same",
        "grad_cos",
        "flip_frac",
        "input_absmax",
        "target_absmax",
        "input_scale_ratio",
        "row_z",
    }
)

#: Every record key of the table above (the one definition; the log sniffer uses it too).
RECORD_KEYS: frozenset[str] = NUMERIC_KEYS | frozenset(
    {
        "step", "epoch", "grad_norms", "nf_loss", "nf_grads", "nf_params", "nf_inputs",
        "nf_targets", "input_scale_column", "rows", "events", "extra", "grad_past_range",
    }
)  # fmt: skip

_NONFINITE_TEXT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "+inf": math.inf}


def _encode_float(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def _decode_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _NONFINITE_TEXT:
            return _NONFINITE_TEXT[text]
        if text in ("infinity", "+infinity"):
            return math.inf
        if text == "-infinity":
            return -math.inf
        try:
            return float(text)
        except ValueError:
            return None
    return None


def _encode_value(value: Any) -> Any:
    if isinstance(value, float):
        return _encode_float(value)
    if isinstance(value, dict):
        return {str(k): _encode_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode_value(v) for v in value]
    if isinstance(value, np.generic):
        return _encode_value(value.item())
    return value


_FAST = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DUMPS = orjson.dumps if orjson is not None else None


def encode_record(record: Mapping[str, Any]) -> str:
    """One strict-JSON line for a record (non-finite floats become strings, None is dropped)."""
    if _DUMPS is not None:
        # the common case, plain Python values, all finite: one call to a fast C encoder (a
        # tenth of the standard one's time, which is mostly float formatting). It writes None
        # and NaN alike as null and refuses numpy scalars, big ints and non-str keys: any of
        # those takes the exact path below.
        try:
            line = _DUMPS(record)
        except TypeError:
            pass
        else:
            if b"null" not in line:
                return line.decode()
    try:
        # all values finite plain Python: the standard C encoder in one call
        return _FAST.encode({k: v for k, v in record.items() if v is not None})
    except (ValueError, TypeError):
        clean = {k: _encode_value(v) for k, v in record.items() if v is not None}
        # default=repr: a value JSON cannot hold is written as its repr, never lost with the line
        return json.dumps(clean, separators=(",", ":"), allow_nan=False, default=repr)


def decode_record(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a parsed JSON object back into a record: numeric strings become floats again."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key in NUMERIC_KEYS:
            out[key] = _decode_float(value)
        elif key == "grad_norms" and isinstance(value, dict):
            out[key] = {str(k): _decode_float(v) for k, v in value.items()}
        elif key == "rows" and isinstance(value, list):
            rows = []
            for row in value:
                if isinstance(row, dict):
                    row = dict(row)
                    if "value" in row:
                        row["value"] = _decode_float(row["value"])
                    if "z" in row:
                        row["z"] = _decode_float(row["z"])
                    rows.append(row)
            out[key] = rows
        else:
            out[key] = value
    return out


class Trace:
    """The records of one run, with column access for the rules.

    ``records`` keeps the dicts in order; :meth:`column` gives a float array per key (missing
    values are NaN; use :meth:`present` to tell "missing" from "NaN").

    ``sync``: called before ``records`` is read, to hand over records measured but not appended
    yet (a live Monitor's: the torch watcher judges finite updates in batches), so a trace read
    during a run is complete up to the last update.
    """

    def __init__(
        self, records: Iterable[Mapping[str, Any]] = (), meta: Mapping[str, Any] | None = None
    ) -> None:
        self._records: list[dict[str, Any]] = [dict(r) for r in records]
        self.meta: dict[str, Any] = dict(meta or {})
        self._columns: dict[str, np.ndarray] = {}
        self.sync: Callable[[], None] | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        if self.sync is not None:
            self.sync()
        return self._records

    @records.setter
    def records(self, records: list[dict[str, Any]]) -> None:
        self._records = records

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.records[index]

    def append(self, record: Mapping[str, Any], *, copy: bool = True) -> None:
        self._records.append(dict(record) if copy else record)  # type: ignore[arg-type]
        if self._columns:
            self._columns.clear()

    @property
    def granularity(self) -> str:
        return str(self.meta.get("granularity", "update"))

    def column(self, key: str) -> np.ndarray:
        """Float array of ``key`` over all records; missing values are NaN."""
        cached = self._columns.get(key)
        if cached is not None and len(cached) == len(self.records):
            return cached
        values = np.full(len(self.records), np.nan, dtype=np.float64)
        for i, record in enumerate(self.records):
            value = record.get(key)
            if value is not None and not isinstance(value, (dict, list, str)):
                values[i] = float(value)
        self._columns[key] = values
        return values

    def present(self, key: str) -> np.ndarray:
        """Boolean array: True where the record has ``key``."""
        return np.array([record.get(key) is not None for record in self.records], dtype=bool)

    def has(self, key: str) -> bool:
        """True when at least one record carries ``key``."""
        return any(record.get(key) is not None for record in self.records)

    def steps(self) -> np.ndarray:
        return np.array([int(r.get("step", i + 1)) for i, r in enumerate(self.records)])

    def nonfinite(self, what: str) -> np.ndarray:
        """Per-record count of non-finite values in ``what`` (loss, grads, params, inputs, targets).

        Falls back on the value itself for the loss and the gradient norm, so traces from logs that
        carry no counters still say where a NaN was.
        """
        counts = self.column(f"nf_{what}")
        counts = np.where(np.isnan(counts), 0.0, counts)
        if what == "loss":
            loss = self.column("loss")
            counts = np.maximum(counts, (self.present("loss") & ~np.isfinite(loss)).astype(float))
        elif what == "grads":
            # only where no element count was taken: a counted 0 with an inf norm is a float32
            # norm that overflowed while every element was finite
            grad = self.column("grad_norm")
            guess = self.present("grad_norm") & ~self.present("nf_grads") & ~np.isfinite(grad)
            counts = np.maximum(counts, guess.astype(float))
            # finite elements whose norm lies past their dtype's range: any step overflows
            counts = np.maximum(counts, self.present("grad_past_range").astype(float))
        return counts


#: a buffered line waits at most this long (seconds) before it is written ...
FLUSH_SECONDS = 0.5
#: ... or until this many lines are waiting
FLUSH_LINES = 64

_OPEN: weakref.WeakSet[TraceWriter] = weakref.WeakSet()
_SIGNAL_STATE: dict[str, Any] = {"installed": False}


#: called first by :func:`flush_all`: what hands over records not written yet (the Monitor's
#: pending records, which the torch watcher holds for a batch)
before_flush_all: list[Callable[[], None]] = []


def flush_all() -> None:
    """Write every open trace writer's buffered lines now (atexit and SIGTERM call this)."""
    for hand_over in list(before_flush_all):
        with contextlib.suppress(Exception):
            hand_over()
    for writer in list(_OPEN):
        with contextlib.suppress(Exception):
            writer.flush()


def _on_sigterm(signum: int, frame: Any) -> None:  # pragma: no cover - runs in a signal
    """Flush the traces, then die of SIGTERM as the process would have without us."""
    flush_all()
    with contextlib.suppress(Exception):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _arm_sigterm() -> None:
    """Flush on SIGTERM too, but only where nobody handles SIGTERM yet (``nanscope run`` and
    torchrun's arm turn it into an exception that unwinds to close/atexit anyway)."""
    if _SIGNAL_STATE["installed"]:
        return
    _SIGNAL_STATE["installed"] = True
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError, TypeError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)


atexit.register(flush_all)


class TraceWriter:
    """Appends records to a JSONL file, buffered by time and count so a killed run keeps a trace.

    A record waits in memory (encoded only when written, in one go with the others: the update
    pays for a list append) until ``flush_lines`` lines wait or ``flush_seconds`` passed
    since the last write to disk (checked on each record: a slow fit writes every record at once);
    the header, the first ``flush_lines`` records (a short run is never cut), every event and
    :meth:`flush` write at once, and so do :meth:`close`, interpreter exit and SIGTERM (when no
    other handler owns it). A SIGKILLed run loses at most the lines of its
    last ``flush_seconds`` (or ``flush_lines``); :func:`read_trace` skips a cut last line.
    ``flush_lines=1`` writes every record at once.

    The header line is written when the file is new or empty; opening an existing trace again
    appends to it (an event after the run, a resumed run) without a second header.
    """

    def __init__(
        self,
        path: str | Path,
        meta: Mapping[str, Any] | None = None,
        *,
        flush_seconds: float = FLUSH_SECONDS,
        flush_lines: int = FLUSH_LINES,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_seconds = float(flush_seconds)
        self.flush_lines = max(1, int(flush_lines))
        #: lines to write: events as text, records as the dicts themselves, encoded when written
        #: (in one go, off the update's path)
        self._pending: list[str | dict[str, Any]] = []
        #: the first lines go straight to disk: a short run (or a run's start) is never cut
        self._through = self.flush_lines
        self._flushed_at = time.monotonic()
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        if self._file.tell() == 0:
            header = {"schema": TRACE_SCHEMA, **dict(meta or {})}
            self._write_line(encode_record(header), now=True)
        _OPEN.add(self)
        _arm_sigterm()

    def _write_line(self, line: str | dict[str, Any], *, now: bool = False) -> None:
        if self._file is None:
            return
        self._pending.append(line)
        if self._through > 0:
            self._through -= 1
            now = True
        if (
            now
            or len(self._pending) >= self.flush_lines
            or time.monotonic() - self._flushed_at >= self.flush_seconds
        ):
            self.flush()

    def flush(self) -> None:
        """Write the buffered lines to disk now."""
        self._flushed_at = time.monotonic()
        if self._file is None or not self._pending:
            return
        lines = [
            item if item.__class__ is str else encode_record(item)  # type: ignore[arg-type]
            for item in self._pending
        ]
        self._pending.clear()
        text = "\n".join(lines) + "\n"
        self._file.write(text)
        self._file.flush()

    def write(self, record: Mapping[str, Any]) -> None:
        if self._file is None or self._through > 0:
            self._write_line(dict(record))
            return
        # the common case inline (it runs on every update); a shallow copy: the line is what
        # the record was now, whatever the caller does with it later
        pending = self._pending
        pending.append(dict(record))
        if (
            len(pending) >= self.flush_lines
            or time.monotonic() - self._flushed_at >= self.flush_seconds
        ):
            self.flush()

    def event(self, name: str, **fields: Any) -> None:
        """Write one event line ``{"event": name, ...fields}`` (not an update record), at once.

        :func:`read_trace` collects these into ``trace.meta["events"]``. The event
        ``interrupted`` carries ``signal`` (``"SIGINT"``, ``"SIGTERM"``, ``"KeyboardInterrupt"``)
        and ``step`` (the last update seen).
        """
        self._write_line(encode_record({**fields, "event": str(name)}), now=True)

    def close(self) -> None:
        if self._file is not None:
            try:
                self.flush()
            finally:
                self._file.close()
                self._file = None
        _OPEN.discard(self)


def is_event(obj: Mapping[str, Any]) -> bool:
    """True for an event line (``{"event": "<name>", ...}``), which is not an update record."""
    return isinstance(obj.get("event"), str)


def read_trace(path: str | Path) -> Trace:
    """Read a nanscope JSONL trace; a truncated last line (a killed run) is skipped with a warning
    and ``meta["truncated"]`` is set. Event lines go to ``meta["events"]`` (a list of dicts), not
    into the records.

    A file with a nanscope header and no record is a run that saw no update: it reads as an empty
    trace (the engine calls it ``unobserved``). Raises :class:`nanscope.errors.TraceError` when
    the file is missing, empty, binary, or holds neither a header nor a valid record.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        candidate = path / "trace.jsonl"
        if not candidate.exists():
            raise TraceError(f"{path}: is a directory without a trace.jsonl")
        path = candidate
    raw = path.read_bytes()
    if not raw.strip():
        raise TraceError(f"{path}: the file is empty")
    if b"\x00" in raw[:4096]:
        raise TraceError(f"{path}: looks binary, not a JSONL trace")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    lines = text.splitlines()
    meta: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # malformed, absurd numbers, absurd nesting
            bad.append(number)
            continue
        if not isinstance(obj, dict):
            bad.append(number)
            continue
        if "schema" in obj and not records and not meta:
            meta = {k: v for k, v in obj.items() if k != "schema"}
            meta["schema"] = obj["schema"]
            continue
        if is_event(obj):
            events.append(decode_record(obj))
            continue
        records.append(decode_record(obj))
    if bad:
        last = len([ln for ln in lines if ln.strip()])
        if bad == [last]:
            meta["truncated"] = True
            warnings.warn(
                f"{path}: skipped a truncated last line ({last}); the run was probably killed",
                stacklevel=2,
            )
        else:
            warnings.warn(f"{path}: skipped {len(bad)} unreadable line(s): {bad[:5]}", stacklevel=2)
    if not records and meta.get("schema") != TRACE_SCHEMA:
        raise TraceError(f"{path}: holds no trace records")
    for i, record in enumerate(records):
        record.setdefault("step", i + 1)
    events = _attach_closure_losses(records, events)
    if events:
        meta["events"] = events
    return Trace(records, meta)


#: the event a closure optimizer's update writes after its step: every closure evaluation's loss
CLOSURE_LOSSES = "closure_losses"


def _attach_closure_losses(
    records: list[dict[str, Any]], events: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Put each ``closure_losses`` event back on its update as ``extra["closure_losses"]`` (the
    update's record is written at its first closure evaluation, the others come after it)."""
    if not any(e.get("event") == CLOSURE_LOSSES for e in events):
        return events
    by_step = {r.get("step"): r for r in records}
    rest = []
    for event in events:
        record = by_step.get(event.get("step")) if event.get("event") == CLOSURE_LOSSES else None
        if record is None:
            rest.append(event)
            continue
        losses = event.get("losses")
        record.setdefault("extra", {})[CLOSURE_LOSSES] = list(losses) if losses else []
    return rest
