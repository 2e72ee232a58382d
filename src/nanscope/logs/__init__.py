"""Log readers: turn the logs people already have into a :class:`nanscope.trace.Trace`.

>>> from nanscope.logs import load_trace, sniff
>>> trace = load_trace("train.log")            # doctest: +SKIP
>>> trace.meta["format"], trace.granularity     # doctest: +SKIP
('text', 'epoch')

The format is found from the content (the name is only a tie-breaker): :func:`sniff` returns one of
the names in :data:`FORMATS`. Every reader streams its file line by line (lines longer than a few
MB are skipped, never buffered) and yields the same record keys as the Monitor.

``trace.meta`` always holds ``format``, ``source``, ``lines`` (lines read) and ``granularity``
(``"update"`` or ``"epoch"``); text logs add ``messages`` (framework messages about numerics),
TensorBoard adds ``loss_tag`` and ``tags``. A log with no training loss at all but a validation
loss (``Epoch 3/20 - val_loss: 0.33``, a CSV with only ``val_loss``) is read with the validation
loss as each record's ``loss``: ``meta["loss_key"] = "val_loss"`` and ``meta["loss_note"]`` say
so. What a log shows beyond its values (skipped steps, the Trainer's NaN filter, where a loss
scaler gave up, a non-finite loss a framework reported) is written into the records once read
(:mod:`nanscope.logs._facts`); ``meta["loss_scale"]`` and ``meta["skipped_steps"]`` sum it up.
See ``docs/logs/index.md``.
"""

from __future__ import annotations

import importlib
import json
import math
import struct
from collections.abc import Iterator, Mapping
from itertools import chain, islice
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nanscope.errors import TraceError
from nanscope.logs._common import (
    HEAD_BYTES,
    Columns,
    LogWarning,
    Record,
    check_file,
    expand,
    iter_lines,
    read_head,
    text_encoding,
    warn,
)
from nanscope.logs._facts import establish
from nanscope.logs._thin import thin
from nanscope.trace import RECORD_KEYS, TRACE_SCHEMA, Trace

__all__ = ["FORMATS", "LogWarning", "iter_records", "load_trace", "sniff"]

_MODULES: dict[str, str] = {
    "nanscope": "nanscope.logs.nanscope_trace",
    "jsonl": "nanscope.logs.jsonl",
    "csv": "nanscope.logs.csvlog",
    "trainer_state": "nanscope.logs.trainer_state",
    "tensorboard": "nanscope.logs.tbevents",
    "text": "nanscope.logs.textlog",
}

#: Known formats: name -> one-line description.
FORMATS: Mapping[str, str] = MappingProxyType(
    {
        "nanscope": 'nanscope JSONL trace (header {"schema": "nanscope.trace/1"})',
        "jsonl": "JSON Lines, one object a line with step/loss/grad_norm/lr keys under usual names",
        "csv": "CSV with a header row (Keras/Lightning CSVLogger, step,loss,grad_norm,lr,...)",
        "trainer_state": "Hugging Face Trainer trainer_state.json (log_history)",
        "tensorboard": "TensorBoard event files (events.out.tfevents.*, a file or a run directory)",
        "text": "plain training output (Keras progress, Epoch N/M blocks, step/iter loops, tqdm)",
    }
)

_TRACE_KEYS = RECORD_KEYS


def _known() -> str:
    return ", ".join(FORMATS)


def _is_tfrecord(head: bytes) -> bool:
    if len(head) < 16:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    if length <= 0 or length > 1 << 20:
        return False
    return b"brain.Event:" in head[12 : 12 + min(length, 256)]


def _event_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("events.out.tfevents*") if p.is_file())


def _resolve(path: Path) -> tuple[str, Path]:
    """``(format, file or directory to read)``; raises TraceError when nothing fits."""
    check_file(path)
    if path.is_dir():
        if (path / "trace.jsonl").is_file():
            return "nanscope", path / "trace.jsonl"
        if _event_files(path):
            return "tensorboard", path
        states = sorted(path.glob("trainer_state.json")) or sorted(
            path.glob("checkpoint-*/trainer_state.json"),
            key=lambda p: (
                int(p.parent.name.rpartition("-")[2] or 0)
                if p.parent.name.rpartition("-")[2].isdigit()
                else -1
            ),
        )
        if states:
            return "trainer_state", states[-1]
        metrics = sorted(path.rglob("metrics.csv"))
        if metrics:
            return "csv", metrics[-1]
        raise TraceError(
            f"{path}: is a directory without a trace.jsonl, TensorBoard event files, "
            f"trainer_state.json or metrics.csv; known formats: {_known()}"
        )
    head = read_head(path)
    if _is_tfrecord(head) or path.name.startswith("events.out.tfevents"):
        return "tensorboard", path
    encoding = text_encoding(head)
    if encoding == "utf-8" and b"\x00" in head:
        raise TraceError(f"{path}: looks binary (NUL bytes), not a log; known formats: {_known()}")
    text = head.decode(encoding, errors="replace")
    if _looks_binary(text):
        raise TraceError(
            f"{path}: looks binary (mostly bytes that are not text), not a log; "
            f"known formats: {_known()}"
        )
    text = text.lstrip("\ufeff")
    lines = text.splitlines()
    if len(head) == HEAD_BYTES and lines:
        lines = lines[:-1]  # the last one may be cut
    first = next((line.strip().lstrip("\ufeff") for line in lines if line.strip()), "")
    if not first:
        if len(head) < HEAD_BYTES:
            raise TraceError(f"{path}: holds only blank lines")
        first = text.strip()[:200]
    fmt = _sniff_text(path, first, text)
    if fmt is None:
        raise TraceError(f"{path}: {_unread(lines)}; known formats: {_known()}")
    return fmt, path


