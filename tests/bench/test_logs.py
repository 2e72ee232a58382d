"""The log bench runs: the whole command beside the reader, with its verdict line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a benchmark run (one round)

BENCH = Path(__file__).resolve().parents[2] / "bench" / "logs.py"


def test_whole_command_is_timed_beside_the_reader() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--formats", "", "--command-lines", "3000", "--rounds", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "nanscope diagnose" in out and "reader alone" in out
    assert "peak memory of the command" in out
    assert "whole-command target 500,000 lines/s (wall)" in out
