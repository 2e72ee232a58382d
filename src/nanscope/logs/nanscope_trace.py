"""nanscope's own JSONL traces (``{"schema": "nanscope.trace/1", ...}`` then one record a line).

Small traces are read by :func:`nanscope.trace.read_trace`, so there is one definition of the
format. Traces bigger than :data:`STREAM_ABOVE_BYTES` are streamed line by line with the same
record decoding, so memory stays bounded by the records kept, not by the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nanscope.logs._common import Record, iter_lines, skipped
from nanscope.trace import TRACE_SCHEMA, decode_record, is_event, read_trace

NAME = "nanscope"
DESCRIPTION = 'nanscope JSONL trace (header {"schema": "nanscope.trace/1"})'

STREAM_ABOVE_BYTES = 16 * 1024 * 1024


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    if path.is_dir():
        path = path / "trace.jsonl"
    if path.stat().st_size <= STREAM_ABOVE_BYTES:
        try:
            trace = read_trace(path)
        except (ValueError, RecursionError):
            # json.loads raises these (not JSONDecodeError) for absurd lines, e.g. a 5000-digit
            # integer or deep nesting: read line by line instead, skipping such lines.
            yield from _stream(path, meta)
            return
        meta.update({k: v for k, v in trace.meta.items() if k not in ("format", "source")})
        meta.setdefault("schema", TRACE_SCHEMA)
        if _cut_mid_line(path):
            meta["truncated"] = True
        lines = 0
        for index, record in enumerate(trace.records):
            if any(v is None for v in record.values()):
                record = {k: v for k, v in record.items() if v is not None}
            if not isinstance(record.get("step"), int) or isinstance(record.get("step"), bool):
                record["step"] = index + 1
            lines += 1
            yield record
        meta["lines"] = max(int(meta.get("lines", 0) or 0), lines)
        return
    yield from _stream(path, meta)


def _stream(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    count = 0
    bad = 0
    for line in iter_lines(path, meta):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            bad += 1
            continue
        if not isinstance(obj, dict):
            bad += 1
            continue
        if "schema" in obj and count == 0:
            meta.update({k: v for k, v in obj.items() if k not in ("format", "source")})
            continue
        if is_event(obj):  # an event line, not an update record
            meta.setdefault("events", []).append(decode_record(obj))
            continue
        record = {k: v for k, v in decode_record(obj).items() if v is not None}
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            record["step"] = count + 1
        count += 1
        yield record
    if bad and _cut_mid_line(path):
        meta["truncated"] = True
    skipped(meta, path, bad, "unreadable line(s)")


def _cut_mid_line(path: Path) -> bool:
    """True when the file's last line is an unfinished JSON record (a killed writer)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - 65536))
            tail = handle.read()
    except OSError:
        return False
    if not tail or tail.endswith(b"\n"):
        return False
    last = tail.rsplit(b"\n", 1)[-1].strip()
    if not last:
        return False
    try:
        json.loads(last)
    except (ValueError, RecursionError):
        return True
    return False
