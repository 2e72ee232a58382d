"""Shared plumbing of the log readers: capped streaming line reads, number parsing, key aliases.

Every reader is a generator ``iter_records(path, meta)`` that yields trace records (plain dicts with
the keys of :mod:`nanscope.trace`) one at a time and fills ``meta`` as it goes, so that a caller can
stream a log of any length in bounded memory. :func:`nanscope.logs.load_trace` collects them.
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from nanscope.errors import TraceError

#: Longest line a reader buffers; longer lines are skipped (with one warning per file).
MAX_LINE_BYTES = 4 * 1024 * 1024

#: How much of the start of a file :func:`nanscope.logs.sniff` looks at.
HEAD_BYTES = 64 * 1024

#: At most this many framework messages are kept in ``meta["messages"]`` (counts are exact).
MAX_MESSAGES = 1000

Record = dict[str, Any]


def check_file(path: Path) -> None:
    """Raise :class:`TraceError` for a missing, unreadable or empty file."""
    if not path.exists():
        raise TraceError(f"{path}: no such file or directory")
    if path.is_dir():
        return
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None
    if size == 0:
        raise TraceError(f"{path}: the file is empty")


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(size)
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None


def iter_lines(path: Path, meta: dict[str, Any], max_line: int | None = None) -> Iterator[str]:
    """Decoded lines of ``path`` without their line ending, streaming.

    Bytes that are not UTF-8 become U+FFFD. A line longer than ``max_line`` bytes is never held in
    memory: it is skipped (counted in ``meta["skipped_long_lines"]``, warned about once).
    ``meta["lines"]`` counts the lines read, skipped ones included.
    """
    if max_line is None:
        max_line = MAX_LINE_BYTES
    count = 0
    long_lines = 0
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None
    with handle:
        readline = handle.readline
        while True:
            raw = readline(max_line + 1)
            if not raw:
                break
            count += 1
            if len(raw) > max_line and not raw.endswith(b"\n"):
                # Too long: drain the rest of this line in bounded pieces, never keeping it.
                while raw and not raw.endswith(b"\n"):
                    raw = readline(max_line)
                long_lines += 1
                if long_lines == 1:
                    warnings.warn(
                        f"{path}: skipped line {count}, longer than {max_line} bytes",
                        stacklevel=2,
                    )
                meta["skipped_long_lines"] = long_lines
                meta["lines"] = count
                continue
            meta["lines"] = count
            yield raw.decode("utf-8", errors="replace").rstrip("\r\n")
    meta["lines"] = count


def to_float(value: Any) -> float | None:
    """A float from a logged value: numbers, numeric strings, ``nan``/``inf``/``Infinity`` in any
    case, ``tensor(0.5)``; None when it is not a number."""
    cls = value.__class__
    if cls is float:
        return value  # type: ignore[no-any-return]
    if cls is str:
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > 64:
            return None
        if text.startswith("tensor("):
            text = text[7:].split(",", 1)[0].rstrip(")").strip()
        try:
            return float(text)
        except ValueError:
            return None
    return None


def to_step(value: Any) -> int | None:
    """An integer step / epoch from a logged value; None for non-integers and non-finite values."""
    cls = value.__class__
    if cls is int:
        return value if abs(value) <= 10**15 else None  # type: ignore[no-any-return]
    if cls is str and value.isdigit() and len(value) < 16:
        return int(value)
    number = to_float(value)
    if number is None or not math.isfinite(number) or number != int(number):
        return None
    if abs(number) > 1e15:
        return None
    return int(number)


def _norm_key(key: str) -> str:
    return re.sub(r"[\s\-]+", "_", key.strip().strip("'\"").lower())


# Canonical name -> aliases in order of preference (normalised: lower case, spaces/dashes -> "_").
STEP_KEYS = (
    "step",
    "global_step",
    "iteration",
    "iter",
    "iters",
    "it",
    "update",
    "trainer/global_step",
)
EPOCH_KEYS = ("epoch", "ep")
LOSS_KEYS = (
    "loss",
    "train_loss",
    "training_loss",
    "train/loss",
    "loss/train",
    "train_loss_step",
    "train/loss_step",
    "tr_loss",
    "total_loss",
    "avg_loss",
    "running_loss",
    "mean_loss",
    "train_loss_epoch",
    "epoch_loss",
)
VAL_LOSS_KEYS = (
    "val_loss",
    "validation_loss",
    "valid_loss",
    "eval_loss",
    "val/loss",
    "loss/val",
    "eval/loss",
    "loss/validation",
    "val_loss_epoch",
    "test_loss",
)
GRAD_KEYS = (
    "grad_norm",
    "gradient_norm",
    "grad_norm_total",
    "grad_norm/total",
    "train/grad_norm",
    "gnorm",
    "total_norm",
    "grad_l2_norm",
)
LR_KEYS = ("lr", "learning_rate", "train/learning_rate", "train/lr")

_ROLE_RANK: dict[str, tuple[str, int]] = {}
for _role, _keys in (
    ("step", STEP_KEYS),
    ("epoch", EPOCH_KEYS),
    ("loss", LOSS_KEYS),
    ("val_loss", VAL_LOSS_KEYS),
    ("grad_norm", GRAD_KEYS),
    ("lr", LR_KEYS),
):
    for _rank, _key in enumerate(_keys):
        _ROLE_RANK[_key] = (_role, _rank)


@functools.lru_cache(maxsize=4096)
def role_of(key: str) -> tuple[str, int] | None:
    """``(canonical name, preference rank)`` for a logged key, or None when it means nothing to us.

    ``"Val Loss"`` -> val_loss, ``"train/loss"`` -> loss, ``"lr-Adam"`` -> lr. Multi-word keys
    also match on their last words (``"at step"`` -> step).
    """
    norm = _norm_key(key)
    hit = _ROLE_RANK.get(norm)
    if hit is not None:
        return hit
    if norm.startswith("lr_") or norm.startswith("lr/"):
        return ("lr", len(LR_KEYS))
    if "_" in norm:
        words = norm.split("_")
        for start in range(1, len(words)):
            hit = _ROLE_RANK.get("_".join(words[start:]))
            if hit is not None and hit[0] in ("step", "loss", "val_loss", "lr", "epoch"):
                # "s_loss" -> loss, but "train_loss_epoch" never reaches here (exact hit above)
                return hit
    return None


def record_from_mapping(obj: Mapping[str, Any], keep_extra: bool = True) -> Record:
    """A trace record from one logged mapping with any key names (JSONL line, CSV row)."""
    best: dict[str, tuple[int, Any]] = {}
    extra: dict[str, Any] = {}
    for key, value in obj.items():
        if value is None or value == "":
            continue
        if not isinstance(key, str):
            continue
        role = role_of(key)
        if role is None:
            if keep_extra and len(extra) < 32:
                number = to_float(value)
                if number is not None:
                    extra[key] = number
            continue
        name, rank = role
        if name not in best or rank < best[name][0]:
            best[name] = (rank, value)
    record: Record = {}
    for name, (_, value) in best.items():
        if name == "epoch" and isinstance(value, float):
            # a JSON float epoch (the Trainer's 0.05, 0.1, ..., 1.0) is a fraction, not a count
            if math.isfinite(value):
                extra["epoch"] = value
        elif name in ("step", "epoch"):
            number = to_step(value)
            if number is not None:
                record[name] = number
            elif name == "epoch":
                frac = to_float(value)
                if frac is not None and math.isfinite(frac):
                    extra["epoch"] = frac
        else:
            number = to_float(value)
            if number is not None:
                record[name] = number
            else:
                extra.setdefault("unparsed", {})[name] = str(value)[:80]
    if extra:
        record["extra"] = extra
    return record


def mark_nonfinite(record: Record) -> Record:
    loss = record.get("loss")
    if loss is not None and not math.isfinite(loss):
        record["nf_loss"] = 1
    grad = record.get("grad_norm")
    if grad is not None and not math.isfinite(grad):
        record["nf_grads"] = 1
    return record


def has_values(record: Mapping[str, Any]) -> bool:
    return "loss" in record or "val_loss" in record or "grad_norm" in record or "lr" in record


class Merger:
    """Merges consecutive records of the same step (train row + eval row) and numbers the rest.

    Records without a step get ``step = epoch`` (epoch logs) or a running count.
    """

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.pending: Record | None = None
        self.count = 0
        self.steps_seen = False
        self.epochs_only = True

    def push(self, record: Record) -> Record | None:
        """Take the next record; return the previous one once it is complete (else None)."""
        if not has_values(record):
            pending = self.pending
            if pending is not None and "extra" in record and record.get("step") == pending["step"]:
                pending["extra"] = {**pending.get("extra", {}), **record["extra"]}
            return None
        if "step" in record:
            self.steps_seen = True
            self.epochs_only = False
        elif "epoch" in record and not self.steps_seen:
            record["step"] = record["epoch"]
        else:
            self.epochs_only = False
            if self.pending is not None and "loss" not in record:
                # an eval-only line: belongs to the update before it
                record["step"] = self.pending["step"]
            else:
                record["step"] = self.count + 1
        pending = self.pending
        if pending is not None and pending["step"] == record["step"]:
            extra = pending.get("extra")
            pending.update(record)
            if extra is not None and "extra" in record:
                pending["extra"] = {**extra, **record["extra"]}
            return None
        self.pending = record
        self.count += 1
        return None if pending is None else mark_nonfinite(pending)

    def close(self) -> Record | None:
        """The last record (or None); sets ``meta["granularity"]``."""
        if self.count:
            self.meta["granularity"] = "epoch" if self.epochs_only else "update"
        pending, self.pending = self.pending, None
        return None if pending is None else mark_nonfinite(pending)


def no_records(path: Path, what: str) -> TraceError:
    return TraceError(f"{path}: {what}")
