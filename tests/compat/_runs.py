"""Running the compatibility scripts bare and under ``nanscope run`` (see ``_zygote.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


class Zygote:
    """The process that forks the compatibility runs (``_zygote.py``): one per test worker."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
        env.pop("PYTHONWARNINGS", None)
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_zygote.py")], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env, cwd=HERE,
        )  # fmt: skip
        self._answer()  # ready

    def _answer(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the compat zygote ended (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self, jobs: list[dict[str, Any]]) -> list[int | None]:
        """Run the jobs at once (forks); their exit codes in order (None: killed on timeout)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(jobs) + "\n")
        self.proc.stdin.flush()
        codes: list[int | None] = self._answer()
        return codes

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Runs:
    """One script run bare and under ``nanscope run``: exit codes, stdout lines, stderr texts."""

    codes: dict[str, int | None]
    out: dict[str, list[str]]
    err: dict[str, str]
    folder: dict[str, Path]

    def diagnosis(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.folder["run"] / "d.json").read_text())
        return loaded


def run_both(zygote: Zygote, tmp_path: Path, name: str, text: str, args: list[str] = (),
             options: tuple[str, ...] = ()) -> Runs:  # fmt: skip
    """``python NAME ARGS`` and ``nanscope run --json d.json OPTIONS -- python NAME ARGS``, each
    in a folder of its own holding the script, both at once; one ledger for the test."""
    jobs, folders = [], {}
    for mode in ("bare", "run"):
        folder = folders[mode] = tmp_path / mode
        folder.mkdir()
        (folder / name).write_text(text)
        argv = [name, *args]
        if mode == "run":
            argv = ["run", "--json", "d.json", *options, "--", "python", *argv]
        jobs.append({
            "mode": mode, "cwd": str(folder), "argv": argv, "timeout": 150,
            "stdout": str(folder / "out.txt"), "stderr": str(folder / "err.txt"),
            "env": {"NANSCOPE_DIR": str(folder / "runs"),
                    "NANSCOPE_LEDGER": str(tmp_path / "ledger.db")},
        })  # fmt: skip
    codes = dict(zip(("bare", "run"), zygote.run(jobs)))
    out = {m: (f / "out.txt").read_text().splitlines() for m, f in folders.items()}
    err = {m: (f / "err.txt").read_text() for m, f in folders.items()}
    return Runs(codes, out, err, folders)
