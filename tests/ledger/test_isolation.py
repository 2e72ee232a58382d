"""The suite never touches the user's own ledger or a ``.nanscope/`` folder outside its temp
folders (``tests/conftest.py`` points both at the session's own folder; at the end of the session
a run it recorded in the user's ledger fails the session)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import nanscope
from nanscope.ledger import Ledger, default_path

FIT = textwrap.dedent(
    """
    import numpy as np
    import nanscope

    X = np.random.default_rng(0).normal(size=(64, 3)) * np.array([1.0, 1.0, 30.0])
    y = X @ np.array([1.0, -2.0, 0.1])
    w = np.zeros(3)
    mon = nanscope.Monitor()
    for step in range(100):
        r = X @ w - y
        g = 2 * X.T @ r / len(y)
        mon.update(float(np.mean(r ** 2)), params={"w": w}, grads={"w": g}, lr=0.05)
        w = w - 0.05 * g
    """
)


def test_the_ledger_and_the_runs_point_into_the_sessions_folder() -> None:
    home = Path(os.environ["NANSCOPE_SUITE_HOME"])
    user = Path(os.environ["NANSCOPE_USER_LEDGER"])
    assert default_path().is_relative_to(home) and not user.is_relative_to(home)
    assert nanscope.Monitor(write=False).run_dir.is_relative_to(home)


def test_a_run_under_the_suite_leaves_the_users_ledger_and_folder_alone(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(FIT)
    user = Path(os.environ["NANSCOPE_USER_LEDGER"])
    done = subprocess.run([sys.executable, "-m", "nanscope", "run", "--", "python", str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 3, done.stderr
    with Ledger(default_path()) as ledger:  # the suite's own ledger has it
        assert ledger.runs(script)[0]["outcome"] == "step_size_too_large"
    assert not (tmp_path / ".nanscope").exists()  # the runs went to the suite's folder
    if user.exists():  # the user's: no row of this script (other programs may write to it)
        db = sqlite3.connect(f"file:{user}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT COUNT(*) FROM runs WHERE script = ?", (str(script),))
            assert rows.fetchone()[0] == 0
        finally:
            db.close()
