"""Keep a very long trace small without losing what the rules look at.

:func:`thin` streams records and keeps at most about ``max_records`` of them:

- the ``window`` records just before the first non-finite one and the ``window`` from it on, at
  full resolution (the growth phase before a NaN is what tells the causes apart);
- later records that are non-finite or carry ``events`` (halved if they alone outgrow the
  budget);
- elsewhere every ``stride``-th record, where ``stride`` doubles each time the kept list would
  outgrow ``max_records`` (old strided records are halved to match).

Steps keep their logged numbers, so gaps show. ``meta["thinned"]`` says what was done.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from typing import Any

from nanscope.logs._common import Record


def _flagged(record: Record) -> bool:
    return bool(record.get("nf_loss") or record.get("nf_grads") or record.get("events"))


def thin(
    records: Iterable[Record], max_records: int, meta: dict[str, Any], window: int | None = None
) -> list[Record]:
    """The records, thinned only when there are more than ``max_records`` of them."""
    iterator = iter(records)
    head: list[Record] = []
    for record in iterator:
        head.append(record)
        if len(head) > max_records:
            break
    else:
        return head
    if window is None:
        window = max(16, max_records // 8)
    budget = max(4, max_records - 2 * window)
    strided: list[tuple[int, Record]] = []  # (index, record) kept at the current stride
    critical: list[tuple[int, Record]] = []  # around the first non-finite: always kept
    protected: list[tuple[int, Record]] = []  # later non-finite records
    ring: deque[tuple[int, Record]] = deque(maxlen=window)
    stride = 1
    first_bad: int | None = None
    total = 0
    for index, record in enumerate(itertools.chain(head, iterator)):
        total += 1
        flagged = _flagged(record)
        if first_bad is None and flagged:
            first_bad = index
            critical.extend(ring)
            ring.clear()
        if first_bad is not None and index - first_bad < window:
            critical.append((index, record))
            continue
        if flagged:
            protected.append((index, record))
            if len(protected) > budget // 2:  # non-finite everywhere: halve those too
                protected = protected[::2]
            continue
        if first_bad is None:
            ring.append((index, record))
        if index % stride == 0:
            strided.append((index, record))
            if len(strided) > budget:
                stride *= 2
                strided = [item for item in strided if item[0] % stride == 0]
    merged = sorted({i: r for i, r in [*strided, *protected, *critical, *ring]}.items())
    meta["thinned"] = {
        "kept": len(merged),
        "of": total,
        "stride": stride,
        "window": window,
        "first_nonfinite_index": first_bad,
    }
    return [r for _, r in merged]
