from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _run_root(tmp_path, monkeypatch):
    """Every Monitor a test makes writes under its own tmp directory."""
    monkeypatch.setenv("NANSCOPE_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("NANSCOPE_POLICY", raising=False)
