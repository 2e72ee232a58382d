"""The whole suite runs away from the user's own files.

Before any test, ``NANSCOPE_LEDGER`` and ``NANSCOPE_DIR`` point into one temporary folder for the
session (the xdist workers and every subprocess a test starts inherit them), so no test writes to
the user's run ledger or to a ``.nanscope/`` folder of the directory it runs in.
``tests/ledger/test_isolation.py`` proves it with real runs; at the end of the session the user's
ledger is read (read-only) and a run this suite recorded there fails the session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from nanscope.ledger import default_path

#: set once, in the process that starts the session; the xdist workers inherit it
_MARK = "NANSCOPE_SUITE_HOME"
ROOT = Path(__file__).resolve().parent.parent

#: the ledger nanscope would use outside the suite (as the user's environment says)
USER_LEDGER = default_path()

_HOME = pytest.StashKey[Path]()
_STARTED = pytest.StashKey[float]()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(_MARK):
        return  # an xdist worker: the session's controller already chose the folder
    home = Path(tempfile.mkdtemp(prefix="nanscope-suite-"))
    config.stash[_HOME] = home
    config.stash[_STARTED] = time.time()
    os.environ[_MARK] = str(home)
    os.environ["NANSCOPE_USER_LEDGER"] = str(USER_LEDGER)  # for test_isolation.py
    os.environ["NANSCOPE_LEDGER"] = str(home / "ledger.db")
    os.environ["NANSCOPE_DIR"] = str(home / "runs")


@pytest.fixture(autouse=True, scope="session")
def _no_terminal_width() -> None:
    """Reports fit ``$COLUMNS`` when it is set, and pytest's workers set it to 80: a test that
    reads a report sees whole lines unless it sets the width itself."""
    os.environ.pop("COLUMNS", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    home = config.stash.get(_HOME, None)
    if home is None:
        return  # a worker
    leaked = _recorded_by_this_suite(config.stash[_STARTED], home, config)
    if leaked:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        text = (
            f"the suite recorded {len(leaked)} run(s) in the user's ledger {USER_LEDGER}, "
            f"e.g. {leaked[0]}: a test ran nanscope without the suite's NANSCOPE_LEDGER"
        )
        if reporter is not None:
            reporter.write_line(f"ERROR: {text}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


def _recorded_by_this_suite(started: float, home: Path, config: pytest.Config) -> list[str]:
    """Scripts of the runs recorded in the user's ledger since the session started whose file
    lies in this checkout's tests or in this session's temporary folders (other programs using
    the same ledger meanwhile are not this suite's doing)."""
    if not USER_LEDGER.is_file():
        return []
    roots = [str(ROOT / "tests"), str(home)]
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is not None:
        with contextlib.suppress(OSError):
            roots.append(str(factory.getbasetemp()))
    try:
        db = sqlite3.connect(f"file:{USER_LEDGER}?mode=ro", uri=True, timeout=5)
        try:
            rows = db.execute(
                "SELECT script FROM runs WHERE started >= ?", (started - 1,)
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []
    return [str(s) for (s,) in rows if s and any(str(s).startswith(r) for r in roots)]


@pytest.fixture(autouse=True)
def _ctrl_c_left_as_it_was() -> Any:
    """nanscope sets a SIGINT handler only while a script runs: a test after which it differs
    has found code that leaves it behind (a Ctrl-C the next script never sees). (SIGTERM is
    armed once per process on purpose: the traces are flushed, then the process dies of it.)"""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, before)
    assert after is before, f"the SIGINT handler was left changed: {after!r}"


@pytest.fixture
def ctrl_c() -> Any:
    """Ctrl-C as a foreground terminal delivers it: a test started in the background (``cmd &``)
    inherits SIGINT ignored, and a raised SIGINT would never become a KeyboardInterrupt."""
    import signal

    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield lambda: signal.raise_signal(signal.SIGINT)
    signal.signal(signal.SIGINT, saved)
