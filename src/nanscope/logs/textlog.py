"""Plain-text training output: whatever a fit printed to the terminal.

Recognised shapes (mixed freely in one file):

- Keras progress: ``Epoch 3/10`` then ``100/100 [====] - 2s 20ms/step - loss: 0.5 - val_loss: 0.6``
  (intermediate progress lines of the epoch are overwritten by the last one, as on screen);
- ``Epoch N/M`` header lines whose numbers follow on the next lines
  (``Time : 499 s    Loss : nan  Val Loss : nan``);
- print loops: ``step 100 | loss 0.52 | lr 1e-3``, ``iter 10: loss=0.3``,
  ``Epoch [1/5], Step [100/600], Loss: 0.2``, ``loss tensor(0.52, grad_fn=...)``,
  the Trainer's ``{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.05}``;
- tqdm bars with a postfix, ``\\r``-separated: ``12/100 [00:01<00:09, 9.8it/s, loss=0.42]``
  (the bar count is the step; a bar that restarts each epoch is counted on).

Numbers may be ``nan``, ``NaN``, ``inf``, ``-inf``, ``Infinity`` in any case. A line with a step
(``step``, ``iter``, ``global_step``... or a tqdm count) is one update; a loss with only an epoch is
one epoch (``granularity = "epoch"``, ``step`` = the epoch number as printed). In a per-update log,
epoch summary lines only contribute their validation loss.

Framework messages about numerics are collected in ``meta["messages"]`` (see :data:`MESSAGE_KINDS`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, compress
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.logs._common import (
    LOSS_KEYS,
    MAX_MESSAGES,
    Merger,
    Record,
    expand,
    flag_nonfinite,
    iter_blocks,
    make_records,
    mark_nonfinite,
    normalise_key,
    role_of,
    to_float,
)
from nanscope.logs._table import Table, sums_to

NAME = "text"
DESCRIPTION = "plain training output (Keras progress, Epoch N/M blocks, step/iter loops, tqdm)"

_NUM = r"[-+]?(?:nan|inf(?:inity)?|(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)"
#: ``key: value``, ``key=value``, ``key value``, ``'key': value``, ``key [3]``, ``Step [100/600]``
_PAIR = re.compile(
    r"(?<![\w/.'\"])['\"]?(?P<key>[a-z_][\w/.\-]*(?: [a-z_][\w/.\-]*)?)['\"]?"
    r"(?:\s*[:=]\s*|\s*(?=\[)|\s+)\[?\s*(?:tensor\(|array\()?(?P<val>" + _NUM + r")"
    r"(?:\s*/\s*(?P<tot>\d+))?(?![\w.])",
    re.IGNORECASE,
)
#: mmdetection / mmengine counters: ``Epoch [1][50/3862]``, ``Epoch(train) [1][ 50/3862]``,
#: ``Iter(train) [ 50/90000]``, ``Epoch(val) [1][500/500]``
_BRACKETS = re.compile(
    r"\b(?P<kind>epoch|iter)(?:\((?P<mode>\w+)\))?\s*\[\s*(?P<a>\d+)\s*(?:/\s*(?P<atot>\d+)\s*)?\]"
    r"(?:\s*\[\s*(?P<b>\d+)\s*(?:/\s*(?P<btot>\d+)\s*)?\])?",
    re.IGNORECASE,
)
_TQDM = re.compile(r"(\d+)/(\d+) \[(?:\d+:)?\d+:\d+<")
#: the Trainer's end-of-run summary: ``***** train metrics *****`` then ``  train_loss = 0.73``
_SUMMARY_HEAD = re.compile(r"\*{3,}\s*\w+ metrics\s*\*{3,}")
_SUMMARY_ROW = re.compile(r"\s+[\w/.\-]+\s*=\s*\S+\s*$")
#: the loss scale a scaler message names: apex's ``reducing loss scale to 32768.0``, DeepSpeed's
#: ``reducing to 2048``, fairseq's ``setting loss scale to: 16384.0``; else the scale it tried
#: (DeepSpeed's ``Attempted loss scale: 65536, but hysteresis is 2``), fairseq's minimum
#: (``Minimum loss scale reached (0.0001)``)
_SCALES = tuple(
    re.compile(pattern + r":?\s*[(:]?\s*(\d[\d.]*(?:e[-+]?\d+)?)", re.IGNORECASE)
    for pattern in (
        r"(?:reducing|setting)\s+(?:loss\s+)?(?:scale\s+)?(?:to\s+)?to",
        r"attempted loss scale",
        r"minimum loss scale reached",
    )
)
_AT_ITERATION = re.compile(r"at iteration\s*=?\s*(\d{1,15})", re.IGNORECASE)

#: kind -> what it means. ``meta["messages"]`` entries are
#: ``{"line", "step", "kind", "text"}`` plus ``"op"`` (anomaly), ``"scale"`` (the loss scale
#: the scaler moved to, or tried, or its floor), ``"at_step"`` (the update a framework names in
#: its message), ``"metric"`` (the metric an early-stopping check found non-finite),
#: ``"exception"`` and ``"ends_run"`` (traceback).
MESSAGE_KINDS: dict[str, str] = {
    "loss_scale_overflow": "the fp16 loss scaler found inf/NaN gradients and skipped the step",
    "loss_scale_min": "the loss scale cannot go lower: fp16 gradients overflow at every scale",
    "nonfinite_loss": "the framework found the training loss inf or NaN (and stopped, or "
    "reloaded a checkpoint)",
    "metric_nonfinite": "an early-stopping check found the monitored metric non-finite",
    "anomaly": "autograd anomaly mode named the backward function that produced NaN",
    "oom": "the run ran out of (GPU) memory",
    "nccl": "a distributed (NCCL) error or collective timeout",
    "traceback": "a Python traceback (ends_run: no training line came after it)",
    "terminate_on_nan": "Keras TerminateOnNaN stopped the fit on an invalid loss",
}

#: The messages of each framework, as their source prints them: apex (``Gradient overflow.
#: Skipping step, loss scaler 0 reducing loss scale to 32768.0``; ``OVERFLOW! Skipping step.
#: Attempted loss scale: ..., reducing to ...``), DeepSpeed (``[deepspeed] OVERFLOW! Rank 0
#: Skipping step. Attempted loss scale: 65536, reducing to 32768``, ``fp16 dynamic loss scale
#: overflow! Skipping step``, ``Current loss scale already at minimum``), fairseq (``NOTE:
#: overflow detected, setting loss scale to: 16384.0``, ``Minimum loss scale reached
#: (0.0001)``), Megatron (``Overflow detected, setting loss scale to``), detectron2 (``Loss
#: became infinite or NaN at iteration=1234!``), mmdetection (``loss become infinite or
#: NaN!``), Ultralytics YOLO (``Loss NaN/Inf detected (attempt 1/3), recovering from
#: last.pt``), Lightning (``Monitored metric val_loss = nan is not finite``), Keras
#: (``Batch 3: Invalid loss, terminating training``), PyTorch (anomaly mode, OOM, NCCL).
_MESSAGE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "loss_scale_min",
        re.compile(
            r"loss scale (?:is )?already at minimum|minimum loss scale reached|"
            r"loss scaling factor has reached its minimum",
            re.I,
        ),
    ),
    (
        "loss_scale_overflow",
        re.compile(
            r"gradient overflow|OVERFLOW!.*skipping step|attempted loss scale|"
            r"reducing loss scale to|overflow detected, skipping|"
            r"overflow detected, setting (?:loss )?scale to|overflow: setting loss scale to",
            re.I,
        ),
    ),
    (
        "nonfinite_loss",
        re.compile(
            r"loss bec[oa]me infinite or nan|loss nan/inf detected|nan persisted for", re.I
        ),
    ),
    (
        "metric_nonfinite",
        re.compile(r"monitored metric (?P<metric>\S+) = \S+ is not finite", re.I),
    ),
    (
        "anomaly",
        re.compile(r"Function '(?P<op>\w+)' returned nan values|Error detected in (?P<op2>\w+)\."),
    ),
    ("oom", re.compile(r"out of memory|OutOfMemoryError|RESOURCE_EXHAUSTED: OOM", re.I)),
    (
        "nccl",
        re.compile(
            r"NCCL (?:error|WARN|timeout)|nccl\w*Error|"
            r"Watchdog caught collective operation timeout|"
            r"ProcessGroupNCCL.*(?:time|error|abort)|NCCL communicator was aborted",
            re.I,
        ),
    ),
    ("traceback", re.compile(r"^\s*Traceback \(most recent call last\)")),
    ("terminate_on_nan", re.compile(r"Invalid loss, terminating training", re.I)),
)


#: Every message line holds one of these lower-case words: a cheap filter before the patterns.
_MESSAGE_WORDS = (
    "overflow", "nccl", "traceback", "loss scale", "out of memory", "outofmemory",
    "returned nan", "error detected in", "resource_exhausted", "invalid loss",
    "minimum loss scale", "its minimum", "infinite or nan", "nan/inf", "not finite",
    "nan persisted",
)  # fmt: skip


def _has_message(low: str) -> bool:
    # spelled out (not any(...)): this runs on every line
    return (
        "overflow" in low
        or "nccl" in low
        or "traceback" in low
        or "loss scale" in low
        or "out of memory" in low
        or "outofmemory" in low
        or "returned nan" in low
        or "error detected in" in low
        or "resource_exhausted" in low
        or "invalid loss" in low
        or "minimum loss scale" in low
        or "its minimum" in low
        or "infinite or nan" in low
        or "nan/inf" in low
        or "not finite" in low
        or "nan persisted" in low
    )


_EXCEPTION_LINE = re.compile(
    r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)\b.*|^\w+Error$"
)


#: Where one value sits in a segment: (rank, start, end, total start, total end); the total is
#: the ``600`` of ``Step [100/600]`` (-1, -1 when none).
_Hit = tuple[int, int, int, int, int]
_ROLES = ("loss", "val_loss", "lr", "grad_norm")
_VAL_MODES = frozenset({"val", "valid", "validation", "eval", "test"})
#: Numbers about the loss scaler a line may carry, read into the record's ``extra`` under these
#: names: fairseq's ``loss_scale=128``, Megatron's ``loss scale: 65536.0`` and ``number of
#: skipped iterations: 1`` (steps skipped in that log interval), DeepSpeed's ``skipped=3``
#: (steps skipped so far).
_EXTRA_KEYS: dict[str, str] = {
    "loss_scale": "loss_scale",
    "skipped_iterations": "skipped",
    "skipped": "skipped_total",
}
_EXTRAS = ("loss_scale", "skipped", "skipped_total")
#: Every value a record takes from a line (the roles, then the extras).
_VALUES = _ROLES + _EXTRAS
#: Keys that name a total of the losses printed before them (YOLACT's ``T``), read as the loss
#: when no key names a loss and their value is the sum of those losses.
_TOTAL_KEYS = frozenset({"t", "total", "tot", "sum"})
#: Words that make a line (before its loss) an evaluation line: ``| valid on 'valid' subset |
#: loss 4.1``, ``Test set: Average loss: 0.03``, ``[eval] step 100 loss 0.4``; a train word
#: before the loss keeps it a training line.
_VAL_CONTEXT = frozenset(
    {"val", "valid", "validation", "validating", "eval", "evaluation", "evaluating", "test",
     "testing", "dev"}
)  # fmt: skip
_TRAIN_CONTEXT = frozenset({"train", "training", "train_inner"})
_WORDS = re.compile(r"[A-Za-z_]+")
#: A line that opens with a bracketed counter: the PyTorch tutorial's ``[1,  2000] loss: 2.187``
#: (epoch, iteration in the epoch), YOLACT's ``[  0]    1050 || B: 3.113 | ... | T: 10.132``
#: (epoch, then the iteration), ``[3/10]`` (epoch of epochs).
_LEAD = re.compile(
    r"\s*\[\s*(?P<a>\d{1,15})\s*(?:(?P<sep>[,|/])\s*(?P<b>\d{1,15})\s*)?\]"
    r"(?:[ \t]+(?P<c>\d{1,15})(?=[\s|:,]))?"
)


def _pairs(segment: str, prefer: str | None = None) -> dict[str, _Hit]:
    """The values of one segment by role (the lowest rank wins), the loss-scaler extras, and a
    total of printed losses as the loss where nothing names one. ``prefer``: the counter key
    (normalised) that wins over the other counters of the line (:func:`finest_counter`)."""
    found: dict[str, _Hit] = {}
    others: list[tuple[str, int, int]] = []
    for match in _PAIR.finditer(segment):
        key = match.group("key")
        role = role_of(key)
        if role is None:
            extra = _EXTRA_KEYS.get(normalise_key(key))
            if extra is not None:
                if extra not in found:
                    found[extra] = (0, *match.span("val"), -1, -1)
            else:
                others.append((key, *match.span("val")))
            continue
        name, rank = role
        if name == "step" and prefer is not None and normalise_key(key) == prefer:
            rank = -2
        if name not in found or rank < found[name][0]:
            start, end = match.span("val")
            found[name] = (rank, start, end, *match.span("tot"))
    if len(others) >= 3 and "loss" not in found and "val_loss" not in found:
        total = _total(segment, others)
        if total is not None:
            found["loss"] = total
    return found


def _total(segment: str, others: list[tuple[str, int, int]]) -> _Hit | None:
    """The value of a total key (``T``, ``total``) that adds up the losses printed before it
    (two or more), as a loss hit; None when there is none or the sum does not match."""
    for index, (key, start, end) in enumerate(others):
        if normalise_key(key) not in _TOTAL_KEYS or index < 2:
            continue
        parts = [segment[s:e] for _, s, e in others[:index] if _fractional(segment[s:e])]
        if sums_to(segment[start:end], parts):
            return (len(LOSS_KEYS), start, end, -1, -1)
    return None


def _fractional(text: str) -> bool:
    """A printed number that is not a count: it has a point, or is nan/inf."""
    return "." in text or text[-1:].isalpha()


def _parse(segment: str, prefer: str | None = None) -> tuple[dict[str, _Hit], bool]:
    """The values of one segment by role, and whether it is a validation line (``Epoch(val)``,
    ``valid on 'valid' subset | loss 4.1``: its loss is a validation loss)."""
    found = _pairs(segment, prefer)
    if "loss" in found and "val_loss" not in found and _evaluation(segment, found["loss"][1]):
        found["val_loss"] = found.pop("loss")
        return found, True
    if "[" not in segment:
        return found, False
    brackets = _BRACKETS.search(segment)
    if brackets is None:
        if "step" not in found and "epoch" not in found and segment.lstrip()[:1] == "[":
            _leading_counter(segment, found)
        return found, False
    mode = (brackets.group("mode") or "").lower()
    if mode in _VAL_MODES:
        found.pop("step", None)
        if "loss" in found and "val_loss" not in found:
            found["val_loss"] = found.pop("loss")
        return found, True
    if brackets.group("kind").lower() == "epoch":
        found["epoch"] = (-1, *brackets.span("a"), -1, -1)
        if brackets.group("b") is not None and "step" not in found:
            found["step"] = (-1, *brackets.span("b"), *brackets.span("btot"))
    elif "step" not in found:
        found["step"] = (-1, *brackets.span("a"), *brackets.span("atot"))
    return found, False


def _evaluation(segment: str, loss_at: int) -> bool:
    """Whether the words before a line's loss make it an evaluation line (see
    :data:`_VAL_CONTEXT`)."""
    words = {w.lower() for w in _WORDS.findall(segment, 0, loss_at)}
    return bool(words & _VAL_CONTEXT) and not words & _TRAIN_CONTEXT


def _leading_counter(segment: str, found: dict[str, _Hit]) -> None:
    """The epoch and iteration of a line that opens with a bracketed counter (:data:`_LEAD`)."""
    match = _LEAD.match(segment)
    if match is None or not any(key in found for key in ("loss", "val_loss")):
        return
    found["epoch"] = (-1, *match.span("a"), -1, -1)
    sep = match.group("sep")
    if match.group("c") is not None:
        found["step"] = (-1, *match.span("c"), -1, -1)
    elif sep == "," and match.group("b") is not None:
        found["step"] = (-1, *match.span("b"), -1, -1)


def looks_like(lines: Iterable[str]) -> bool:
    """True when some line carries a loss value, a row under a header that names a loss, or a
    numerics message."""
    table: Table | None = None
    for line in lines:
        if len(line) > 100_000:
            continue
        for segment in line.split("\r"):
            found = _pairs(segment)
            if "loss" in found or "val_loss" in found:
                return True
            if _has_message(segment.lower()) and any(
                pattern.search(segment) for _, pattern in _MESSAGE_PATTERNS
            ):
                return True
            if table is not None and table.row(segment) is not None:
                return True
            if not found and segment.strip():
                header = Table.header(segment)
                if header is not None:
                    table = header if header.reads_loss else None
    return False


def first_unread(lines: Iterable[str]) -> tuple[int, str, str] | None:
    """``(line number, line, why)`` of the first line of a log that holds a number but no value
    the text reader can name (a loss, a learning rate, a counter), or None when no line holds a
    number. ``why`` names the header above it when that header names no loss column."""
    header: tuple[int, list[str]] | None = None
    for number, line in enumerate(lines, 1):
        text = line.strip().lstrip("\ufeff")
        if not text:
            continue
        if not any(char.isdigit() for char in text):
            names = text.split()
            if len(names) >= 2:
                header = (number, names)
            continue
        if _pairs(text):
            continue
        why = ""
        if header is not None and header[0] == number - 1:
            shown = ", ".join(header[1][:8])
            why = f"under the header on line {header[0]} ({shown}), which names no loss column"
        return number, line, why
    return None


class _State:
    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.merger = Merger(meta)
        self.epoch: int | None = None
        self.fractional_epochs = False
        self.tqdm_base = 0
        self.tqdm_last = 0
        self.tqdm_total = 0
        self.step_base = 0
        self.last_printed: int | None = None
        self.last_total: int | None = None
        self.last_epoch: int | None = None
        self.messages: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}
        self.traceback: dict[str, Any] | None = None
        self.lineno = 0
        #: the counter key that wins when a line prints several (:func:`finest_counter`)
        self.prefer: str | None = None
        #: the table whose header came last (:mod:`nanscope.logs._table`)
        self.table: Table | None = None
        #: inside a ``***** train metrics *****`` block (the Trainer's end-of-run summary)
        self.summary = False

    def last_step(self) -> int | None:
        pending = self.merger.pending
        return None if pending is None else int(pending["step"])

    def message(self, lineno: int, kind: str, text: str, **extra: Any) -> dict[str, Any]:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        entry: dict[str, Any] = {
            "line": lineno,
            "step": self.last_step(),
            "kind": kind,
            "text": text.strip()[:300],
            **extra,
        }
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(entry)
        return entry

    def scan_message(self, lineno: int, segment: str) -> None:
        for kind, pattern in _MESSAGE_PATTERNS:
            match = pattern.search(segment)
            if match is None:
                continue
            extra: dict[str, Any] = {}
            if kind == "anomaly":
                extra["op"] = match.group("op") or match.group("op2")
            elif kind in ("loss_scale_overflow", "loss_scale_min"):
                for pattern in _SCALES:
                    scale = pattern.search(segment)
                    if scale is not None:
                        value = to_float(scale.group(1).rstrip("."))
                        if value is not None:
                            extra["scale"] = value
                        break
            elif kind == "nonfinite_loss":
                at = _AT_ITERATION.search(segment)
                if at is not None:
                    extra["at_step"] = int(at.group(1))
            elif kind == "metric_nonfinite":
                extra["metric"] = match.group("metric")
            entry = self.message(lineno, kind, segment, **extra)
            if kind == "traceback":
                self.traceback = entry
                entry["_at"] = self.merger.count
            return

    def map_step(self, printed: int, total: int | None) -> int:
        """The update number of a printed counter; a counter that restarts each epoch
        (``Step [100/600]``, mmdetection's ``[50/3862]``, ``Batch [20]``) is counted on."""
        last = self.last_printed
        if (
            last is not None
            and printed < last
            and (total is not None or self.epoch != self.last_epoch)
        ):
            lap = self.last_total
            self.step_base += lap if lap is not None and lap >= last else last
        self.last_printed = printed
        self.last_total = total
        self.last_epoch = self.epoch
        return self.step_base + printed

    def segment(self, lineno: int, segment: str) -> Record | None:
        """Read one line (or one ``\\r`` segment); return a record completed by it, if any."""
        if (
            self.traceback is not None
            and segment[:1] not in (" ", "\t", "")
            and not (segment.startswith("Traceback") or segment.startswith("During handling"))
            and _EXCEPTION_LINE.match(segment)
        ):
            self.traceback["exception"] = segment.strip()[:300]
            self.traceback = None
        low = segment.lower()
        if _has_message(low):
            self.scan_message(lineno, segment)
        if self.table is not None:
            values = self.table.row(segment)
            if values is not None:
                return self.table_record(segment, values)
        if self.summary:
            if _SUMMARY_ROW.match(segment):
                return None  # "  train_loss = 0.73": a mean over the run, not an update
            self.summary = False
        if "*****" in segment and _SUMMARY_HEAD.search(segment):
            self.summary = True
            return None
        if not (
            "loss" in low
            or "lr" in low
            or "norm" in low
            or "learning" in low
            or "epoch" in low
            or " t:" in low
            or "total" in low
        ):
            if self.table is not None and Table.header(segment) is not None:
                self.table = None  # another table (YOLO's validation metrics) ends this one
            return None
        found, _ = _parse(segment, self.prefer)
        if not found:
            table = Table.header(segment)
            if table is not None:
                self.table = table if table.reads_loss else None
            return None
        if "train_runtime" in segment:
            return None  # the Trainer's closing summary: train_loss is the mean over the run
        return self.interpret(segment, found)

    def table_record(self, segment: str, values: dict[str, float | int]) -> Record | None:
        """The record of one row of the current table (:meth:`interpret` for table rows)."""
        if self.table is not None and self.table.loss_name:
            self.meta.setdefault("loss_column", self.table.loss_name)
        record: Record = {k: float(values[k]) for k in _ROLES if k in values}
        tqdm = _TQDM.search(segment) if "<" in segment else None
        step: int | None = None
        epoch_before = self.epoch
        if "epoch" in values:
            self.epoch = int(values["epoch"])
        if "step" in values:
            step = self.map_step(int(values["step"]), None)
        elif tqdm is not None:
            n, total = int(tqdm.group(1)), int(tqdm.group(2))
            if self.epoch != epoch_before and n >= self.tqdm_last and self.tqdm_total:
                # a new epoch's bar, seen only at its end (the rows copied from a terminal)
                self.tqdm_base += self.tqdm_total
                self.tqdm_last = 0
            step = self.tqdm_step(n, total)
        if step is not None:
            record["step"] = step
        if self.epoch is not None:
            record["epoch"] = self.epoch
        return self.merger.push(record)

    def tqdm_step(self, n: int, total: int) -> int:
        """The update number of a tqdm count ``n/total``; a bar that restarts each epoch is
        counted on."""
        if n < self.tqdm_last:
            last, bar = self.tqdm_last, self.tqdm_total
            self.tqdm_base += bar if last == bar else last
        self.tqdm_last, self.tqdm_total = n, total
        return self.tqdm_base + n

    def interpret(self, segment: str, found: dict[str, _Hit]) -> Record | None:
        step: int | None = None
        tqdm = _TQDM.search(segment) if "<" in segment else None
        hit = found.get("step")
        printed: int | None = None
        total: int | None = None
        if hit is not None:
            number = float(segment[hit[1] : hit[2]])
            if number == number and abs(number) < 1e15:
                total = int(segment[hit[3] : hit[4]]) if hit[3] >= 0 else None
                printed = int(number)
        elif tqdm is not None:
            step = self.tqdm_step(int(tqdm.group(1)), int(tqdm.group(2)))
        hit_epoch = found.get("epoch")
        if hit_epoch is not None and not self.fractional_epochs:
            text = segment[hit_epoch[1] : hit_epoch[2]]
            if "." in text or "e" in text.lower():
                # 'epoch': 0.05 (the Trainer's fractional epochs): never an epoch count
                self.fractional_epochs = True
                self.epoch = None
            else:
                epoch = float(text)
                if abs(epoch) < 1e15:
                    self.epoch = int(epoch)
        record: Record = {}
        for key in _ROLES:
            hit = found.get(key)
            if hit is not None:
                record[key] = float(segment[hit[1] : hit[2]])
        if not record:
            return None
        if step is None and printed is not None:
            step = self.map_step(printed, total)
        if step is None and hit_epoch is None and set(record) == {"lr"}:
            return None  # "Starting training, lr=0.5", a config dump: no update of its own
        if step is not None:
            record["step"] = step
        elif self.merger.steps_seen and "loss" in record:
            # an epoch summary in a per-update log: keep its validation loss only
            record["extra"] = {"epoch_loss": record.pop("loss")}
        if self.epoch is not None:
            record["epoch"] = self.epoch
        for key in _EXTRAS:
            hit = found.get(key)
            if hit is not None:
                record.setdefault("extra", {})[key] = float(segment[hit[1] : hit[2]])
        return self.merger.push(record)

    def line(self, line: str) -> Iterator[Record]:
        """Read one whole line (``\\r`` and backspace redraws split into segments)."""
        lineno = self.lineno
        if "\x08" in line:
            line = re.sub("\x08+", "\r", line)
        if "\r" in line:
            for segment in line.split("\r"):
                if segment:
                    done = self.segment(lineno, segment)
                    if done is not None:
                        yield done
        else:
            done = self.segment(lineno, line)
            if done is not None:
                yield done


#: A number as the fast path reads it: ASCII digits only, the exact forms the general reader
#: reads as the same number. ``_INT`` is a whole number (a step, an epoch, a count); ``_REAL`` any
#: other finite number; ``_WORD`` nan/inf, allowed only where a value follows a separator.
_INT = r"\d{1,15}+"
_INT_ANY = r"\d++"
_REAL = r"[-+]?+(?>\d++\.\d*+|\.\d++)(?:[eE][-+]?+\d++)?+|[-+]?+\d++[eE][-+]?+\d++|[-+]\d++"
#: a number the general reader takes as a fractional epoch (``'epoch': 0.05``): a point or an
#: exponent in it
_FRAC = r"[-+]?+(?>\d++\.\d*+|\.\d++)(?:[eE][-+]?+\d++)?+|[-+]?+\d++[eE][-+]?+\d++"
_WORD = r"[-+]?+(?:[nN][aA][nN]|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?+)"
_LOOSE = r"[-+.\deE]++"
_PLAIN = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", re.ASCII)
_FRAC_TEXT = re.compile(_FRAC, re.ASCII)
_TOKEN = re.compile(r"(?<![\w.])" + _NUM + r"(?![\w.])", re.IGNORECASE)
#: characters a key may hold that do not stop a number token (``loss/2``, ``5-10``)
_KEY_JOINERS = "/-"
_KEY_WORDS = ("loss", "lr", "norm", "learning", "epoch")


def _piece(text: str, after_token: bool, before_token: bool) -> str:
    """The regex for fixed text between two numbers: exact, except that a run of spaces or
    tabs touching a number may have any length (it never joins two words of a key)."""
    if not text:
        return ""
    if text.strip(" \t") == "" and (after_token or before_token):
        return r"[ \t]++"
    lead = len(text) - len(text.lstrip(" \t")) if after_token else 0
    trail = len(text) - len(text.rstrip(" \t")) if before_token else 0
    core = _fixed(text[lead : len(text) - trail])
    return (r"[ \t]++" if lead else "") + core + (r"[ \t]++" if trail else "")


#: Fixed text that may differ from line to line without changing how the general reader reads
#: the line: digits that start a word glued to letters (Keras' ``ETA: 3s``, ``20ms/step``: never
#: a value, as a value must not run into a letter; no key starts with or after a digit, and
#: after none of ``.``, ``/``, ``-`` a key could hold them) and an ASCII progress bar in
#: brackets (``[=====>......]``: no key, no value, no bracket counter).
_VARIES = re.compile(r"(?<![\w./\-])\d+(?=[A-Za-z])|\[[=>.]+\]")


def _fixed(text: str) -> str:
    """The regex for fixed text (see :data:`_VARIES` for what it lets vary)."""
    parts = []
    at = 0
    for match in _VARIES.finditer(text):
        parts.append(re.escape(text[at : match.start()]))
        parts.append(r"\d++" if match.group()[0] != "[" else r"\[[=>.]++\]")
        at = match.end()
    parts.append(re.escape(text[at:]))
    return "".join(parts)


class _Layout:
    """One line shape found in a sample of the log, compiled into one regex for whole blocks.

    The shape is the sample line with each number replaced by a number of the same kind
    (whole / other finite / nan-inf where that cannot change how the line reads) and runs of
    spaces next to numbers of any length. ``regex.split`` over a block then gives the numbers
    of every line of this shape, a column at a time, and the other lines whole, in order; the
    other lines go through the general per-line reader. The shape is built so that every line
    it matches reads exactly as the general reader reads it (same keys, same roles, no
    framework message, no traceback end); ``tests/logs/test_fast_path.py`` checks that.
    """

    def __init__(
        self,
        pattern: str,
        loose: str,
        roles: list[str],
        exception_safe: bool,
        fractional: bool = False,
    ) -> None:
        self.roles = roles
        #: the exact shape; ``loose`` also lets through value fields that are not numbers
        #: (``float`` then says so, and the block is split again with ``regex``)
        self.regex = re.compile(pattern, re.MULTILINE | re.ASCII)
        self.loose = re.compile(loose, re.MULTILINE | re.ASCII)
        self.step = roles.index("step") if "step" in roles else -1
        #: lines per match: 2 for an ``Epoch N/M`` line and the line of that epoch's values
        self.lines = 1
        #: the layout of the commonest other lines, learnt from them (``depth`` deep at most)
        self.then: _Layout | None = None
        self.depth = 0
        self.prefer: str | None = None
        self.tries = 0
        self.total = roles.index("total") if "total" in roles else -1
        self.epoch = roles.index("epoch") if "epoch" in roles else -1
        self.values = [(key, roles.index(key)) for key in _ROLES if key in roles]
        #: the loss-scaler numbers of the line, read into each record's ``extra``
        self.extras = [(key, roles.index(key)) for key in _EXTRAS if key in roles]
        #: False when a line of this shape could end a pending traceback (then blocks read
        #: while one is pending go through the general reader)
        self.exception_safe = exception_safe
        #: True when the lines print a fractional epoch (``'epoch': 0.05``, the Trainer's): the
        #: general reader then never takes an epoch count from any line again
        self.fractional = fractional
        self.fast_lines = 0

    @staticmethod
    def of(segment: str, found: dict[str, _Hit]) -> _Layout | None:
        """The layout of one line with values (None for shapes we keep general): with a printed
        step; else with an epoch count (an epoch log); else with a loss (the lines are counted,
        as the general reader counts them: Keras' ``12/100 [===] - loss: 0.5``, the Trainer's
        ``{'loss': 0.5, ..., 'epoch': 0.05}``)."""
        if "step" not in found:
            if "<" in segment:
                return None  # a tqdm bar's count would be the step
            if "loss" not in found and "epoch" not in found:
                return None  # an eval-only line joins the update before it: kept general
        shape = _shape(segment, found)
        if shape is None:
            return None
        strict, loose, roles, safe, fractional = shape
        if "step" not in roles and "epoch" not in roles and "loss" not in roles:
            return None  # (a fractional epoch is no epoch count)
        if "step" not in roles and any(key in roles for key in _EXTRAS):
            return None  # loss-scaler numbers without a step: kept general (rare)
        return _Layout("^" + strict, "^" + loose, roles, safe, fractional)

    @staticmethod
    def of_pair(
        header: str, header_found: dict[str, _Hit], line: str, found: dict[str, _Hit]
    ) -> _Layout | None:
        """The layout of Keras' file output: an ``Epoch 3/10`` line that only sets the epoch,
        then one line with the epoch's values and no step (``100/100 - 2s - loss: 0.5``)."""
        if set(header_found) != {"epoch"} or "step" in found or "epoch" in found:
            return None
        if "<" in line:
            return None  # a tqdm bar's count would be the step
        first = _shape(header, header_found)
        second = _shape(line, found)
        if first is None or second is None or first[4] or second[4]:
            return None
        if any(key in second[2] for key in _EXTRAS):
            return None
        layout = _Layout(
            "^" + first[0] + second[0],
            "^" + first[1] + second[1],
            first[2] + second[2],
            first[3] and second[3],
        )
        layout.lines = 2
        return layout

    def read(self, state: _State, block: str) -> list[Record]:
        """Records of one block of whole lines: runs of lines of this layout are converted a
        column at a time; every other line goes through the general reader, in order."""
        out: list[Record] = []
        if not self.exception_safe and (
            state.traceback is not None or "Traceback (most recent call last)" in block
        ):
            self.fast_lines = 0
            _general(state, out, block)
            return out
        width = len(self.roles) + 1
        parts = self.loose.split(block)
        cols = self._convert(parts, width)
        if cols is None:
            # a value the loose pattern let through is not a number: the exact pattern
            # leaves such lines to the general reader
            parts = self.regex.split(block)
            cols = self._convert(parts, width)
            if cols is None:  # cannot happen (exact numbers only); never fail a read on it
                self.fast_lines = 0
                _general(state, out, block)
                return out
        seps = parts[::width]
        matched = len(seps) - 1
        lines = self.lines
        fast_lines = matched * lines
        if self.step >= 0:
            run = self._run
        else:
            run = self._run_counted if self.epoch < 0 else self._run_epochs
        others = list(compress(range(matched + 1), seps))
        then = self.then
        if then is None and self.depth < 2 and self.tries < 4 and others:
            # many lines of another shape (eval lines between train lines, or the log changed
            # shape): learn it too, from the long runs of other lines first (odd lines of this
            # shape that did not match could hide it), then from all of them
            rest = "".join(seps)
            rest_lines = rest.count("\n")
            if rest_lines > 20 and rest_lines * 10 > block.count("\n"):
                self.tries += 1
                runs = "".join(sep for sep in seps if sep.count("\n") >= 8)
                if runs and len(runs) < len(rest):
                    then = _find_layout(runs, self.depth + 1, self.prefer)
                if then is None:
                    then = _find_layout(rest, self.depth + 1, self.prefer)
                self.then = then
        line_at = state.lineno
        start = 0
        for index in others:
            if index > start:
                run(state, out, cols, start, index)
                line_at += (index - start) * lines
            state.lineno = line_at
            if then is None:
                line_at += _general(state, out, seps[index])
            else:
                out.extend(then.read(state, seps[index]))
                fast_lines += then.fast_lines
                line_at = state.lineno
            start = index
        if matched > start:
            run(state, out, cols, start, matched)
            line_at += (matched - start) * lines
        state.lineno = line_at
        self.fast_lines = fast_lines
        return out

    def _convert(self, parts: list[str], width: int) -> list[list[Any]] | None:
        """The numbers of every matched line, a column per role; None when one is not a
        number (only possible with the loose pattern)."""
        try:
            return [
                _ints(parts[i::width])
                if role in ("step", "epoch", "total")
                else list(map(float, parts[i::width]))
                for i, role in enumerate(self.roles, 1)
            ]
        except ValueError:
            return None

    def _run(
        self, state: _State, out: list[Record], cols: Sequence[list[Any]], start: int, end: int
    ) -> None:
        """Records of lines ``start:end`` (all of this layout) a column at a time, as the
        general reader would read them one by one."""
        merger = state.merger
        if self.fractional and not state.fractional_epochs:
            state.fractional_epochs = True  # what the first of these lines does
            state.epoch = None
        printed: list[int] = cols[self.step][start:end]
        pending = merger.pending
        mapped = (
            None
            if self.epoch >= 0 and state.fractional_epochs
            else self._steps(state, cols, start, end)
        )
        if mapped is None or (pending is not None and pending["step"] == mapped[0][0]):
            self._one_by_one(state, out, cols, start, end)
            return
        steps, state.step_base = mapped
        keys = [key for key, _ in self.values]
        columns: list[list[Any]] = [cols[i][start:end] for _, i in self.values]
        keys.append("step")
        columns.append(steps)
        if self.epoch >= 0:
            epochs = cols[self.epoch][start:end]
            state.epoch = epochs[-1]
            keys.append("epoch")
            columns.append(epochs)
        elif state.epoch is not None:
            keys.append("epoch")
            columns.append([state.epoch] * len(printed))
        if self.extras:
            records = make_records(keys, columns)
            extras = [cols[i][start:end] for _, i in self.extras]
            names = [key for key, _ in self.extras]
            for record, values in zip(records, zip(*extras)):
                record["extra"] = dict(zip(names, values))
            flag_nonfinite(records, keys, columns)
            merger.hold_last(records, out)
        else:
            merger.hold_columns(keys, columns, out)
        state.last_printed = printed[-1]
        state.last_total = cols[self.total][end - 1] if self.total >= 0 else None
        state.last_epoch = state.epoch
        merger.steps_seen = True
        merger.epochs_only = False

    def _steps(
        self, state: _State, cols: Sequence[list[Any]], start: int, end: int
    ) -> tuple[list[int], int] | None:
        """The update numbers of lines ``start:end`` as :meth:`_State.map_step` gives them one
        by one (a counter that restarts each epoch is counted on), and the step base after them;
        None when two lines in a row would have the same step (the merger merges those: line by
        line then) or the numbers grow too large for int64."""
        printed: list[int] = cols[self.step][start:end]
        base = state.step_base
        last = state.last_printed
        if (last is None or printed[0] >= last) and (len(printed) == 1 or _increasing(printed)):
            if last is not None and printed[0] == last:
                pass  # (a repeat of the line before: the checks below)
            else:
                return (printed if base == 0 else [p + base for p in printed]), base
        if abs(base) > 1 << 60 or (last is not None and abs(last) > 1 << 50):
            return None
        now = np.array(printed, dtype=np.int64)
        before = np.empty_like(now)
        before[1:] = now[:-1]
        before[0] = now[0] if last is None else last
        down = now < before
        lap = np.full_like(now, -1)
        has_lap = np.zeros(len(now), dtype=bool)
        if self.total >= 0:
            reset = down  # a count with a total ("[50/3862]"): it restarts when it falls
            totals = cols[self.total][start:end]
            lap[1:] = totals[:-1]
            has_lap[1:] = True
            if state.last_total is not None:
                lap[0], has_lap[0] = state.last_total, True
        else:
            changed = np.zeros(len(now), dtype=bool)  # it restarts when it falls in a new epoch
            if self.epoch >= 0:
                epochs = np.array(cols[self.epoch][start:end], dtype=np.int64)
                changed[1:] = epochs[1:] != epochs[:-1]
                changed[0] = state.last_epoch != cols[self.epoch][start]
            else:
                changed[0] = state.epoch != state.last_epoch
            reset = down & changed
        if reset.any():
            adds = np.where(has_lap & (lap >= before), lap, before)
            adds[~reset] = 0
            if int(adds.max()) * len(now) > 1 << 61:
                return None
            offsets = np.cumsum(adds)
            steps = now + offsets + base
            new_base = base + int(offsets[-1])
        else:
            steps = now + base
            new_base = base
        if len(steps) > 1 and not bool((steps[1:] != steps[:-1]).all()):
            return None
        return steps.tolist(), new_base

    def _run_epochs(
        self, state: _State, out: list[Record], cols: Sequence[list[Any]], start: int, end: int
    ) -> None:
        """Records of ``Epoch N/M`` + values pairs ``start:end``, as the general reader reads
        them: the header sets the epoch, the values line is that epoch's record."""
        merger = state.merger
        epochs: list[int] = cols[self.epoch][start:end]
        pending = merger.pending
        if (
            state.fractional_epochs
            or merger.steps_seen
            or (pending is not None and pending["step"] >= epochs[0])
            or (len(epochs) > 1 and not _increasing(epochs))
        ):
            epoch_column = None if state.fractional_epochs else self.epoch
            self._push_each(state, out, cols, start, end, epoch_column)
            return
        state.epoch = epochs[-1]
        keys = [key for key, _ in self.values] + ["epoch", "step"]
        columns = [cols[i][start:end] for _, i in self.values] + [epochs, epochs]
        merger.hold_columns(keys, columns, out)

    def _push_each(
        self,
        state: _State,
        out: list[Record],
        cols: Sequence[list[Any]],
        start: int,
        end: int,
        epoch_column: int | None,
    ) -> None:
        """Lines ``start:end`` pushed to the merger one by one, as the general reader reads them:
        a loss after steps were seen is an epoch's loss, the epoch (from ``epoch_column`` when
        given, else the one before) goes into each record."""
        merger = state.merger
        push = merger.push
        for i in range(start, end):
            if epoch_column is not None:
                state.epoch = cols[epoch_column][i]
            record: Record = {key: cols[index][i] for key, index in self.values}
            if merger.steps_seen and "loss" in record:
                record["extra"] = {"epoch_loss": record.pop("loss")}
            if state.epoch is not None:
                record["epoch"] = state.epoch
            done = push(record)
            if done is not None:
                out.append(done)

    def _run_counted(
        self, state: _State, out: list[Record], cols: Sequence[list[Any]], start: int, end: int
    ) -> None:
        """Records of lines ``start:end`` with a loss but no step and no epoch count: the
        merger numbers them on from the records before (``step`` = records so far + 1)."""
        merger = state.merger
        if self.fractional and not state.fractional_epochs:
            state.fractional_epochs = True  # what the first of these lines does
            state.epoch = None
        pending = merger.pending
        count = merger.count
        if state.epoch is not None and not merger.steps_seen:
            # lines under an ``Epoch N/M`` header (Keras' progress written to a file): each is
            # that epoch's record so far (step = the epoch), merged into one; the last wins
            epoch = state.epoch
            merged: Record = {key: cols[index][end - 1] for key, index in self.values}
            merged["epoch"] = epoch
            merged["step"] = epoch
            if pending is not None and pending["step"] == epoch:
                pending.update(merged)
            else:
                if pending is not None:
                    out.append(mark_nonfinite(pending))
                merger.pending = merged
                merger.count += 1
            return
        if (
            merger.steps_seen
            or state.epoch is not None
            or (pending is not None and pending["step"] == count + 1)
        ):
            # a loss line in a per-update log (an epoch summary), an epoch from a line before,
            # a merge with the pending record: as the general reader does it, line by line
            self._push_each(state, out, cols, start, end, None)
            return
        keys = [key for key, _ in self.values] + ["step"]
        columns = [cols[i][start:end] for _, i in self.values]
        columns.append(list(range(count + 1, count + 1 + end - start)))
        merger.hold_columns(keys, columns, out)
        merger.epochs_only = False

    def _one_by_one(
        self, state: _State, out: list[Record], cols: Sequence[list[Any]], start: int, end: int
    ) -> None:
        """What :meth:`_State.interpret` does with each line (counters that restart, merges)."""
        push = state.merger.push
        for i in range(start, end):
            if self.epoch >= 0 and not state.fractional_epochs:
                state.epoch = cols[self.epoch][i]
            record: Record = {key: cols[index][i] for key, index in self.values}
            total = cols[self.total][i] if self.total >= 0 else None
            record["step"] = state.map_step(cols[self.step][i], total)
            if state.epoch is not None:
                record["epoch"] = state.epoch
            if self.extras:
                record["extra"] = {key: cols[index][i] for key, index in self.extras}
            done = push(record)
            if done is not None:
                out.append(done)


def _shape(segment: str, found: dict[str, _Hit]) -> tuple[str, str, list[str], bool, bool] | None:
    """One line as regexes (exact, and loose on values), the roles of their groups in order,
    whether such a line can never end a pending traceback, and whether it prints a fractional
    epoch (not captured); None for lines we keep general.
    """
    if "\r" in segment or "\x08" in segment:
        return None
    captured: dict[tuple[int, int], str] = {}
    for key, hit in found.items():
        if key in ("step", "epoch", *_VALUES):
            captured[(hit[1], hit[2])] = key
            if key == "step" and hit[3] >= 0:
                captured[(hit[3], hit[4])] = "total"
    tokens = [m.span() for m in _TOKEN.finditer(segment)]
    if not set(captured) <= set(tokens):
        return None
    pieces: list[str] = []
    parts: list[str] = []
    loose: list[str] = []
    roles: list[str] = []
    fractional = False
    at = 0
    for number, (start, end) in enumerate(tokens):
        text = segment[start:end]
        if not text.isascii() or _PLAIN.fullmatch(text) is None:
            return None  # nan/inf or non-ASCII digits in the sample: not a template line
        whole = text.isdigit()
        if (
            start
            and segment[start - 1] in _KEY_JOINERS
            and (number == 0 or at != start - 1 or not whole)
        ):
            return None  # "loss/2": a key could run into the number
        role = captured.get((start, end))
        token = (_INT if role in ("step", "epoch", "total") else _INT_ANY) if whole else _REAL
        if role == "epoch" and not whole:
            if _FRAC_TEXT.fullmatch(text) is None:
                return None  # "+5": an epoch count to the general reader, not a fraction
            role, token, fractional = None, _FRAC, True
        if role in ("step", "total") and not whole:
            return None
        piece = segment[at:start]
        pieces.append(piece)
        parts.append(_piece(piece, number > 0, True))
        loose.append(parts[-1])
        word = role in _VALUES and not whole and _word_allowed(segment, start, end)
        if word:
            token += "|" + _WORD
        if role is None:
            parts.append("(?:" + token + ")")
            # a value only skipped, never read: in the loose pattern any run of number
            # characters (fewer steps of the regex engine on lines of many values; a token is
            # never followed by a word character or ".", and _loose_ok rules out the rest)
            skip_loose = not whole and _loose_ok(segment, start, end)
            loose.append("(?:" + _LOOSE + ")" if skip_loose else parts[-1])
        elif role in _VALUES and _loose_ok(segment, start, end):
            # a value where whole and other numbers read alike: either kind in the exact
            # pattern; in the loose one any run of number characters (float() then checks it)
            parts.append("(" + _REAL + "|" + _INT_ANY + ("|" + _WORD if word else "") + ")")
            roles.append(role)
            loose.append("(" + _LOOSE + ("|" + _WORD if word else "") + ")")
        else:
            parts.append("(" + token + ")")
            roles.append(role)
            loose.append(parts[-1])
        at = end
    pieces.append(segment[at:])
    parts.append(_piece(segment[at:], bool(tokens), False) + r"\r?\n")
    loose.append(parts[-1])
    lowered = [piece.lower() for piece in pieces]
    if any(_has_message(piece) for piece in lowered):
        return None
    if not any(word in piece for piece in lowered for word in _KEY_WORDS):
        return None  # the general reader's key-word filter must pass on every such line
    return "".join(parts), "".join(loose), roles, _exception_safe(pieces[0]), fractional


def _ints(texts: list[str]) -> list[int]:
    """``int`` of each text. A column that repeats (an epoch count, a printed total: the same
    on every line of an epoch) is converted once per distinct value, as seen in a sample;
    ``int`` of a string costs more than a dict lookup."""
    sample = texts[::32]
    if len(set(sample)) * 4 <= len(sample):
        known = {text: int(text) for text in set(texts)}
        return list(map(known.__getitem__, texts))
    return list(map(int, texts))


def _increasing(values: list[int]) -> bool:
    array = np.array(values)
    return bool((array[1:] > array[:-1]).all())


def _general(state: _State, out: list[Record], text: str) -> int:
    """Read the whole lines of ``text`` with the general reader; the number of lines."""
    lines = text.split("\n")
    lines.pop()
    for number, line in enumerate(lines, state.lineno + 1):
        state.lineno = number
        out.extend(state.line(line))
    return len(lines)


def _word_allowed(segment: str, start: int, end: int) -> bool:
    """Whether a value printed at ``start:end`` may be nan/inf in other lines of the shape:
    only after a separator (``loss: nan``, ``loss=inf``), never as a word the general reader
    could join to a key (``loss nan``) or to a framework message (``returned nan``)."""
    before = segment[:start].rstrip(" \t")
    after = segment[end:]
    if not before or before[-1] in "/.-'\"":
        return False
    # "loss nan": the general reader tries the two-word key "loss nan" first; it falls back
    # to "loss" = nan only when no value can follow ("loss nan | lr", the end of the line)
    if (before[-1].isalnum() or before[-1] == "_") and after.lstrip(" \t")[:1] not in (
        "",
        *",;|)}",
    ):
        return False
    for word in ("nan", "inf", "infinity"):
        text = before + " " + word + (" " + after.lstrip(" \t") if after[:1] in " \t" else after)
        if _has_message(text.lower()):
            return False
    return True


def _loose_ok(segment: str, start: int, end: int) -> bool:
    """Whether the value at ``start:end`` may be matched as any run of number characters
    (then checked by ``float``): any number, whole or not, reads the same there, as it is not
    in a count (``[5/10]``, ``5/10``) and nothing after it could be taken into the run."""
    before = segment[:start].rstrip(" \t")[-1:]
    after = segment[end:].lstrip(" \t")[:1]
    return (
        before not in ("[", "/")
        and after not in ("]", "/")
        and segment[end : end + 1]
        not in (
            "+",
            "-",
        )
    )


def _exception_safe(first: str) -> bool:
    """True when no line starting with ``first`` (then a number) can be the exception line
    that ends a traceback (:data:`_EXCEPTION_LINE`)."""
    if not first or not (first[0].isascii() and (first[0].isalpha() or first[0] == "_")):
        return True  # an exception line starts with a letter (a layout line is never all \w)
    for index in range(1, len(first)):
        char = first[index]
        if not (char.isalnum() or char in "_."):
            return _EXCEPTION_LINE.match(first[: index + 1]) is None
    return False


#: Lines looked at to find a layout; the commonest shape must cover this share of the first
#: lines with values (lines of other shapes cost one regex pass, then the general reader).
_SAMPLE_LINES = 2000
_COVERAGE = 0.25


def _find_layout(block: str, depth: int = 0, prefer: str | None = None) -> _Layout | None:
    """The commonest line shape with a printed step in the first lines of ``block``, checked
    against the general reader on every sampled line it matches."""
    lines = block.split("\n", _SAMPLE_LINES)[:_SAMPLE_LINES]
    parsed: list[tuple[str, dict[str, _Hit]]] = []
    shapes: dict[str, tuple[int, _Layout]] = {}
    header: tuple[str, dict[str, _Hit]] | None = None  # the line before, if it set an epoch
    for line in lines:
        line = line.rstrip("\r")
        if "\r" in line or "\x08" in line or _has_message(line.lower()):
            header = None
            continue
        found, val_mode = _parse(line, prefer)
        before, header = header, None
        if val_mode or not found:
            continue
        if not any(key in found for key in _ROLES):
            header = (line, found) if set(found) == {"epoch"} else None
            continue
        layout = None
        if before is not None:
            layout = _Layout.of_pair(*before, line, found)
            if layout is not None:
                line, found = before[0] + "\n" + line, _pair_hits(before, found)
        parsed.append((line, found))
        if len(parsed) > 64:
            continue  # enough shapes seen; the rest of the sample only checks the winner
        if layout is None:
            layout = _Layout.of(line, found)
        if layout is not None:
            count, _ = shapes.get(layout.regex.pattern, (0, layout))
            shapes[layout.regex.pattern] = (count + 1, layout)
    if not shapes:
        return None
    count, layout = max(shapes.values(), key=lambda item: item[0])
    if count < max(2, _COVERAGE * min(len(parsed), 65)):
        return None
    matched = 0
    for line, found in parsed:
        groups = layout.regex.fullmatch(line + "\n")
        if groups is None:
            continue
        matched += 1
        for key, index in zip(layout.roles, range(1, len(layout.roles) + 1)):
            hit = found.get("step" if key == "total" else key)
            if hit is None:
                return None
            span = (hit[3], hit[4]) if key == "total" else (hit[1], hit[2])
            if groups.span(index) != span:
                return None
        if len(layout.values) + len(layout.extras) != sum(1 for key in _VALUES if key in found):
            return None
    if not matched:
        return None
    layout.depth = depth
    layout.prefer = prefer
    return layout


def _pair_hits(header: tuple[str, dict[str, _Hit]], found: dict[str, _Hit]) -> dict[str, _Hit]:
    """The hits of a header + values pair, as spans in the two lines joined by a newline."""
    shift = len(header[0]) + 1
    hits = dict(header[1])
    for key, (rank, start, end, a, b) in found.items():
        hits[key] = (
            rank,
            start + shift,
            end + shift,
            a + shift if a >= 0 else a,
            b + shift if b >= 0 else b,
        )
    return hits


def finest_counter(lines: Iterable[str]) -> str | None:
    """The counter key to read as the step when lines print several (``iter 7 step 2``): the
    one that rises most often from line to line, the finest-grained (micro-batches rather than
    optimizer steps, updates rather than epochs); None when no line prints two, or when the
    usual preference (``step`` before ``iter``...) already picks the finest."""
    last: dict[str, float] = {}
    rises: dict[str, int] = {}
    ranks: dict[str, int] = {}
    for line in lines:
        if len(line) > 4096:
            continue
        keys: dict[str, float] = {}
        for match in _PAIR.finditer(line):
            key = match.group("key")
            role = role_of(key)
            if role is not None and role[0] == "step":
                norm = normalise_key(key)
                if norm not in keys:
                    keys[norm] = float(match.group("val"))
                    ranks[norm] = role[1]
        if len(keys) < 2:
            continue
        for key, value in keys.items():
            if key in last and value > last[key]:
                rises[key] = rises.get(key, 0) + 1
            rises.setdefault(key, 0)
            last[key] = value
    if not rises:
        return None
    usual = min(rises, key=lambda k: ranks[k])
    finest = max(rises, key=lambda k: (rises[k], -ranks[k]))
    return finest if rises[finest] > rises[usual] else None


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    # a chain over lists of records: no Python frame is resumed per record
    return chain.from_iterable(map(expand, iter_chunks(path, meta)))


def iter_chunks(path: Path, meta: dict[str, Any]) -> Iterator[list[Any]]:
    """The records as lists of records and :class:`~nanscope.logs._common.Columns` (rows not
    yet made into dicts), in order; :func:`iter_records` makes them all dicts."""
    return _record_lists(path, meta)


def _record_lists(path: Path, meta: dict[str, Any]) -> Iterator[list[Any]]:
    state = _State(meta)
    layout: _Layout | None = None
    tries = 0
    first = True
    for block in iter_blocks(path, meta, split_cr=True):
        if first:
            first = False
            state.prefer = finest_counter(block.split("\n", _SAMPLE_LINES)[:_SAMPLE_LINES])
        if layout is None and tries < 8:
            tries += 1
            layout = _find_layout(block, prefer=state.prefer)
        out: list[Record] = []
        if layout is not None:
            out = layout.read(state, block)
            if layout.fast_lines * 4 < block.count("\n"):
                layout, tries = None, 0  # the log changed shape: look again
        else:
            _general(state, out, block)
        yield out
    last = state.merger.close()
    if last is not None:
        yield [last]
    total = state.merger.count
    for entry in state.messages:
        if "_at" in entry:
            entry["ends_run"] = entry.pop("_at") >= total
    meta["messages"] = state.messages
    if state.counts:
        meta["message_counts"] = dict(state.counts)
