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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from nanscope.logs._common import MAX_MESSAGES, Merger, Record, iter_lines, role_of, to_float

NAME = "text"
DESCRIPTION = "plain training output (Keras progress, Epoch N/M blocks, step/iter loops, tqdm)"

_NUM = r"[-+]?(?:nan|inf(?:inity)?|(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)"
_PAIR = re.compile(
    r"(?<![\w/.'\"])['\"]?(?P<key>[a-z_][\w/.\-]*(?: [a-z_][\w/.\-]*)?)['\"]?"
    r"\s*(?:[:=]|\s)\s*\[?(?:tensor\(|array\()?(?P<val>" + _NUM + r")(?![\w.])",
    re.IGNORECASE,
)
_TQDM = re.compile(r"(\d+)/(\d+) \[(?:\d+:)?\d+:\d+<")
_SCALE = re.compile(r"reducing (?:loss )?(?:scale )?to:?\s*(\d[\d.e+]*)", re.IGNORECASE)

#: kind -> what it means. ``meta["messages"]`` entries are
#: ``{"line", "step", "kind", "text"}`` plus ``"op"`` (anomaly), ``"scale"`` (loss scale it was
#: reduced to), ``"exception"`` and ``"ends_run"`` (traceback).
MESSAGE_KINDS: dict[str, str] = {
    "loss_scale_overflow": "the fp16 loss scaler found inf/NaN gradients and skipped the step",
    "loss_scale_min": "the loss scale cannot go lower: fp16 gradients overflow at every scale",
    "anomaly": "autograd anomaly mode named the backward function that produced NaN",
    "oom": "the run ran out of (GPU) memory",
    "nccl": "a distributed (NCCL) error or collective timeout",
    "traceback": "a Python traceback (ends_run: no training line came after it)",
    "terminate_on_nan": "Keras TerminateOnNaN stopped the fit on an invalid loss",
}

_MESSAGE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loss_scale_min", re.compile(r"loss scale (?:is )?already at minimum", re.I)),
    (
        "loss_scale_overflow",
        re.compile(
            r"gradient overflow|OVERFLOW!.*skipping step|attempted loss scale|"
            r"reducing loss scale to|overflow detected, skipping",
            re.I,
        ),
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
def _has_message(low: str) -> bool:
    # spelled out (not any(...)): this runs on every line
    return (
        "overflow" in low
        or "nccl" in low
        or "traceback" in low
        or "loss scale" in low
        or "memory" in low
        or "returned nan" in low
        or "error detected in" in low
        or "resource_exhausted" in low
        or "invalid loss" in low
    )


_EXCEPTION_LINE = re.compile(
    r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)\b.*|^\w+Error$"
)


def _pairs(segment: str) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    for match in _PAIR.finditer(segment):
        role = role_of(match.group("key"))
        if role is None:
            continue
        name, rank = role
        if name not in found or rank < found[name][0]:
            found[name] = (rank, match.group("val"))
    return found


def looks_like(lines: Iterable[str]) -> bool:
    """True when some line carries a loss value, an ``Epoch N/M`` header or a numerics message."""
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
    return False


class _State:
    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.merger = Merger(meta)
        self.epoch: int | None = None
        self.fractional_epochs = False
        self.tqdm_base = 0
        self.tqdm_last = 0
        self.tqdm_total = 0
        self.messages: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}
        self.emitted = 0
        self.traceback: dict[str, Any] | None = None

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
            elif kind == "loss_scale_overflow":
                scale = _SCALE.search(segment)
                if scale is not None:
                    value = to_float(scale.group(1))
                    if value is not None:
                        extra["scale"] = value
            entry = self.message(lineno, kind, segment, **extra)
            if kind == "traceback":
                self.traceback = entry
                entry["_at"] = self.merger.count
            return

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
        if not (
            "loss" in low or "lr" in low or "norm" in low or "learning" in low or "epoch" in low
        ):
            return None
        found = _pairs(segment)
        if not found:
            return None
        step: int | None = None
        tqdm = _TQDM.search(segment) if "<" in segment else None
        if "step" in found:
            number = float(found["step"][1])
            if number == number and abs(number) < 1e15:
                step = int(number)
        elif tqdm is not None:
            n, total = int(tqdm.group(1)), int(tqdm.group(2))
            if n < self.tqdm_last:
                self.tqdm_base += (
                    self.tqdm_total if self.tqdm_last == self.tqdm_total else self.tqdm_last
                )
            self.tqdm_last, self.tqdm_total = n, total
            step = self.tqdm_base + n
        if "epoch" in found and not self.fractional_epochs:
            text = found["epoch"][1]
            if "." in text or "e" in text.lower():
                # 'epoch': 0.05 (the Trainer's fractional epochs): never an epoch count
                self.fractional_epochs = True
                self.epoch = None
            else:
                number = float(text)
                if abs(number) < 1e15:
                    self.epoch = int(number)
        record: Record = {}
        for key in ("loss", "val_loss", "lr", "grad_norm"):
            if key in found:
                record[key] = float(found[key][1])
        if not record:
            return None
        if step is not None:
            record["step"] = step
        elif self.merger.steps_seen and "loss" in record:
            # an epoch summary in a per-update log: keep its validation loss only
            record["extra"] = {"epoch_loss": record.pop("loss")}
        if self.epoch is not None:
            record["epoch"] = self.epoch
        return self.merger.push(record)


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    state = _State(meta)
    segment_of = state.segment
    for lineno, line in enumerate(iter_lines(path, meta), start=1):
        if "\x08" in line:
            line = re.sub("\x08+", "\r", line)
        if "\r" in line:
            for segment in line.split("\r"):
                if segment:
                    done = segment_of(lineno, segment)
                    if done is not None:
                        yield done
        else:
            done = segment_of(lineno, line)
            if done is not None:
                yield done
    last = state.merger.close()
    if last is not None:
        yield last
    total = state.merger.count
    for entry in state.messages:
        if "_at" in entry:
            entry["ends_run"] = entry.pop("_at") >= total
    meta["messages"] = state.messages
    if state.counts:
        meta["message_counts"] = dict(state.counts)
