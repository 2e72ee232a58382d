"""Hugging Face ``trainer_state.json``: the ``log_history`` the Trainer saves with each checkpoint.

Each training entry (``{"loss", "grad_norm", "learning_rate", "epoch", "step"}``) becomes one
record; evaluation entries (``eval_loss``) give ``val_loss`` at their step; the final summary entry
(``train_runtime``, ``train_loss``) goes to ``meta["train_summary"]`` and the other top-level
scalars (``global_step``, ``logging_steps``, ``max_steps`` ...) to ``meta["trainer_state"]``. The
bare ``NaN`` / ``Infinity`` tokens Python's ``json`` writes are read as floats. The fractional
``epoch`` goes to ``extra["epoch"]``.

The file is parsed streaming, one ``log_history`` entry at a time, so a huge state file never sits
in memory; a truncated file keeps the entries before the cut (with a warning).

**The NaN filter.** With ``logging_nan_inf_filter=True`` (the default) the Trainer leaves NaN/inf
losses out of the logged average; when every update of a logging window was NaN it logs
``"loss": 0.0``. A loss of exactly 0.0 next to a NaN/inf ``grad_norm`` is therefore a hidden NaN:
the record keeps the logged 0.0, gets ``events: ["loss_nan_filtered"]`` and ``nf_grads = 1``, and
``meta["messages"]`` gets an entry of kind ``"nan_filter"`` saying so.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from nanscope.errors import TraceError
from nanscope.logs._common import (
    MAX_MESSAGES,
    Merger,
    Record,
    has_values,
    to_float,
    to_step,
    warn,
)

NAME = "trainer_state"
DESCRIPTION = "Hugging Face Trainer trainer_state.json (log_history)"

#: The largest single JSON value (one log_history entry, one top-level field) we buffer.
MAX_VALUE_CHARS = 8 * 1024 * 1024
_CHUNK = 1 << 16
_WS = " \t\r\n"


class _Truncated(Exception):
    pass


class _JsonStream:
    """Just enough of a streaming JSON reader: walk one object, decode one value at a time."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.json = json.JSONDecoder()
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.chars = 0

    def fill(self) -> None:
        data = self.handle.read(_CHUNK)
        if not data:
            self.eof = True
            self.buf = self.buf[self.pos :] + self.decoder.decode(b"", final=True)
        else:
            self.buf = self.buf[self.pos :] + self.decoder.decode(data)
        self.pos = 0

    def peek(self) -> str:
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if self.eof:
                return ""
            self.fill()

    def take(self, char: str) -> None:
        found = self.peek()
        if found != char:
            if not found:
                raise _Truncated(f"ends where {char!r} was expected")
            raise ValueError(f"expected {char!r}, found {found!r}")
        self.pos += 1

    def value(self) -> Any:
        if not self.peek():
            raise _Truncated("ends early")
        while True:
            try:
                obj, end = self.json.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if self.eof:
                    raise _Truncated("ends inside a value") from None
                if len(self.buf) - self.pos > MAX_VALUE_CHARS:
                    raise ValueError(
                        f"a value longer than {MAX_VALUE_CHARS // (1024 * 1024)} MB"
                    ) from None
                self.fill()
                continue
            if end >= len(self.buf) and not self.eof:
                self.fill()  # a number cut by the chunk boundary: read on and decode again
                continue
            self.pos = end
            return obj


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


class _Counts:
    """What the entries held where numbers belong: quoted numbers read, other strings skipped."""

    def __init__(self) -> None:
        self.quoted = 0
        self.bad = 0
        self.bad_entries = 0
        self.example: str | None = None
        self.quoted_example: str | None = None

    def number(self, entry: dict[str, Any], key: str, step: bool = False) -> float | int | None:
        value = entry.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            number = to_step(value) if step else to_float(value)
            if number is None:
                self.bad += 1
                if self.example is None:
                    self.example = f"{key}: {value[:40]!r} at entry {entry.get('step', '?')!s:.20}"
                return None
            self.quoted += 1
            if self.quoted_example is None:
                self.quoted_example = f"{key}: {value[:40]!r}"
            return number
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.bad += 1
            if self.example is None:
                self.example = f"{key}: {str(value)[:40]} at entry {entry.get('step', '?')!s:.20}"
            return None
        return to_step(value) if step else float(value)

    def warn(self, path: Path, meta: dict[str, Any], entries: int) -> None:
        if self.quoted:
            meta["quoted_numbers"] = self.quoted
            warn(
                f"{path}: {self.quoted} value(s) are numbers written as strings "
                f"({self.quoted_example}); read as numbers"
            )
        if self.bad:
            meta["bad_values"] = self.bad
            meta["skipped_entries"] = self.bad_entries
            warn(
                f"{path}: {self.bad} value(s) where numbers belong are not numbers "
                f"({self.example}); skipped them, and {self.bad_entries} of {entries} "
                "log_history entries left with nothing to read"
            )


