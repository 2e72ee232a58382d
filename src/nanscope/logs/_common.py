"""Shared plumbing of the log readers: capped streaming line reads, number parsing, key aliases.

Every reader has an ``iter_records(path, meta)`` returning a lazy iterator of trace records
(plain dicts with the keys of :mod:`nanscope.trace`) that fills ``meta`` as it goes, so that a
caller can stream a log of any length in bounded memory; the fast readers make records a block at
a time and chain the lists (``itertools.chain``: no Python frame per record).
:func:`nanscope.logs.load_trace` collects them.
"""

from __future__ import annotations

import codecs
import functools
import math
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

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


class LogWarning(UserWarning):
    """A log was read, but part of it was skipped or read with a caveat (the message says what)."""


def warn(message: str) -> None:
    """Warn about something a reader skipped or read with a caveat (one line, names the file)."""
    warnings.warn(message, LogWarning, stacklevel=3)


def skipped(meta: dict[str, Any], path: Path, count: int, what: str) -> None:
    """Record in ``meta["skipped_lines"]`` the ``count`` lines a reader skipped, and warn
    ``<path>: skipped <count> <what>``; nothing when ``count`` is 0."""
    if count:
        meta["skipped_lines"] = count
        warnings.warn(f"{path}: skipped {count} {what}", LogWarning, stacklevel=3)


#: Bytes read per chunk by :func:`iter_blocks` (never more than ``max_line`` either).
CHUNK_BYTES = 1 << 20

_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def text_encoding(head: bytes) -> str:
    """``"utf-16"`` for a file that opens with a UTF-16 byte-order mark (PowerShell's ``>``),
    else ``"utf-8"`` (a UTF-8 BOM is dropped from the first line by the readers)."""
    return "utf-16" if head[:2] in _UTF16_BOMS else "utf-8"


def iter_blocks(
    path: Path,
    meta: dict[str, Any],
    max_line: int | None = None,
    chunk: int | None = None,
    split_cr: bool = False,
) -> Iterator[str]:
    """Decoded text of ``path`` in blocks of whole lines, each ending in ``"\\n"``, streaming.

    Bytes that are not UTF-8 become U+FFFD (the readers count what they could not use). A line
    longer than ``max_line`` bytes is never held
    in memory: it is skipped (counted in ``meta["skipped_long_lines"]``, warned about once).
    ``meta["lines"]`` counts the lines read, skipped ones included. A block holds at most about
    ``chunk`` bytes plus one line, so memory is bounded whatever the file.

    ``split_cr`` (text logs): a line still growing past a quarter of ``max_line`` is cut after
    its last ``\\r`` and the part before given as a line of its own, so a progress bar redrawn
    with ``\\r`` for hours without a newline (tqdm) is read in pieces, not skipped; each piece
    counts as a line.
    """
    if max_line is None:
        max_line = MAX_LINE_BYTES
    size = min(chunk or CHUNK_BYTES, max(1, max_line))
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None
    count = 0
    long_lines = 0
    with handle:
        head = handle.read(2)
        handle.seek(0)
        if text_encoding(head) == "utf-16":
            yield from _utf16_blocks(path, handle, meta, max_line, size)
            return
        carry = b""
        skipping = False
        read = handle.read
        while True:
            data = read(size)
            if not data:
                break
            if skipping:
                cut = data.find(b"\n")
                if cut < 0:
                    continue
                data = data[cut + 1 :]
                skipping = False
            first = data.find(b"\n")
            if first < 0:
                carry += data
                if split_cr and len(carry) > max_line // 4:
                    cut = carry.rfind(b"\r", 0, len(carry) - 1)  # (not a CRLF's own \r)
                    if cut > 0:
                        count += 1
                        meta["lines"] = count
                        yield carry[:cut].decode("utf-8", errors="replace") + "\n"
                        carry = carry[cut:]
                if len(carry) > max_line:
                    carry = b""
                    skipping = True
                    count += 1
                    long_lines += 1
                    _long_line(path, meta, count, long_lines, max_line)
                continue
            if len(carry) + first > max_line:
                # the first line of this chunk closes an overlong line: drop it
                count += 1
                long_lines += 1
                _long_line(path, meta, count, long_lines, max_line)
                carry = b""
                data = data[first + 1 :]
            last = data.rfind(b"\n")
            if last < 0:
                carry = data
                continue
            block = carry + data[: last + 1]
            carry = data[last + 1 :]
            count += block.count(b"\n")
            meta["lines"] = count
            yield block.decode("utf-8", errors="replace")
        if carry and not skipping:
            count += 1
            meta["lines"] = count
            yield carry.decode("utf-8", errors="replace") + "\n"
    meta["lines"] = count


