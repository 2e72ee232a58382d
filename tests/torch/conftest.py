from __future__ import annotations

import pytest

pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _run_root(tmp_path, monkeypatch):
    monkeypatch.setenv("NANSCOPE_DIR", str(tmp_path / "runs"))
    yield
    from nanscope.torch import _hooks

    for watcher in _hooks.live_watchers():
        watcher.close()
