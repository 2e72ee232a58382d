"""Launching a two-rank job under torchrun for the distributed tests, and finding its run root."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(tmp_path: Path, entry: list[str], args: list[str], *, bound: float,
             strip: tuple[str, ...], **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``torchrun --nproc-per-node 2 ENTRY ARGS`` in ``tmp_path`` with nanscope's runs under
    ``tmp_path/runs``; environment variables starting with ``strip`` are not passed on, but for
    the suite's own ledger (the ranks never write to the user's)."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(strip) or k == "NANSCOPE_LEDGER"}  # fmt: skip
    environ.update(NANSCOPE_DIR=str(tmp_path / "runs"), OMP_NUM_THREADS="1", **env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *entry, *args]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=bound, env=environ,
                          cwd=tmp_path)
    return proc, time.monotonic() - started


def run_root(tmp_path: Path) -> Path:
    roots = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(roots) == 1, f"one run root for the whole job, got {roots}"
    return roots[0]
