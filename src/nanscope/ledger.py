"""The run ledger: one SQLite row per run, so the next run does not rediscover the step size.

::

    ledger = Ledger()                      # $NANSCOPE_LEDGER, else the user's data directory
    run_id = record_diagnosis(diagnosis, monitor, script="train.py")
    ledger.set_sweep_lr(run_id, 0.1)       # what `nanscope run --experiment` found
    remembered_line("train.py")            # "previous run of train.py (2026-12-02 15:10): ..."

Where: ``$NANSCOPE_LEDGER`` if set, else ``$XDG_DATA_HOME/nanscope/ledger.db`` (default
``~/.local/share``) on Linux, ``~/Library/Application Support/nanscope/ledger.db`` on macOS,
``%LOCALAPPDATA%\\nanscope\\ledger.db`` on Windows. ``NANSCOPE_NO_LEDGER=1`` turns it off (the
sweep's child processes run with it).

Robustness: WAL journal, a busy timeout, and one short ``BEGIN IMMEDIATE`` transaction per write, so
several processes can record at once and lose nothing. A ledger that is corrupt, locked for longer
than the timeout, unwritable or from a newer nanscope never stops a training run: the first problem
is reported once as a ``RuntimeWarning`` and the run goes on without it (``strict=True`` raises
:class:`~nanscope.errors.InputError` instead; ``nanscope history`` uses that).

Schema: versioned with ``PRAGMA user_version``. A new database is created at version 1 and migrated
step by step like an old one, so every migration runs on every new ledger:

* v1: ``runs`` (id, started, script, script_hash, model_signature, model_text, optimizer, lr,
  outcome, verdict, failed_at, best_loss, duration, extra)
* v2: adds ``sweep_lr``, ``sweep_factor``, ``sweep_text`` (what the lr sweep found) and an index on
  ``(script, started)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import sqlite3
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nanscope.diagnose.verdict import is_inconclusive
from nanscope.errors import InputError
from nanscope.formatting import lr as format_lr

__all__ = [
    "SCHEMA_VERSION",
    "Ledger",
    "default_path",
    "file_hash",
    "local_time",
    "model_signature",
    "record_diagnosis",
    "remembered_line",
]

SCHEMA_VERSION = 2

_V1 = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    started REAL NOT NULL,
    script TEXT,
    script_hash TEXT,
    model_signature TEXT,
    model_text TEXT,
    optimizer TEXT,
    lr REAL,
    outcome TEXT,
    verdict TEXT,
    failed_at INTEGER,
    best_loss REAL,
    duration REAL,
    extra TEXT
)
"""


def _v1_to_v2(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE runs ADD COLUMN sweep_lr REAL")
    db.execute("ALTER TABLE runs ADD COLUMN sweep_factor REAL")
    db.execute("ALTER TABLE runs ADD COLUMN sweep_text TEXT")
    db.execute("CREATE INDEX IF NOT EXISTS runs_script_started ON runs (script, started)")


#: version -> the migration that takes a ledger from that version to the next
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2}

COLUMNS = (
    "id", "started", "script", "script_hash", "model_signature", "model_text", "optimizer", "lr",
    "outcome", "verdict", "failed_at", "best_loss", "duration", "sweep_lr", "sweep_factor",
    "sweep_text",
)  # fmt: skip


def default_path() -> Path:
    """``$NANSCOPE_LEDGER``, else ``ledger.db`` in the user's data directory for nanscope."""
    env = os.environ.get("NANSCOPE_LEDGER")
    if env:
        return Path(env).expanduser()
    home = Path.home()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.environ.get("APPDATA")
        root = Path(base) if base else home / "AppData" / "Local"
    elif sys.platform == "darwin":
        root = home / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        root = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".local" / "share"
    return root / "nanscope" / "ledger.db"