def _record(entry: dict[str, Any], counts: _Counts) -> Record:
    record: Record = {}
    bad_before = counts.bad
    step = counts.number(entry, "step", step=True)
    if step is not None:
        record["step"] = int(step)
    for source, key in (
        ("loss", "loss"),
        ("eval_loss", "val_loss"),
        ("grad_norm", "grad_norm"),
        ("learning_rate", "lr"),
    ):
        if source in entry:
            value = counts.number(entry, source)
            if value is not None:
                record[key] = float(value)
    epoch = to_float(entry.get("epoch"))
    if epoch is not None and math.isfinite(epoch):
        record["extra"] = {"epoch": epoch}
    if counts.bad > bad_before and not has_values(record):
        counts.bad_entries += 1
    return record


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    merger = Merger(meta)
    messages: list[dict[str, Any]] = meta.setdefault("messages", [])
    top: dict[str, Any] = {}
    entries = 0
    filtered = 0
    counts = _Counts()
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None
    with handle:
        stream = _JsonStream(handle)
        seen_history = False
        try:
            stream.take("{")
            while True:
                char = stream.peek()
                if char == "}":
                    break
                if char == ",":
                    stream.pos += 1
                    continue
                key = stream.value()
                if not isinstance(key, str):
                    raise ValueError("an object key is not a string")
                stream.take(":")
                if key != "log_history":
                    value = stream.value()
                    if _is_scalar(value):
                        top[key] = value
                    continue
                seen_history = True
                stream.take("[")
                while True:
                    char = stream.peek()
                    if char == "]":
                        stream.pos += 1
                        break
                    if char == ",":
                        stream.pos += 1
                        continue
                    entry = stream.value()
                    entries += 1
                    if not isinstance(entry, dict):
                        continue
                    if "train_runtime" in entry or ("train_loss" in entry and "loss" not in entry):
                        meta["train_summary"] = {k: v for k, v in entry.items() if _is_scalar(v)}
                        continue
                    record = _record(entry, counts)
                    grad = record.get("grad_norm")
                    if record.get("loss") == 0.0 and grad is not None and not math.isfinite(grad):
                        record["events"] = ["loss_nan_filtered"]
                        record["nf_grads"] = 1
                        filtered += 1
                        if len(messages) < MAX_MESSAGES:
                            messages.append(
                                {
                                    "line": None,
                                    "step": record.get("step"),
                                    "kind": "nan_filter",
                                    "text": (
                                        f"step {record.get('step')}: loss logged as 0.0 with "
                                        f"grad_norm {grad}: the Trainer's logging_nan_inf_filter "
                                        "dropped NaN/inf losses from this logging window; the "
                                        "real loss was non-finite"
                                    ),
                                }
                            )
                    done = merger.push(record)
                    if done is not None:
                        yield done
        except _Truncated as exc:
            if not entries and not seen_history:
                raise TraceError(f"{path}: not a complete trainer_state.json ({exc})") from None
            meta["truncated"] = True
            warn(
                f"{path}: the file is cut short after {entries} log_history entries; "
                "read what was there"
            )
        except (ValueError, RecursionError) as exc:
            if not entries:
                raise TraceError(f"{path}: not a valid trainer_state.json ({exc})") from None
            meta["truncated"] = True
            warn(
                f"{path}: invalid JSON after {entries} log_history entries ({exc}); "
                "read what came before"
            )
        meta["lines"] = entries
    last = merger.close()
    if last is not None:
        yield last
    if not seen_history:
        raise TraceError(f"{path}: a JSON object without a log_history list")
    counts.warn(path, meta, entries)
    if top:
        meta["trainer_state"] = top
    if filtered:
        meta.setdefault("message_counts", {})["nan_filter"] = filtered
