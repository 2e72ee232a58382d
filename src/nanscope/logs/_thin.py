"""Keep a very long trace small without losing what the rules look at.

:func:`thin` streams a log's records (in the lists its reader yields, rows of
:class:`~nanscope.logs._common.Columns` included) and keeps at most about ``max_records``:

- the ``window`` records just before the first non-finite one and the ``window`` from it on, at
  full resolution (the growth phase before a NaN is what tells the causes apart);
- later records that are non-finite or carry ``events`` (halved if they alone outgrow the
  budget);
- the last ``window`` records when nothing was non-finite (how the run ended);
- elsewhere every ``stride``-th record, where ``stride`` doubles each time the kept list would
  outgrow ``max_records`` (old strided records are halved to match).

Rows of :class:`Columns` are picked by index, a chunk at a time, and only the kept ones become
dicts: memory and time stay flat in the log's length. Steps keep their logged numbers, so gaps
show. ``meta["thinned"]`` says what was done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from nanscope.logs._common import Columns, Record, expand


def _flagged(record: Record) -> bool:
    return bool(record.get("nf_loss") or record.get("nf_grads") or record.get("events"))


class _Thinner:
    """The state of one thinning: what is kept so far, by index in the whole log."""

    def __init__(self, max_records: int, window: int) -> None:
        self.window = window
        self.budget = max(4, max_records - 2 * window)
        self.strided: list[tuple[int, Record]] = []
        self.critical: list[tuple[int, Record]] = []  # around the first non-finite record
        self.protected: list[tuple[int, Record]] = []  # later non-finite records
        #: the last rows before the first non-finite one: (first index, rows) of dicts or of a
        #: Columns' range, made into dicts only if kept
        self.ring: deque[tuple[int, Columns | None, int, int, list[Record] | None]] = deque()
        self.ring_size = 0
        self.stride = 1
        self.first_bad: int | None = None
        self.total = 0

    # -- dicts, one at a time (the general readers)

    def record(self, record: Record) -> None:
        index = self.total
        self.total += 1
        flagged = _flagged(record)
        if self.first_bad is None and flagged:
            self._start_critical(index)
        if self.first_bad is not None and index - self.first_bad < self.window:
            self.critical.append((index, record))
            return
        if flagged:
            self._protect(index, record)
            return
        if self.first_bad is None:
            self._ring(index, None, 0, 1, [record])
        if index % self.stride == 0:
            self._stride(index, record)

    # -- rows of a Columns, a range at a time

    def columns(self, chunk: Columns) -> None:
        base = self.total
        size = chunk.size
        flagged = chunk.flagged().tolist()
        start = 0
        for bad in [*flagged, size]:
            if start < bad:
                self._clean_rows(chunk, base, start, bad)
            if bad == size:
                break
            index = base + bad
            if self.first_bad is None:
                self._start_critical(index)
            row = chunk.row(bad)
            if index - (self.first_bad or 0) < self.window:
                self.critical.append((index, row))
            else:
                self._protect(index, row)
            start = bad + 1
        self.total = base + size

    def _clean_rows(self, chunk: Columns, base: int, start: int, end: int) -> None:
        """Rows ``start:end`` of ``chunk``, none of them non-finite, row ``i`` being record
        ``base + i`` of the log."""
        if self.first_bad is not None:
            # the window from the first non-finite record on is kept whole
            stop = min(end, self.first_bad + self.window - base)
            for i in range(start, max(start, stop)):
                self.critical.append((base + i, chunk.row(i)))
            start = max(start, stop)
            if start >= end:
                return
        else:
            self._ring(base + max(start, end - self.window), chunk,
                       max(start, end - self.window), end, None)  # fmt: skip
        i = start + (-(base + start)) % self.stride
        while i < end:
            self._stride(base + i, chunk.row(i))
            i += 1
            i += (-(base + i)) % self.stride  # (the stride doubles when the budget fills)

    # -- the kept lists

    def _stride(self, index: int, record: Record) -> None:
        self.strided.append((index, record))
        if len(self.strided) > self.budget:
            self.stride *= 2
            self.strided = [item for item in self.strided if item[0] % self.stride == 0]

    def _protect(self, index: int, record: Record) -> None:
        self.protected.append((index, record))
        if len(self.protected) > self.budget // 2:  # non-finite everywhere: halve those too
            self.protected = self.protected[::2]

    def _ring(self, index: int, chunk: Columns | None, start: int, end: int,
              rows: list[Record] | None) -> None:  # fmt: skip
        self.ring.append((index, chunk, start, end, rows))
        self.ring_size += end - start
        while self.ring and self.ring_size - (self.ring[0][3] - self.ring[0][2]) >= self.window:
            _, _, a, b, _ = self.ring.popleft()
            self.ring_size -= b - a
        self.ring_size = max(self.ring_size, 0)

    def _ring_records(self) -> list[tuple[int, Record]]:
        out: list[tuple[int, Record]] = []
        for index, chunk, start, end, rows in self.ring:
            if rows is not None:
                out.extend((index + k, r) for k, r in enumerate(rows))
            elif chunk is not None:
                out.extend((index + k, chunk.row(i)) for k, i in enumerate(range(start, end)))
        return out[-self.window :]

    def _start_critical(self, index: int) -> None:
        self.first_bad = index
        self.critical.extend(self._ring_records())
        self.ring.clear()
        self.ring_size = 0

    def kept(self) -> list[Record]:
        ring = self._ring_records() if self.first_bad is None else []
        merged = sorted({i: r for i, r in [*self.strided, *self.protected, *self.critical,
                                           *ring]}.items())  # fmt: skip
        return [r for _, r in merged]


def thin(
    chunks: Iterable[list[Any]], max_records: int, meta: dict[str, Any], window: int | None = None
) -> list[Record]:
    """The records of ``chunks`` (lists of records and :class:`Columns`), thinned only when
    there are more than ``max_records`` of them."""
    iterator = iter(chunks)
    head: list[Record] = []
    for chunk in iterator:
        head.extend(expand(chunk))
        if len(head) > max_records:
            break
    else:
        return head
    if window is None:
        window = max(16, max_records // 8)
    thinner = _Thinner(max_records, window)
    for record in head:
        thinner.record(record)
    for chunk in iterator:
        for item in chunk:
            if item.__class__ is Columns:
                thinner.columns(item)
            else:
                thinner.record(item)
    kept = thinner.kept()
    meta["thinned"] = {
        "kept": len(kept),
        "of": thinner.total,
        "stride": thinner.stride,
        "window": window,
        "first_nonfinite_index": thinner.first_bad,
    }
    return kept