def file_hash(path: str | os.PathLike[str]) -> str | None:
    """sha256 of a file's bytes, or ``None`` when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 16), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def model_signature(model: Any) -> tuple[str, str] | None:
    """``(hash, short text)`` of a model's parameter names and shapes.

    ``model``: a PyTorch module (anything with ``named_parameters()``), or a mapping
    ``{name: array}``. The hash is the first 16 hex digits of a sha256 over ``name:shape`` lines;
    the text is e.g. ``"2 tensors, 5 values: weight[1x4], bias[1]"`` (cut at 200 characters).
    """
    items: list[tuple[str, tuple[int, ...]]] = []
    if hasattr(model, "named_parameters"):
        pairs = list(model.named_parameters())
    elif isinstance(model, Mapping):
        pairs = list(model.items())
    else:
        return None
    for name, value in pairs:
        shape = getattr(value, "shape", None)
        items.append((str(name), tuple(int(s) for s in shape) if shape is not None else ()))
    if not items:
        return None
    lines = "\n".join(f"{n}:{'x'.join(map(str, s))}" for n, s in items)
    digest = hashlib.sha256(lines.encode()).hexdigest()[:16]
    count = sum(math.prod(s) for _, s in items)
    parts = ", ".join(f"{n}[{'x'.join(map(str, s)) or 'scalar'}]" for n, s in items)
    text = f"{len(items)} tensors, {count} values: {parts}"
    if len(text) > 200:
        text = text[:197] + "..."
    return digest, text


def _abs(script: str | os.PathLike[str]) -> str:
    try:
        return str(Path(script).expanduser().resolve())
    except OSError:
        return str(Path(script).absolute())


class Ledger:
    """The SQLite run ledger. Every method is safe to call when the ledger could not be opened:
    writes then return ``None``/``False`` and reads return nothing (``.ok`` says which it is).

    path: the database file (default :func:`default_path`). timeout: seconds to wait for another
    process's lock before giving up on one operation. strict: raise
    :class:`~nanscope.errors.InputError` instead of warning.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 5.0,
        strict: bool = False,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.timeout = float(timeout)
        self.strict = strict
        self.problem: str | None = None
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._warned = False
        if path is None and os.environ.get("NANSCOPE_NO_LEDGER"):
            self.problem = "turned off by NANSCOPE_NO_LEDGER"
            return
        try:
            self._open()
        except (sqlite3.Error, OSError) as exc:
            self._fail(exc, "open")

    @property
    def ok(self) -> bool:
        return self._db is not None

    # ------------------------------------------------------------------ opening

    def _open(self) -> None:
        if self.path.is_dir():
            raise sqlite3.DatabaseError(f"{self.path} is a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(
            str(self.path), timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        try:
            db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                # another process holds the database in a mode that blocks the switch; go on
                pass
            self._migrate(db)
        except BaseException:
            db.close()
            raise
        self._db = db

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"ledger schema v{version} is newer than this nanscope understands "
                f"(v{SCHEMA_VERSION}); upgrade nanscope"
            )
        db.execute("BEGIN IMMEDIATE")
        try:
            # another process may have migrated while we waited for the lock
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version == 0:
                tables = db.execute(
                    "SELECT name FROM sqlite_master WHERE type='table' AND name='runs'"
                ).fetchall()
                if not tables:
                    db.execute(_V1)
                version = 1
                db.execute("PRAGMA user_version = 1")
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](db)
                version += 1
                db.execute(f"PRAGMA user_version = {version}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _fail(self, exc: BaseException, what: str) -> None:
        self.problem = f"{type(exc).__name__}: {exc}"
        if self.strict:
            raise InputError(f"the run ledger {self.path} cannot be used ({exc})") from exc
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"nanscope: the run ledger {self.path} cannot be used ({what}: {exc}); the run "
                "goes on without it (set NANSCOPE_LEDGER to use another file)",
                RuntimeWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing

    def _write(self, sql: str, params: tuple[Any, ...] | dict[str, Any], what: str) -> int | None:
        if self._db is None:
            return None
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    count = self._db.execute(sql, params).rowcount
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                return int(count)
            except (sqlite3.Error, OSError) as exc:
                self._fail(exc, what)
                return None

    def record(self, run: Mapping[str, Any]) -> str | None:
        """Add (or replace, same ``id``) one run; returns its id, ``None`` if it was not stored.

        Keys: ``id`` (made up when missing), ``started`` (epoch seconds, default now), ``script``
        (stored as an absolute path; ``script_hash`` is computed from the file when missing;
        a ``module`` key with no ``script`` -- a ``python -m`` run -- is stored by module name),
        ``model_signature``, ``model_text``, ``optimizer``, ``lr``, ``outcome`` (the cause, or
        ``"healthy"``), ``verdict``, ``failed_at``, ``best_loss``, ``duration``, ``sweep_lr``,
        ``sweep_factor``, ``sweep_text``. Any other key is kept in a JSON ``extra`` column.
        """
        row = {k: run.get(k) for k in COLUMNS}
        row["id"] = str(row["id"] or time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3))
        row["started"] = float(row["started"] if row["started"] is not None else time.time())
        if row["script"] is None and run.get("module"):
            # a `python -m pkg.train` run: the module name is what identifies it
            row["script"] = str(run["module"])
        elif row["script"] is not None:
            script = str(row["script"])
            row["script"] = _abs(script)
            if row["script_hash"] is None:
                row["script_hash"] = file_hash(script)
        for key in ("lr", "best_loss", "duration", "sweep_lr", "sweep_factor"):
            row[key] = _real(row[key])
        if row["failed_at"] is not None:
            row["failed_at"] = int(row["failed_at"])
        extra = {k: v for k, v in run.items() if k not in COLUMNS}
        row["extra"] = json.dumps(extra, default=str) if extra else None
        names = [*COLUMNS, "extra"]
        sql = (
            f"INSERT OR REPLACE INTO runs ({', '.join(names)}) "
            f"VALUES ({', '.join(':' + n for n in names)})"
        )
        return row["id"] if self._write(sql, row, "record a run") else None

    def set_sweep_lr(
        self, run_id: str, lr: float | None, *, factor: float | None = None, text: str | None = None
    ) -> bool:
        """Store the lr a sweep found for a run; ``False`` if there is no such run or ledger."""
        count = self._write(
            "UPDATE runs SET sweep_lr = ?, sweep_factor = ?, sweep_text = ? WHERE id = ?",
            (_real(lr), _real(factor), text, str(run_id)),
            "store the sweep's lr",
        )
        return bool(count)

    # ------------------------------------------------------------------ reading

    def runs(self, script: str | os.PathLike[str] | None = None, limit: int = 50) -> list[dict]:
        """Runs, newest first; with ``script``, only that script's: the same absolute path (or
        module name), or -- a moved script keeps its history -- a run of a file with the same
        content whose recorded path no longer exists. Two files that both exist are two
        scripts, even with the same name or the same content."""
        if self._db is None:
            return []
        query = f"SELECT {', '.join(COLUMNS)}, extra FROM runs"
        params: list[Any] = []
        path = digest = None
        if script is not None:
            path = _abs(script)
            query += " WHERE script = ? OR script = ?"
            params.extend([path, str(script)])
            digest = file_hash(script)
            if digest is not None:
                query += " OR script_hash = ?"
                params.append(digest)
        query += " ORDER BY started DESC, rowid DESC"
        if digest is None:
            query += " LIMIT ?"
            params.append(int(limit))
        with self._lock:
            try:
                rows = self._db.execute(query, params).fetchall()
            except sqlite3.Error as exc:
                self._fail(exc, "read")
                return []
        out = []
        for values in rows:
            row = dict(zip([*COLUMNS, "extra"], values))
            other_path = digest is not None and row["script"] not in (path, str(script))
            # same content at another path: the same script only if it moved from there
            if other_path and (row["script"] is None or Path(str(row["script"])).exists()):
                continue
            extra = row.pop("extra")
            if extra:
                with contextlib.suppress(ValueError):
                    row.update({k: v for k, v in json.loads(extra).items() if k not in row})
            out.append(row)
            if len(out) >= int(limit):
                break
        return out

    def last_for(self, script_path: str | os.PathLike[str]) -> dict[str, Any] | None:
        """The newest run of a script, or ``None``."""
        found = self.runs(script_path, limit=1)
        return found[0] if found else None

    def count(self) -> int:
        if self._db is None:
            return 0
        with self._lock:
            try:
                return int(self._db.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
            except sqlite3.Error as exc:
                self._fail(exc, "read")
                return 0


def _real(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# ---------------------------------------------------------------------- helpers for `run`


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    value = getattr(obj, key, default)
    if value is default and hasattr(obj, "extra") and isinstance(obj.extra, Mapping):
        return obj.extra.get(key, default)
    return value


def _optimizer(optimizer: Any) -> tuple[str | None, float | None]:
    if optimizer is None:
        return None, None
    if isinstance(optimizer, str):
        return optimizer, None
    lr = None
    groups = getattr(optimizer, "param_groups", None)
    if groups:
        lr = _real(groups[0].get("lr"))
    return type(optimizer).__name__, lr


def record_diagnosis(
    diagnosis: Any,
    monitor: Any = None,
    script: str | os.PathLike[str] | None = None,
    *,
    ledger: Ledger | None = None,
    model: Any = None,
    optimizer: Any = None,
    lr: float | None = None,
    duration: float | None = None,
    **extra: Any,
) -> str | None:
    """Record a finished run from its diagnosis (and Monitor); returns the run id or ``None``.

    Takes what it can from each: the outcome (cause, or ``"healthy"``), verdict, failing update and
    the ``experiment`` field from the diagnosis; the run id, start, best loss, lr and weights' names
    and shapes from the monitor (``model``/``optimizer``, when given, are better sources). Never
    raises: a problem is a warning and the run goes on.
    """
    try:
        if ledger is None:
            ledger = Ledger()
        if not ledger.ok:
            return None
        return ledger.record(
            _run_row(diagnosis, monitor, script, model, optimizer, lr, duration, extra)
        )
    except Exception as exc:
        warnings.warn(
            f"nanscope: could not record the run in the ledger ({type(exc).__name__}: {exc}); "
            "the run goes on",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def _run_row(
    diagnosis: Any,
    monitor: Any,
    script: Any,
    model: Any,
    optimizer: Any,
    lr: float | None,
    duration: float | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    cause = _get(diagnosis, "cause")
    verdict = _get(diagnosis, "verdict")
    if is_inconclusive(verdict):
        cause = verdict  # never recorded as healthy: the run did not finish under watch
    row: dict[str, Any] = {
        "outcome": cause,
        "verdict": verdict,
        "failed_at": _get(diagnosis, "step") if verdict not in (None, "healthy") else None,
        "script": script,
    }
    run_info = _get(diagnosis, "run") or {}
    meta: Mapping[str, Any] = getattr(monitor, "meta", None) or {}
    row["id"] = getattr(monitor, "run_id", None) or run_info.get("id")
    started = meta.get("started")
    row["started"] = started
    if duration is None and isinstance(started, (int, float)):
        duration = time.time() - started
    row["duration"] = duration
    losses: list[float] = []
    lrs: list[float] = []
    trace = getattr(monitor, "trace", None)
    for rec in getattr(trace, "records", None) or []:
        value = rec.get("loss")
        if isinstance(value, (int, float)) and math.isfinite(value):
            losses.append(float(value))
        if isinstance(rec.get("lr"), (int, float)):
            lrs.append(float(rec["lr"]))
    row["best_loss"] = min(losses) if losses else None
    name, opt_lr = _optimizer(optimizer)
    if opt_lr is not None:
        lrs.append(opt_lr)
    row["optimizer"] = name or meta.get("optimizer")
    if lr is None and lrs:
        # the peak: a warm-up starts far below the lr the run is about, a decay ends below it
        finite = [v for v in lrs if math.isfinite(v)]
        lr = max(finite) if finite else None
    if lr is None:
        lr = opt_lr
    row["lr"] = lr
    signature = model_signature(model) if model is not None else None
    if signature is None and monitor is not None and hasattr(monitor, "last_good"):
        try:
            signature = model_signature(monitor.last_good)
        except Exception:
            signature = None
    if signature is not None:
        row["model_signature"], row["model_text"] = signature
    experiment = _get(diagnosis, "experiment")
    if isinstance(experiment, Mapping):
        row["sweep_lr"] = experiment.get("recommended_lr")
        row["sweep_factor"] = experiment.get("recommended_factor")
        row["sweep_text"] = experiment.get("text")
    row.update(extra)
    return row


def local_time(started: Any) -> str:
    """A run's start (seconds since the epoch) as ``YYYY-MM-DD HH:MM`` local time; ``?`` unknown."""
    if not isinstance(started, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(started))


def _lr_text(value: float) -> str:
    return format_lr(value)


def describe(run: Mapping[str, Any]) -> str:
    """``"step_size_too_large at update 7; lr 0.1 worked"`` for one ledger row."""
    outcome = run.get("outcome") or "unknown"
    text = str(outcome)
    if outcome != "healthy" and run.get("failed_at") is not None:
        text += f" at update {run['failed_at']}"
    if run.get("lr") is not None:
        lr = _lr_text(run["lr"])
        text += f" with lr {lr}" if outcome != "healthy" else f", lr {lr}"
    if run.get("sweep_lr") is not None:
        text += f"; lr {_lr_text(run['sweep_lr'])} worked"
    elif run.get("sweep_text"):
        text += f"; sweep: {run['sweep_text']}"
    return text


def remembered_line(
    script: str | os.PathLike[str], ledger: Ledger | None = None
) -> str | None:
    """The line ``nanscope run`` prints when a script with a known history starts, or ``None``:
    ``"previous run of train.py (2026-12-02 15:10): step_size_too_large at update 7 with lr 1.0;
    lr 0.1 worked"``. Never raises."""
    try:
        ledger = ledger if ledger is not None else Ledger()
        last = ledger.last_for(script)
    except Exception:
        return None
    if last is None:
        return None
    started = local_time(last.get("started"))
    line = f"previous run of {Path(script).name} ({started}): {describe(last)}"
    digest = file_hash(script)
    if digest is not None and last.get("script_hash") not in (None, digest):
        line += " (the script has changed since)"
    return line
