from __future__ import annotations

import pytest

pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _run_root(tmp_path, monkeypatch):
    monkeypatch.setenv("NANSCOPE_DIR", str(tmp_path / "runs"))
    yield
    from nanscope.torch._hooks import live_watchers

    for watcher in live_watchers():
        watcher.close()


@pytest.fixture(autouse=True)
def _first_update_watch_not_broken():
    """A fault in the first-update op watch turns it off for the whole process (by design), so
    a test that faults it would silently change every later test in the same worker."""
    yield
    from nanscope.probes import producer

    fault = producer.FIRST_UPDATE_WATCH.fault
    producer.FIRST_UPDATE_WATCH.broken, producer.FIRST_UPDATE_WATCH.fault = False, None
    assert fault is None, f"the first-update op watch faulted: {fault}"
