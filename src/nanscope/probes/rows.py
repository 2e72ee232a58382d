"""Which dataset rows a batch holds: follow a DataLoader's sampler, batch by batch.

A bad row is only useful to a user as a row of *their data*. A ``DataLoader`` knows which dataset
indices it put in each batch (its sampler draws them), but forgets them at once. Tracking keeps the
indices of the batch the loader handed out last, for the price of one list per batch::

    tracker = nanscope.probes.rows.track_dataloader(loader)
    for x, y in loader:
        ...
        tracker.current          # dataset indices of (x, y), in row order
        current_batch_index()    # the same, from whichever tracked loader yielded last

With ``num_workers > 0`` the sampler runs ahead of the batches (prefetching); the tracker queues
the indices it saw drawn and pops one list per batch *yielded*, so ``current`` is the batch the
training loop holds, not the one being prefetched. A loader read one batch ahead by its caller
(accelerate's ``DataLoaderShard``) is another matter: :func:`current_batch_rows` keeps the last
few index sets and picks, only when read, the one whose dataset rows equal the batch's rows.
Iterable-style datasets have no indices: ``current`` stays ``None``. ``install()`` does the
same for every DataLoader of the process (``nanscope run``); ``uninstall()`` undoes it.

Nothing is put on the loader, its sampler or its iterator: the indices are read where torch's
loader iterator draws them (``_next_index``) and yields a batch (``__next__``), patched once for
the process, so a tracked loader pickles, copies and answers ``isinstance`` as it does bare.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import deque
from typing import Any

from nanscope.probes._tensors import tensors

__all__ = ["BatchRows", "LoaderTracker", "current_batch_index", "current_batch_rows", "install",
           "suspect_batch_rows", "track_dataloader", "uninstall"]  # fmt: skip

_last: dict[str, Any] = {"index": None, "tracker": None}
#: index sets kept per tracker: a loader that prefetches (accelerate's DataLoaderShard, Lightning's
#: fetcher) has already yielded the next batch when the model runs on this one
KEEP = 4
#: rows of a candidate index set compared with the batch before it is believed
CHECK_ROWS = 3
_patched: dict[str, Any] = {}
_lock = threading.Lock()
#: the tracker of each tracked loader, and of each loader iterator made from one
_trackers: weakref.WeakKeyDictionary[Any, LoaderTracker] = weakref.WeakKeyDictionary()
_iterators: weakref.WeakKeyDictionary[Any, LoaderTracker] = weakref.WeakKeyDictionary()
#: the tracker of the iterator being made on this thread (it draws its first indices as it is
#: made, before it can be looked up) and whether every loader is tracked (:func:`install`)
_state = threading.local()
_every = {"on": False}


def current_batch_index() -> list[int] | None:
    """Dataset indices of the batch most recently yielded by any tracked DataLoader."""
    index = _last["index"]
    return list(index) if index is not None else None


def current_batch_rows(args: Any = (), kwargs: Any = None) -> BatchRows | None:
    """The dataset rows of the batch the model now runs on (``args``/``kwargs``), verified lazily.

    The last :data:`KEEP` index sets of the loader that yielded last are candidates; nothing is
    compared until the rows are read (``numpy.asarray(rows)``, only after something fired).
    """
    tracker = _last["tracker"]
    if tracker is None or not tracker.recent:
        return None
    return BatchRows(list(tracker.recent), tracker.dataset, args, kwargs or {})


class BatchRows:
    """Candidate index sets of one batch; ``numpy.asarray`` gives the one its data matches.

    A candidate is believed when ``dataset[i]`` equals the batch's row for its first, middle and
    last rows (each tensor of the dataset item that has a batch tensor of its row size must equal
    one of them at that row, NaN equal to NaN, and at least one must be compared). No candidate
    matches, or the items cannot be compared: an empty array, so the rows carry no
    ``dataset_row`` rather than a wrong one.
    """

    def __init__(self, candidates: list[list[int]], dataset: Any, args: Any, kwargs: Any) -> None:
        self.candidates = candidates[::-1]  # newest first
        self.dataset = dataset
        self.args = args
        self.kwargs = kwargs
        self._resolved: list[int] | None = None
        self._done = False

    def resolve(self) -> list[int] | None:
        if not self._done:
            self._done = True
            try:
                self._resolved = self._match()
            except Exception:
                self._resolved = None
        return self._resolved

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        import numpy as np

        found = self.resolve()
        return np.asarray(found if found is not None else [], dtype=dtype or np.int64)

    def _match(self) -> list[int] | None:
        import torch

        batch = [t for t in tensors((self.args, self.kwargs)) if t.dim() >= 1]
        if not batch or self.dataset is None:
            return None
        for cand in self.candidates:
            n = len(cand)
            rows = [t for t in batch if t.shape[0] == n]
            if not rows or not n:
                continue
            ok = True
            for j in sorted({0, n // 2, n - 1})[:CHECK_ROWS]:
                item = [torch.as_tensor(t) for t in tensors(self.dataset[cand[j]], items=True)]
                compared = 0
                for t in item:
                    alike = [b for b in rows if b[j].numel() == t.numel()]
                    if not alike:
                        continue  # e.g. the target, which the model's forward does not receive
                    compared += 1
                    if not any(_same(t, b[j]) for b in alike):
                        ok = False
                        break
                if not ok or not compared:
                    ok = False
                    break
            if ok:
                return list(cand)
        return None


def _same(item: Any, row: Any) -> bool:
    import torch

    if item.numel() != row.numel():
        return False
    a = item.detach().reshape(-1).to(torch.float64)
    b = row.detach().reshape(-1).cpu().to(torch.float64)
    return bool(torch.allclose(a, b, rtol=1e-6, atol=0.0, equal_nan=True))


class LoaderTracker:
    """The dataset indices of the batch a DataLoader yielded last (``current``)."""

    def __init__(self, dataset: Any = None) -> None:
        self._drawn: deque[list[int]] = deque()
        self.current: list[int] | None = None
        self.batches = 0
        self.dataset = dataset
        #: the last KEEP index sets yielded, oldest first
        self.recent: deque[list[int]] = deque(maxlen=KEEP)

    def _yielded(self) -> None:
        self.batches += 1
        self.current = self._drawn.popleft() if self._drawn else None
        if self.current is not None:
            self.recent.append(self.current)
        _last["index"] = self.current
        _last["tracker"] = self

    def _reset(self) -> None:
        self._drawn.clear()
        self.recent.clear()


def _tracker_for(loader: Any, make: bool) -> LoaderTracker | None:
    """The loader's tracker; a new one when ``make`` (None for a loader without indices)."""
    tracker = _trackers.get(loader)
    if tracker is not None or not make:
        return tracker
    if type(getattr(loader, "dataset", None)).__name__ == "IterableDataset" or getattr(
        loader, "_dataset_kind", 0
    ) == 1:
        return None
    tracker = LoaderTracker(getattr(loader, "dataset", None))
    _trackers[loader] = tracker
    return tracker