def _unread(lines: list[str]) -> str:
    """Which line of a log nothing could read, and what was expected there (one clause)."""
    from nanscope.logs import textlog

    found = textlog.first_unread(lines)
    if found is None:
        return "not a log format nanscope knows (no line holds a number)"
    number, line, why = found
    shown = " ".join(line.split())
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return (
        f"line {number} could not be read ({shown!r}{', ' + why if why else ''}); expected "
        "values named on the line (loss: 0.5, loss=0.5, 'loss': 0.5) or a header row naming a "
        "loss column above rows of values"
    )


_CONTROL = frozenset(chr(c) for c in range(32)) - frozenset("\t\n\r\x08\x0c\x1b")


def _looks_binary(text: str) -> bool:
    """True when most lines of ``text`` are mostly bytes that are not text.

    One row of invalid UTF-8 (a latin-1 file name, a cut multibyte character) never makes a log
    binary: the readers replace those bytes and read the rest.
    """
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return False
    garbage = 0
    for line in lines[:2000]:
        bad = line.count("\ufffd") + sum(1 for char in line if char in _CONTROL)
        if bad > 0.3 * len(line):
            garbage += 1
    return garbage > 0.5 * min(len(lines), 2000)


def _sniff_text(path: Path, first: str, text: str) -> str | None:
    if first.startswith("{"):
        try:
            obj = json.loads(first)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            if obj.get("schema") == TRACE_SCHEMA:
                return "nanscope"
            if "log_history" in obj or path.name == "trainer_state.json":
                return "trainer_state"
            if "step" in obj and set(obj) <= _TRACE_KEYS and _all_ours(text):
                return "nanscope"
            return "jsonl"
        if '"log_history"' in text or path.name == "trainer_state.json":
            return "trainer_state"
        if path.suffix in (".jsonl", ".ndjson"):
            return "jsonl"
        # not JSON: printed dicts ({'loss': nan, ...}) are text
    from nanscope.logs import csvlog, textlog

    if any(sep in first for sep in (",", "\t", ";")):
        _, names = csvlog.split_header(first)
        roles = set(csvlog.header_roles([n.strip().strip('"') for n in names]).values())
        numeric = sum(1 for n in names if _is_number(n))
        if roles & {"loss", "val_loss"} and numeric == 0 and len(names) > 1:
            return "csv"
    if textlog.looks_like(text.splitlines()):
        return "text"
    # text logs often open with pages of warnings: look further, streaming, before giving up
    meta: dict[str, Any] = {}
    window: list[str] = []
    for number, line in enumerate(iter_lines(path, meta, max_line=256 * 1024)):
        window.append(line)
        if len(window) >= 2000:
            if textlog.looks_like(window):
                return "text"
            window = window[-4:]
        if number > 200_000:
            break
    if window and textlog.looks_like(window):
        return "text"
    return None


def _all_ours(text: str) -> bool:
    """True when the first JSON lines all hold only nanscope record keys."""
    for line in text.splitlines()[:20]:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and not set(obj) <= _TRACE_KEYS:
            return False
    return True


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def sniff(path: str | Path) -> str:
    """The name of the format of ``path`` (a key of :data:`FORMATS`), found from its content.

    Raises :class:`nanscope.errors.TraceError` for a missing, empty or binary file, and for a
    file in no known format (the message lists them).
    """
    return _resolve(Path(path))[0]


def _reader(fmt: str) -> Any:
    if fmt not in _MODULES:
        raise TraceError(f"unknown log format {fmt!r}; known formats: {_known()}")
    return importlib.import_module(_MODULES[fmt])


def iter_records(
    path: str | Path, meta: dict[str, Any] | None = None, format: str | None = None
) -> Iterator[Record]:
    """Stream the records of a log one at a time (bounded memory); ``meta`` is filled as it goes.

    ``format`` forces a reader (a key of :data:`FORMATS`) instead of sniffing.
    """
    # a chain, not a generator: records pass through without resuming a Python frame each;
    # the file is still only opened (and errors raised) on the first next()
    chunks = _chunks(Path(path), {} if meta is None else meta, format)
    return chain.from_iterable(map(expand, chunks))


