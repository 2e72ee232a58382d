"""track_dataloader / install: the dataset indices of the batch the loop holds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402

from nanscope.probes import rows  # noqa: E402

DATA = TensorDataset(torch.arange(20.0).reshape(20, 1))


def indices(x: torch.Tensor) -> list[int]:
    return x[:, 0].long().tolist()


def test_shuffled_loader_reports_each_batch_rows() -> None:
    loader = DataLoader(DATA, batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    tracker = rows.track_dataloader(loader)
    assert tracker is not None
    assert rows.track_dataloader(loader) is tracker
    assert isinstance(loader, DataLoader) and len(loader) == 5
    for _ in range(2):
        for (x,) in loader:
            assert tracker.current == indices(x) == rows.current_batch_index()
    assert tracker.batches == 10


def test_workers_prefetching_do_not_shift_the_rows() -> None:
    loader = DataLoader(DATA, batch_size=3, shuffle=True, num_workers=2)
    tracker = rows.track_dataloader(loader)
    assert tracker is not None
    for (x,) in loader:
        assert tracker.current == indices(x)


def test_install_tracks_every_loader_including_unbatched() -> None:
    rows.install()
    try:
        for (x,) in DataLoader(DATA, batch_size=5, shuffle=True):
            assert rows.current_batch_index() == indices(x)
        for (x,) in DataLoader(DATA, batch_size=None, shuffle=True):
            assert rows.current_batch_index() == [int(x[0])]
    finally:
        rows.uninstall()


def test_iterable_datasets_and_non_loaders_are_left_alone() -> None:
    class Stream(IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(torch.arange(6.0))

    assert rows.track_dataloader(DataLoader(Stream(), batch_size=2)) is None
    assert rows.track_dataloader([1, 2, 3]) is None


def test_a_loader_read_one_batch_ahead_still_names_the_batch_rows() -> None:
    import numpy as np

    loader = DataLoader(DATA, batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    assert rows.track_dataloader(loader) is not None
    it = iter(loader)
    ahead = next(it)
    for upcoming in it:  # like accelerate's DataLoaderShard: the next batch is already drawn
        (x,) = ahead
        assert rows.current_batch_index() != indices(x)  # the tracker is one batch ahead
        found = rows.current_batch_rows((x,), {})
        assert found is not None and np.asarray(found).tolist() == indices(x)
        ahead = upcoming


def test_rows_that_match_no_candidate_are_dropped_not_guessed() -> None:
    import numpy as np

    loader = DataLoader(DATA, batch_size=4)
    assert rows.track_dataloader(loader) is not None
    for (x,) in loader:
        found = rows.current_batch_rows((x + 100.0,), {})  # not the dataset's rows
        assert found is not None and np.asarray(found).size == 0
        break


def test_a_tracked_loader_is_left_as_it_was() -> None:
    """Nothing of the tracker is on the loader: it pickles, deep-copies and keeps its sampler's
    type after being read, as bare (a wrapper on it made an unpickled copy recurse forever)."""
    import copy
    import pickle

    from torch.utils.data import BatchSampler
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

    rows.install()
    try:
        loader = DataLoader(DATA, batch_size=4, shuffle=True)
        assert isinstance(iter(loader), _SingleProcessDataLoaderIter)
        for (x,) in loader:
            assert rows.current_batch_index() == indices(x)
        assert type(loader.batch_sampler) is BatchSampler and type(loader) is DataLoader
        assert vars(loader).keys() == vars(DataLoader(DATA, batch_size=4, shuffle=True)).keys()
        for other in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
            assert sorted(int(v) for (x,) in other for v in x[:, 0]) == list(range(20))
    finally:
        rows.uninstall()
