"""The run ledger: round trips, migration from v1, concurrent writers, corrupt and locked files."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.cli import main
from nanscope.errors import InputError
from nanscope.ledger import (
    _V1,
    SCHEMA_VERSION,
    Ledger,
    default_path,
    file_hash,
    model_signature,
    record_diagnosis,
    remembered_line,
)


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('training')\n")
    return path


def _diverging_monitor() -> nanscope.Monitor:
    """A real least-squares fit with lr far too large, watched by a Monitor until it stops."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)) * np.array([1.0, 1.5, 2.0])
    y = x @ np.array([1.0, -2.0, 0.5])
    w = np.zeros(3)
    mon = nanscope.Monitor(write=False)
    with np.errstate(all="ignore"):
        try:
            for _ in range(200):
                r = x @ w - y
                g = 2 * x.T @ r / len(y)
                mon.update(float(np.mean(r**2)), params={"w": w}, grads={"w": g}, lr=1.0)
                w = w - 1.0 * g
        except nanscope.DivergenceError:
            pass
    return mon


def test_default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NANSCOPE_LEDGER", str(tmp_path / "x.db"))
    assert default_path() == tmp_path / "x.db"
    monkeypatch.delenv("NANSCOPE_LEDGER")
    if default_path().parts[-2:] == ("nanscope", "ledger.db"):
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
        import sys

        if sys.platform.startswith("linux"):
            assert default_path() == tmp_path / "data" / "nanscope" / "ledger.db"