def _chunks(source: Path, meta: dict[str, Any], format: str | None) -> Iterator[list[Any]]:
    """The log's records in lists, in order, some rows as :class:`Columns` (not dicts yet)."""
    return chain.from_iterable(_open_chunks(source, meta, format))


def _open_chunks(
    source: Path, meta: dict[str, Any], format: str | None
) -> Iterator[Iterator[list[Any]]]:
    if format is None:
        fmt, target = _resolve(source)
    else:
        check_file(source)
        fmt, target = format, source
    module = _reader(fmt)
    meta.setdefault("format", fmt)
    meta.setdefault("source", str(source))
    if hasattr(module, "iter_chunks"):
        chunks: Iterator[list[Any]] = module.iter_chunks(target, meta)
    else:
        records = module.iter_records(target, meta)
        chunks = iter(lambda: list(islice(records, _BATCH)), [])
    if fmt == "nanscope":
        yield chunks  # a trace's loss is the loss the Monitor was given
    else:
        yield _loss_or_val_loss(chunks, meta, source)


#: Records looked at (and held) before a log without any training loss so far is read with its
#: validation loss as the loss; past it, later records are converted as they come.
HOLD_RECORDS = 100_000
_BATCH = 4096

#: ``meta["loss_note"]`` of a log read with its validation loss as the loss
VAL_LOSS_NOTE = (
    "this log records no training loss, only a validation loss: the validation loss is read "
    "as the loss (one value per evaluation, not per update)"
)


def _has_loss(item: Any) -> bool:
    return "loss" in (item.keys if item.__class__ is Columns else item)


def _loss_or_val_loss(
    chunks: Iterator[list[Any]], meta: dict[str, Any], source: Path
) -> Iterator[list[Any]]:
    """The chunks as they are once one has a training ``loss``; when none has one and some
    have a ``val_loss``, every record with a ``val_loss`` gets it as its ``loss`` too (flagged
    ``nf_loss`` when not finite) and ``meta`` says so."""
    held: list[list[Any]] = []
    count = 0
    for chunk in chunks:
        if any(map(_has_loss, chunk)):
            yield from held
            yield chunk
            yield from chunks  # the rest passes through as it is
            return
        held.append(chunk)
        count += len(chunk)
        if count >= HOLD_RECORDS:
            break
    records = [record for chunk in held for record in expand(chunk)]
    if not any("val_loss" in record for record in records):
        yield records
        yield from chunks
        return
    meta["loss_key"] = "val_loss"
    meta["loss_note"] = VAL_LOSS_NOTE
    warn(f"{source}: no training loss in this log; its validation loss is read as the loss")
    yield _val_as_loss(records)
    for chunk in chunks:
        yield _val_as_loss(expand(chunk))


def _val_as_loss(records: list[Record]) -> list[Record]:
    for record in records:
        if "loss" in record:
            continue  # (a training loss after HOLD_RECORDS records without one: kept)
        value = record.get("val_loss")
        if value is not None:
            record["loss"] = value
            if not math.isfinite(value):
                record["nf_loss"] = 1
    return records


def _load(path: str | Path, format: str | None = None, max_records: int | None = None) -> Trace:
    meta: dict[str, Any] = {}
    chunks = _chunks(Path(path), meta, format)
    if max_records is not None and max_records > 0:
        records = thin(chunks, max_records, meta)
    else:
        records = list(chain.from_iterable(map(expand, chunks)))
    if meta.get("format") != "nanscope":
        records = establish(records, meta)
    if not records and not meta.get("messages"):
        why = "no loss values found in this " + str(meta.get("format")) + " log"
        if meta.get("format") == "text":
            try:
                head = read_head(Path(path)).decode("utf-8", errors="replace").splitlines()
            except TraceError:
                head = []
            why = _unread(head[:2000])
        raise TraceError(f"{path}: {why}")
    meta.setdefault("lines", len(records))
    meta.setdefault("granularity", "update")
    trace = Trace(meta=meta)
    trace.records = records  # already fresh dicts: no copy of a long trace
    return trace


def load_trace(
    path: str | Path, format: str | None = None, max_records: int | None = None
) -> Trace:
    """Read any supported log or trace into a :class:`~nanscope.trace.Trace`.

    ``format`` forces a reader (a key of :data:`FORMATS`) instead of sniffing. ``max_records``
    bounds memory on huge logs: beyond it the trace is thinned (every k-th record), keeping full
    resolution around the first non-finite record; ``meta["thinned"]`` then says so. Without it
    every record is kept (about 250 bytes each).

    Raises :class:`nanscope.errors.TraceError` (an ``InputError``) with a one-line message naming
    the file and what is wrong; never another exception for bad input.
    """
    try:
        return _load(path, format, max_records)
    except TraceError:
        raise
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (MemoryError, RecursionError, UnicodeError, ValueError, TypeError) as exc:
        fmt = format or "log"
        raise TraceError(
            f"{path}: could not be read as a {fmt} file ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None