def _long_line(path: Path, meta: dict[str, Any], number: int, count: int, max_line: int) -> None:
    meta["skipped_long_lines"] = count
    meta["lines"] = number
    if count == 1:
        warn(f"{path}: skipped line {number}, longer than {max_line} bytes")


def _utf16_blocks(
    path: Path, handle: Any, meta: dict[str, Any], max_line: int, size: int
) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-16")(errors="replace")
    carry = ""
    count = 0
    while True:
        data = handle.read(size)
        text = carry + decoder.decode(data, final=not data)
        last = text.rfind("\n")
        if last >= 0:
            block, carry = text[: last + 1], text[last + 1 :]
            count += block.count("\n")
            meta["lines"] = count
            yield block
        else:
            carry = text
        if len(carry) > max_line:
            carry = ""  # an overlong line in a UTF-16 file: rare enough to drop without draining
            count += 1
            meta["skipped_long_lines"] = meta.get("skipped_long_lines", 0) + 1
        if not data:
            break
    if carry:
        count += 1
        yield carry + "\n"
    meta["lines"] = count


def iter_lines(path: Path, meta: dict[str, Any], max_line: int | None = None) -> Iterator[str]:
    """Decoded lines of ``path`` without their line ending, streaming (see :func:`iter_blocks`)."""
    for block in iter_blocks(path, meta, max_line):
        lines = block.split("\n")
        lines.pop()  # the empty string after the block's last newline
        for line in lines:
            yield line.rstrip("\r") if line.endswith("\r") else line


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


def normalise_key(key: str) -> str:
    """A logged key as the key tables spell theirs: unquoted, lower case, spaces and dashes as
    ``_`` (``"'Val Loss'"`` -> ``val_loss``)."""
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
    "num_updates",
    "n_iter",
    "global_iter",
    "batch",
    "batch_idx",
    "batch_id",
    "nbatch",
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


#: Words that make a key a validation loss (``val_loss``, ``Val Loss``, ``eval/loss_cls``).
_VAL_WORDS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev"})
#: Words that make a loss-named key something else: a loss scale, a weight, a best-so-far value.
_NOT_A_LOSS = frozenset(
    {
        "scale", "scaler", "weight", "weights", "coef", "coeff", "factor", "multiplier",
        "lambda", "best", "min", "lowest", "prev", "previous", "target", "threshold", "fn",
        "type", "name", "patience", "delta", "improved", "count", "nan", "inf",
    }
)  # fmt: skip
_WORD_SPLIT = re.compile(r"[_/.]+|(?<=[a-z])(?=[A-Z])")
_KEY_LIKE = re.compile(r"[A-Za-z_][\w/.\- ]{0,79}")
_LOSS_RANK = len(LOSS_KEYS) + 10
_VAL_RANK = len(VAL_LOSS_KEYS) + 10


def _loss_role(key: str, norm: str) -> tuple[str, int] | None:
    """Any other key that names a loss: ``IDLoss``, ``losses``, ``loss_heatmap``, ``d_loss``.

    A loss-named key ranks after the table's names (so ``loss`` beats ``loss_cls`` in one line);
    the whole-loss spellings (``losses``, ``*_total``) rank before the component losses.
    """
    if "loss" not in norm:
        return None
    name = key.strip().strip("'\"")
    if _KEY_LIKE.fullmatch(name) is None:
        return None  # "Loss: 0.5" is a cell holding a pair, not a column named like a loss
    words = [w for w in _WORD_SPLIT.split(name.replace("-", "_").replace(" ", "_")) if w]
    lower = [w.lower() for w in words]
    if not any("loss" in w for w in lower) or any(w in _NOT_A_LOSS for w in lower):
        return None
    whole = norm in ("losses", "loss_total", "total", "sum_loss", "loss_sum", "overall_loss")
    if any(w in _VAL_WORDS or w.startswith("val") for w in lower):
        return ("val_loss", _VAL_RANK + (0 if whole else 1))
    return ("loss", _LOSS_RANK + (0 if whole or norm.endswith("_total") else 1))


@functools.lru_cache(maxsize=4096)
def role_of(key: str) -> tuple[str, int] | None:
    """``(canonical name, preference rank)`` for a logged key, or None when it means nothing to us.

    ``"Val Loss"`` -> val_loss, ``"train/loss"`` -> loss, ``"lr-Adam"`` -> lr. Multi-word keys
    also match on their last words (``"at step"`` -> step). Any other key naming a loss
    (``IDLoss``, ``losses``, ``loss_heatmap``) is a loss, after the usual names; with a
    validation word in it (``val``, ``eval``, ``test``) a validation loss; ``loss_scale``,
    ``best_loss``, ``loss_weight`` are not losses.
    """
    norm = normalise_key(key)
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
                if hit[0] in ("loss", "val_loss") and any(w in _NOT_A_LOSS for w in words):
                    return None  # "best_val_loss", "min_loss": a record, not this update's loss
                if hit[0] == "loss" and any(w in _VAL_WORDS for w in words[:start]):
                    return ("val_loss", _VAL_RANK)
                if hit[0] == "loss":
                    # "nll_loss", "d_loss": a loss, after the table's own names
                    return ("loss", len(LOSS_KEYS) + 5)
                # "at step" -> step; "train_loss_epoch" never reaches here (exact hit above)
                return hit
    return _loss_role(key, norm)


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