def test_record_and_read_back(tmp_path: Path, script: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.ok
        first = ledger.record({"script": str(script), "outcome": "step_size_too_large",
                               "verdict": "diverging", "failed_at": 7, "lr": 1.0,
                               "started": 1000.0, "best_loss": float("nan"),
                               "rollbacks": 2})  # fmt: skip
        second = ledger.record({"script": str(script), "outcome": "healthy", "verdict": "healthy",
                                "lr": 0.1, "started": 2000.0, "optimizer": "SGD"})  # fmt: skip
        other = ledger.record({"script": str(tmp_path / "other.py"), "outcome": "healthy"})
        assert first and second and other
        assert ledger.count() == 3
        runs = ledger.runs(script)
        assert [r["id"] for r in runs] == [second, first]
        assert runs[1]["script_hash"] == file_hash(script)
        assert runs[1]["best_loss"] is None  # non-finite is stored as unknown
        assert runs[1]["rollbacks"] == 2  # unknown keys survive in extra
        assert ledger.last_for(script)["id"] == second  # type: ignore[index]
        assert ledger.set_sweep_lr(first, 0.1, factor=0.1, text="use 0.1")
        assert not ledger.set_sweep_lr("no-such-run", 0.1)
        again = {r["id"]: r for r in ledger.runs()}
        assert again[first]["sweep_lr"] == 0.1 and again[first]["sweep_text"] == "use 0.1"
        assert len(ledger.runs(limit=2)) == 2
    # a copy is another script (two train.py files are two scripts), even with the same bytes
    copy = tmp_path / "copy" / script.name
    copy.parent.mkdir()
    copy.write_text(script.read_text())
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.runs(copy) == []
    # a moved script (its old path gone) is still found by its content
    moved = tmp_path / "moved.py"
    script.rename(moved)
    with Ledger(tmp_path / "l.db") as ledger:
        assert len(ledger.runs(moved)) == 2


def _pragma(path: Path | str, name: str, every: bool = False) -> Any:
    """A ``PRAGMA`` read from the ledger's file by a connection of its own."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(f"PRAGMA {name}")
        return rows.fetchall() if every else rows.fetchone()
    finally:
        db.close()


def test_migration_from_v1(tmp_path: Path, script: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(_V1)
    db.execute(
        "INSERT INTO runs (id, started, script, outcome, failed_at, lr) VALUES (?, ?, ?, ?, ?, ?)",
        ("old-run", 123.0, str(script.resolve()), "step_size_too_large", 7, 1.0),
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with Ledger(path) as ledger:
        assert ledger.ok
        (version,) = _pragma(path, "user_version")  # the file on disk was migrated
        assert version == SCHEMA_VERSION == 2
        cols = {row[1] for row in _pragma(path, "table_info(runs)", every=True)}
        assert {"sweep_lr", "sweep_factor", "sweep_text"} <= cols
        (old,) = ledger.runs(script)
        assert old["id"] == "old-run" and old["failed_at"] == 7 and old["sweep_lr"] is None
        assert ledger.set_sweep_lr("old-run", 0.1)
        assert ledger.last_for(script)["sweep_lr"] == 0.1  # type: ignore[index]


def test_a_ledger_from_a_newer_nanscope_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.warns(RuntimeWarning, match="newer"):
        ledger = Ledger(path)
    assert not ledger.ok and ledger.record({"outcome": "healthy"}) is None


def _writer(path: str, worker: int, rows: int) -> None:
    ledger = Ledger(path, timeout=30)
    assert ledger.ok, ledger.problem
    for i in range(rows):
        assert ledger.record({"id": f"w{worker}-{i}", "script": "train.py", "outcome": "healthy",
                              "lr": 0.1 * worker, "failed_at": i})  # fmt: skip
    ledger.close()


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "busy.db")  # created by the writers themselves, all at once
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with Ledger(path) as ledger:
        assert ledger.count() == 100
        ids = {r["id"] for r in ledger.runs(limit=1000)}
        assert ids == {f"w{w}-{i}" for w in range(4) for i in range(25)}
    (mode,) = _pragma(path, "journal_mode")  # kept by the file itself
    assert mode == "wal"


def test_a_corrupt_ledger_never_stops_a_run(tmp_path: Path, script: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database at all\x00" * 200)
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        ledger = Ledger(path)
    assert not ledger.ok
    assert ledger.record({"outcome": "healthy"}) is None
    assert ledger.runs() == [] and ledger.last_for(script) is None
    assert not ledger.set_sweep_lr("x", 0.1)
    mon = _diverging_monitor()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert record_diagnosis(mon.diagnosis, mon, script, ledger=Ledger(path)) is None
    assert any("cannot be used" in str(w.message) for w in seen)
    with pytest.warns(RuntimeWarning):
        assert remembered_line(script, Ledger(path)) is None
    with pytest.raises(InputError):
        Ledger(path, strict=True)
    assert path.read_bytes().startswith(b"this is not a database")  # never overwritten


def test_a_locked_ledger_never_stops_a_run(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    with Ledger(path) as ok:
        assert ok.record({"id": "before", "outcome": "healthy"})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        ledger = Ledger(path, timeout=0.2)
        started = time.perf_counter()
        with pytest.warns(RuntimeWarning, match="locked"):
            assert ledger.record({"id": "during", "outcome": "healthy"}) is None
        assert time.perf_counter() - started < 5
        # a fresh, never-migrated ledger locked by someone else: same story
        fresh = tmp_path / "fresh.db"
        other = sqlite3.connect(fresh, isolation_level=None)
        other.execute("CREATE TABLE t (x)")
        other.execute("BEGIN EXCLUSIVE")
        with pytest.warns(RuntimeWarning):
            assert not Ledger(fresh, timeout=0.2).ok
        other.execute("ROLLBACK")
        other.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert ledger.ok is True  # it was only a busy moment: the next write goes through
    assert ledger.record({"id": "after", "outcome": "healthy"}) == "after"


def test_record_diagnosis_from_a_real_fit(tmp_path: Path, script: Path) -> None:
    mon = _diverging_monitor()
    diagnosis = mon.diagnosis
    assert diagnosis is not None and diagnosis.verdict != "healthy"
    text = "lr 1.0 diverged at update 5; 0.1 descended; use 0.1"
    diagnosis.extra["experiment"] = {"recommended_lr": 0.1, "recommended_factor": 0.1, "text": text}
    ledger = Ledger(tmp_path / "l.db")
    run_id = record_diagnosis(diagnosis, mon, script, ledger=ledger, optimizer="numpy GD")
    assert run_id == mon.run_id
    row = ledger.last_for(script)
    assert row is not None
    assert row["outcome"] == diagnosis.cause and row["verdict"] == diagnosis.verdict
    assert row["failed_at"] == diagnosis.step
    losses = [r["loss"] for r in mon.trace.records if np.isfinite(r["loss"])]
    assert row["best_loss"] == pytest.approx(min(losses))
    assert row["lr"] == 1.0 and row["optimizer"] == "numpy GD"
    assert row["model_text"] == "1 tensors, 3 values: w[3]"
    assert row["model_signature"] == model_signature({"w": np.zeros(3)})[0]  # type: ignore[index]
    assert row["sweep_lr"] == 0.1 and row["duration"] >= 0
    line = remembered_line(script, ledger)
    assert line is not None
    assert line.startswith("previous run of train.py (")
    tail = f"): {diagnosis.cause} at update {diagnosis.step} with lr 1.0; lr 0.1 worked"
    assert line.endswith(tail)
    script.write_text("print('changed')\n")
    assert (remembered_line(script, ledger) or "").endswith("(the script has changed since)")
    assert remembered_line(tmp_path / "never_run.py", ledger) is None


class _Module:
    """Duck-typed like a torch module (importing torch costs seconds): named_parameters()."""

    def __init__(self, out: int) -> None:
        self.params = {"weight": np.zeros((out, 4)), "bias": np.zeros(out)}

    def named_parameters(self) -> list[tuple[str, np.ndarray]]:
        return list(self.params.items())


def test_model_signature_of_a_module() -> None:
    sig = model_signature(_Module(2))
    assert sig is not None
    assert sig[1] == "2 tensors, 10 values: weight[2x4], bias[2]"
    assert sig[0] == model_signature(_Module(2))[0]  # type: ignore[index]
    assert sig[0] != model_signature(_Module(3))[0]  # type: ignore[index]
    assert model_signature(object()) is None


def test_no_ledger_env_turns_it_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NANSCOPE_LEDGER", str(tmp_path / "l.db"))
    monkeypatch.setenv("NANSCOPE_NO_LEDGER", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ledger = Ledger()
    assert not ledger.ok and not (tmp_path / "l.db").exists()


def test_history_command(
    tmp_path: Path,
    script: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "l.db"
    monkeypatch.setenv("NANSCOPE_LEDGER", str(path))
    assert main(["history"]) == 0
    assert "no runs in the ledger" in capsys.readouterr().out
    with Ledger() as ledger:
        ledger.record({"script": str(script), "outcome": "step_size_too_large", "failed_at": 7,
                       "lr": 1.0, "sweep_lr": 0.1, "optimizer": "SGD", "started": 1e9})  # fmt: skip
        ledger.record({"script": str(tmp_path / "b.py"), "outcome": "healthy", "started": 2e9})
    assert main(["history"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["started", "script", "outcome"]
    assert "b.py" in out[1] and "train.py" in out[2]
    assert "step_size_too_large" in out[2] and "0.1" in out[2] and "SGD" in out[2]
    assert main(["history", str(script)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "train.py" in lines[1]
    assert main(["history", "--json", "-"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert [r["outcome"] for r in data["runs"]] == ["healthy", "step_size_too_large"]
    assert main(["history", "--limit", "0"]) == 2
    path.write_bytes(b"garbage" * 100)
    (tmp_path / "l.db-wal").unlink(missing_ok=True)
    (tmp_path / "l.db-shm").unlink(missing_ok=True)
    assert main(["history"]) == 2
    assert "cannot be used" in capsys.readouterr().err


def test_a_warm_up_schedule_records_its_peak_lr(tmp_path: Path, script: Path) -> None:
    # a real least-squares fit whose lr warms up from 1e-5 to 0.05 over 20 updates, then decays
    rng = np.random.default_rng(3)
    X = rng.normal(size=(128, 4))
    y = X @ np.array([1.0, -0.5, 2.0, 0.3])
    w = np.zeros(4)
    mon = nanscope.Monitor(run_dir=tmp_path / "run")
    for step in range(60):
        lr = 0.05 * min(1.0, max(step, 0.0002) / 20) * 0.98 ** max(0, step - 20)
        r = X @ w - y
        g = 2 * X.T @ r / len(y)
        mon.update(float(np.mean(r**2)), params={"w": w}, grads={"w": g}, lr=lr)
        w = w - lr * g
    diagnosis = mon.close()
    assert diagnosis.verdict == "healthy"
    lrs = [r["lr"] for r in mon.trace.records]
    assert lrs[0] < 1e-4 and lrs[-1] < 0.05  # neither the first nor the last is the peak
    ledger = Ledger(tmp_path / "l.db")
    assert record_diagnosis(diagnosis, mon, script, ledger=ledger) is not None
    row = ledger.last_for(script)
    assert row is not None and row["lr"] == pytest.approx(0.05)
