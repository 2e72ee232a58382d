"""Loading: the one place where a path becomes a :class:`~nanscope.trace.Trace`.

Every command (``diagnose``, ``report``, ...) and the public :func:`nanscope.diagnose` read files
through :func:`load`, so a trace, a run directory or a log in any format :mod:`nanscope.logs`
reads gives the same records, the same ``meta`` (``format``, ``truncated``, ``events``...) and the
same one-line :class:`~nanscope.errors.TraceError` for a file that cannot be read, whichever
command read it. The layers below know no file: the diagnosis engine takes a trace, the HTML
report renders a diagnosis.

>>> from nanscope.loading import load, diagnose
>>> trace = load("runs/x/trace.jsonl")         # doctest: +SKIP
>>> diagnose("train.log").verdict             # doctest: +SKIP
'nonfinite'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.errors import TraceError
from nanscope.trace import TRACE_SCHEMA, Trace, read_trace

__all__ = ["MAX_RECORDS", "diagnose", "is_path", "load", "run_evidence"]

#: a log longer than this keeps full detail around its first NaN (an eighth of this on either
#: side), the records that carry events, its last records, and every k-th record elsewhere: the
#: diagnosis reads a bounded trace whatever the log's length (time and memory flat in it)
MAX_RECORDS = 20_000


def is_path(source: Any) -> bool:
    """True for what names a file: a ``str``, ``bytes`` or an ``os.PathLike``."""
    return isinstance(source, (str, bytes)) or hasattr(source, "__fspath__")


def _path(source: Any) -> Path:
    if isinstance(source, bytes):
        return Path(source.decode(errors="surrogateescape"))
    return Path(source)


def load(
    source: Any, *, format: str | None = None, max_records: int | None = MAX_RECORDS
) -> Trace:
    """A trace from a nanscope trace file, a run directory, or any log :mod:`nanscope.logs` reads.

    ``format`` forces a reader (a key of :data:`nanscope.logs.FORMATS`); ``max_records`` bounds
    memory on huge logs (``None``: keep every record). A nanscope trace that holds its header and
    no update (a run stopped before its first update) loads as an empty trace rather than an
    error, so it can be diagnosed ``unobserved``. Raises :class:`~nanscope.errors.TraceError` with
    one line naming the file and what is wrong.
    """
    from nanscope.logs import load_trace

    path = _path(source)
    try:
        return load_trace(path, format=format, max_records=max_records)
    except TraceError:
        header_only = _header_only(path)
        if header_only is None:
            raise
        return header_only


def _header_only(path: Path) -> Trace | None:
    """The empty trace of a nanscope trace file with a header and no record, else None."""
    target = path / "trace.jsonl" if path.is_dir() else path
    try:
        if not target.is_file() or target.stat().st_size > 1 << 20:
            return None
        with target.open("rb") as handle:
            head = handle.readline(64 * 1024)
        if TRACE_SCHEMA.encode() not in head:
            return None
        trace = read_trace(target)
    except (OSError, TraceError):
        return None
    if len(trace):
        return None
    trace.meta.setdefault("format", "nanscope")
    trace.meta.setdefault("source", str(path))
    return trace


def run_evidence(source: Any) -> dict[str, Any]:
    """What a run directory's ``diagnosis.json`` adds to its bare trace: the located op, the bad
    rows and the run's paths (found by the probes while the run was live). ``{}`` when none."""
    path = _path(source)
    folder = path if path.is_dir() else path.parent
    saved = folder / "diagnosis.json"
    if not saved.is_file():
        return {}
    try:
        data = json.loads(saved.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    evidence: dict[str, Any] = {}
    for key, kind in (("located", dict), ("rows", list), ("run", dict)):
        if isinstance(data.get(key), kind):
            evidence[key] = data[key]
    return evidence


def diagnose(source: Any, evidence: Mapping[str, Any] | None = None) -> Diagnosis:
    """Diagnose a :class:`~nanscope.trace.Trace`, a list of records, or a path (read by
    :func:`load`). The public ``nanscope.diagnose``."""
    from nanscope.diagnose.engine import diagnose as diagnose_trace

    if is_path(source):
        source = load(source)
    return diagnose_trace(source, evidence)