class FlatRecords:
    """:func:`record_from_mapping` for the common case, at a fraction of its cost: a flat
    mapping whose values are all plain numbers. Which key plays which role is worked out once
    per set of keys. Returns None (use :func:`record_from_mapping`) for anything else."""

    def __init__(self) -> None:
        self.plans: dict[tuple[str, ...], tuple[list[tuple[str, str]], list[str]] | None] = {}

    def plan(self, keys: tuple[str, ...]) -> tuple[list[tuple[str, str]], list[str]] | None:
        if len(self.plans) > 256:
            self.plans.clear()
        best: dict[str, tuple[int, str]] = {}
        extra: list[str] = []
        for key in keys:
            if key.__class__ is not str:
                return None
            role = role_of(key)
            if role is None:
                if len(extra) < 32:
                    extra.append(key)
                continue
            name, rank = role
            if name not in best or rank < best[name][0]:
                best[name] = (rank, key)
        return [(key, name) for name, (_, key) in best.items()], extra

    def __call__(self, obj: dict[str, Any]) -> Record | None:
        keys = tuple(obj)
        try:
            plan = self.plans[keys]
        except KeyError:
            plan = self.plans[keys] = self.plan(keys)
        if plan is None:
            return None
        pairs, extra_keys = plan
        record: Record = {}
        for key, name in pairs:
            value = obj[key]
            cls = value.__class__
            if cls is float:
                if name == "step" or name == "epoch":
                    return None  # 10.0 as a step, 0.25 as an epoch: the general path decides
                record[name] = value
            elif cls is int:
                record[name] = value if name == "step" or name == "epoch" else float(value)
            else:
                return None
        if "step" in record and abs(record["step"]) > 10**15:
            return None
        if extra_keys:
            extra = {}
            for key in extra_keys:
                value = obj[key]
                cls = value.__class__
                if cls is float or cls is int:
                    extra[key] = float(value)
                elif (
                    cls is dict
                    or cls is list
                    or (value is not None and value != "" and to_float(value) is not None)
                ):
                    return None
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


def make_records(keys: list[str], columns: list[list[Any]]) -> list[Record]:
    """One dict per row from columns of values, built with dict displays (the fastest way
    CPython makes dicts); ``keys[i]`` names ``columns[i]``."""
    if len(columns) == 1:
        (k1,) = keys
        return [{k1: a} for a in columns[0]]
    if len(columns) == 2:
        k1, k2 = keys
        return [{k1: a, k2: b} for a, b in zip(*columns)]
    if len(columns) == 3:
        k1, k2, k3 = keys
        return [{k1: a, k2: b, k3: c} for a, b, c in zip(*columns)]
    if len(columns) == 4:
        k1, k2, k3, k4 = keys
        return [{k1: a, k2: b, k3: c, k4: d} for a, b, c, d in zip(*columns)]
    if len(columns) == 5:
        k1, k2, k3, k4, k5 = keys
        return [{k1: a, k2: b, k3: c, k4: d, k5: e} for a, b, c, d, e in zip(*columns)]
    if len(columns) == 6:
        k1, k2, k3, k4, k5, k6 = keys
        return [{k1: a, k2: b, k3: c, k4: d, k5: e, k6: f} for a, b, c, d, e, f in zip(*columns)]
    return [dict(zip(keys, row)) for row in zip(*columns)]


def flag_nonfinite(records: list[Record], keys: list[str], columns: list[list[Any]]) -> None:
    """Set ``nf_loss`` / ``nf_grads`` on the rows whose loss / gradient norm is NaN or inf."""
    for key, values in zip(keys, columns):
        if key == "loss" or key == "grad_norm":
            flag = "nf_loss" if key == "loss" else "nf_grads"
            for i in np.flatnonzero(~np.isfinite(np.asarray(values, dtype=float))).tolist():
                records[i][flag] = 1