def _drawn(iterator: Any, index: Any) -> None:
    tracker = _iterators.get(iterator) or getattr(_state, "building", None)
    if tracker is not None:
        batched = getattr(iterator, "_auto_collation", isinstance(index, list))
        tracker._drawn.append(list(index) if batched else [index])


def _patch() -> None:
    """torch's loader iterator reports the indices it draws and the batches it yields to the
    tracker of its loader (once per process; without a tracker they pass through)."""
    from torch.utils.data import DataLoader
    from torch.utils.data import dataloader as dataloader_mod

    if "iter" in _patched:
        return
    base = dataloader_mod._BaseDataLoaderIter
    next_index, next_batch, make_iter = base._next_index, base.__next__, DataLoader.__iter__

    def _next_index(self: Any) -> Any:
        index = next_index(self)
        with contextlib.suppress(Exception):
            _drawn(self, index)
        return index

    def __next__(self: Any) -> Any:
        batch = next_batch(self)
        tracker = _iterators.get(self)
        if tracker is not None:
            with contextlib.suppress(Exception):
                tracker._yielded()
        return batch

    def __iter__(self: Any) -> Any:
        try:
            tracker = _tracker_for(self, _every["on"])
        except Exception:
            tracker = None
        if tracker is None:
            return make_iter(self)
        tracker._reset()
        _state.building = tracker
        try:
            iterator = make_iter(self)
        finally:
            _state.building = None
        with contextlib.suppress(TypeError):
            _iterators[iterator] = tracker
        return iterator

    _patched.update(iter=make_iter, next=next_batch, next_index=next_index)
    base._next_index = _next_index  # type: ignore[method-assign]
    base.__next__ = __next__  # type: ignore[method-assign]
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]


def track_dataloader(loader: Any) -> LoaderTracker | None:
    """Record the dataset indices of every batch ``loader`` yields; returns the tracker.

    Safe to call more than once (the same tracker comes back) and on anything: a loader whose
    batches have no indices (iterable datasets) or a non-DataLoader returns ``None``.
    """
    try:
        with _lock:
            if not hasattr(loader, "_get_iterator"):
                return None
            tracker = _tracker_for(loader, True)
            if tracker is not None:
                _patch()
            return tracker
    except Exception:
        return None


def install() -> None:
    """Track every ``torch.utils.data.DataLoader`` of the process from its first iteration."""
    with _lock:
        _patch()
        _every["on"] = True


def uninstall() -> None:
    """Undo :func:`install`: loaders not tracked yet stay untracked (the ones tracked keep their
    trackers)."""
    with _lock:
        _every["on"] = False


def suspect_batch_rows(rows: Any) -> list[int]:
    """The batch rows the rows probe named non-finite or extreme (a trace record's ``rows``
    entries), each once, in order: the first 64, the rows a rerun leaves out."""
    out: list[int] = []
    for row in rows or []:
        if not isinstance(row, dict) or row.get("why") not in ("nan", "inf", "extreme"):
            continue
        b = row.get("batch_row")
        if isinstance(b, int) and b not in out:
            out.append(b)
    return out[:64]