class Columns:
    """Rows a reader made a column at a time and has not turned into dicts yet: ``keys[i]``
    names ``columns[i]``; the first ``size`` values of each column are the rows.

    The text reader's fast path puts these in the lists it yields. :func:`expand` turns them into
    the records :func:`make_records` and :func:`flag_nonfinite` give; the thinning of a long log
    (:mod:`nanscope.logs._thin`) picks the rows it keeps first, so most never become a dict.
    """

    __slots__ = ("columns", "keys", "size")

    def __init__(self, keys: list[str], columns: list[list[Any]], size: int) -> None:
        self.keys = keys
        self.columns = columns
        self.size = size

    def __len__(self) -> int:
        return self.size

    def records(self) -> list[Record]:
        columns = [column[: self.size] for column in self.columns]
        records = make_records(self.keys, columns)
        flag_nonfinite(records, self.keys, columns)
        return records

    def row(self, index: int) -> Record:
        """Row ``index`` as its record (flagged like :meth:`records`)."""
        return mark_nonfinite({key: column[index] for key, column in zip(self.keys, self.columns)})

    def flagged(self) -> np.ndarray:
        """Indices of the rows whose loss or gradient norm is not finite."""
        bad = np.zeros(self.size, dtype=bool)
        for key, column in zip(self.keys, self.columns):
            if key == "loss" or key == "grad_norm":
                bad |= ~np.isfinite(np.asarray(column[: self.size], dtype=float))
        return np.flatnonzero(bad)


def expand(items: list[Any]) -> list[Record]:
    """The records of a list a reader yielded, :class:`Columns` made into dicts."""
    if not any(item.__class__ is Columns for item in items):
        return items
    out: list[Record] = []
    for item in items:
        if item.__class__ is Columns:
            out.extend(item.records())
        else:
            out.append(item)
    return out


def _unmark(record: Record) -> None:
    record.pop("nf_loss", None)
    record.pop("nf_grads", None)


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

    def hold_last(self, records: list[Record], out: list[Record]) -> None:
        """Take a block of new records (already flagged, steps after the pending one's): the
        pending record and all of them but the last go to ``out``; the last one waits, its
        ``nf_*`` flags cleared (a record is flagged when it is emitted, after any merge, as
        :meth:`push` does)."""
        if self.pending is not None:
            out.append(mark_nonfinite(self.pending))
        last = records.pop()
        last.pop("nf_loss", None)
        last.pop("nf_grads", None)
        self.pending = last
        self.count += len(records) + 1
        out.extend(records)

    def hold_columns(self, keys: list[str], columns: list[list[Any]], out: list[Any]) -> None:
        """:meth:`hold_last` for rows given as columns (not flagged, steps after the pending
        one's): the pending record goes to ``out``, the rows but the last as one
        :class:`Columns`; the last row waits as the pending record."""
        if self.pending is not None:
            out.append(mark_nonfinite(self.pending))
        size = len(columns[0])
        self.pending = {key: column[-1] for key, column in zip(keys, columns)}
        self.count += size
        if size > 1:
            out.append(Columns(keys, columns, size - 1))

    def extend(
        self,
        records: list[Record],
        marked: bool = False,
        steps: list[int] | None = None,
        valued: bool = False,
    ) -> list[Record]:
        """:meth:`push` for many records at once: the completed ones, in order. Records with
        strictly increasing steps after the pending one take a fast path (no merge possible);
        ``marked``: their ``nf_*`` flags are already set; ``steps``: their steps (each below
        1e15), when the caller has them as a column; ``valued``: every record has a value."""
        pending = self.pending
        if records and (steps is not None or all("step" in r for r in (records[0], records[-1]))):
            if steps is None:
                steps = [r["step"] for r in records]
            array = np.array(steps, dtype=np.int64)
            last = -(1 << 62) if pending is None else pending["step"]
            if (
                array[0] > last
                and bool((array[1:] > array[:-1]).all())
                and (valued or all(map(has_values, records)))
            ):
                out = [] if pending is None else [mark_nonfinite(pending)]
                self.pending = records[-1]
                if marked:
                    _unmark(records[-1])  # flagged when emitted, after any merge, as push does
                self.count += len(records)
                self.steps_seen = True
                self.epochs_only = False
                if marked:
                    out.extend(records[:-1])
                else:
                    out.extend(map(mark_nonfinite, records[:-1]))
                return out
        out = []
        for record in records:
            if marked:
                _unmark(record)
            done = self.push(record)
            if done is not None:
                out.append(done)
        return out

    def close(self) -> Record | None:
        """The last record (or None); sets ``meta["granularity"]``."""
        if self.count:
            self.meta["granularity"] = "epoch" if self.epochs_only else "update"
        pending, self.pending = self.pending, None
        return None if pending is None else mark_nonfinite(pending)


def no_records(path: Path, what: str) -> TraceError:
    return TraceError(f"{path}: {what}")
