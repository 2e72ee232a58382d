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
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.logs._common import (
    MAX_MESSAGES,
    Merger,
    Record,
    iter_blocks,
    make_records,
    mark_nonfinite,
    role_of,
    to_float,
)

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
_MESSAGE_WORDS = (
    "overflow", "nccl", "traceback", "loss scale", "out of memory", "outofmemory",
    "returned nan", "error detected in", "resource_exhausted", "invalid loss",
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
    )


_EXCEPTION_LINE = re.compile(
    r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)\b.*|^\w+Error$"
)


#: Where one value sits in a segment: (rank, start, end, total start, total end); the total is
#: the ``600`` of ``Step [100/600]`` (-1, -1 when none).
_Hit = tuple[int, int, int, int, int]
_ROLES = ("loss", "val_loss", "lr", "grad_norm")
_VAL_MODES = frozenset({"val", "valid", "validation", "eval", "test"})


def _pairs(segment: str) -> dict[str, _Hit]:
    found: dict[str, _Hit] = {}
    for match in _PAIR.finditer(segment):
        role = role_of(match.group("key"))
        if role is None:
            continue
        name, rank = role
        if name not in found or rank < found[name][0]:
            start, end = match.span("val")
            found[name] = (rank, start, end, *match.span("tot"))
    return found


def _parse(segment: str) -> tuple[dict[str, _Hit], bool]:
    """The values of one segment by role, and whether it is a validation line (``Epoch(val)``)."""
    found = _pairs(segment)
    if "[" not in segment:
        return found, False
    brackets = _BRACKETS.search(segment)
    if brackets is None:
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
        self.step_base = 0
        self.last_printed: int | None = None
        self.last_total: int | None = None
        self.last_epoch: int | None = None
        self.messages: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}
        self.traceback: dict[str, Any] | None = None
        self.lineno = 0

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
        if not (
            "loss" in low or "lr" in low or "norm" in low or "learning" in low or "epoch" in low
        ):
            return None
        found, _ = _parse(segment)
        if not found:
            return None
        return self.interpret(segment, found)

    def interpret(self, segment: str, found: dict[str, _Hit]) -> Record | None:
        step: int | None = None
        tqdm = _TQDM.search(segment) if "<" in segment else None
        hit = found.get("step")
        if hit is not None:
            number = float(segment[hit[1] : hit[2]])
            if number == number and abs(number) < 1e15:
                total = int(segment[hit[3] : hit[4]]) if hit[3] >= 0 else None
                printed = int(number)
        elif tqdm is not None:
            n, total = int(tqdm.group(1)), int(tqdm.group(2))
            if n < self.tqdm_last:
                self.tqdm_base += (
                    self.tqdm_total if self.tqdm_last == self.tqdm_total else self.tqdm_last
                )
            self.tqdm_last, self.tqdm_total = n, total
            step = self.tqdm_base + n
        hit_epoch = found.get("epoch")
        if hit_epoch is not None and not self.fractional_epochs:
            text = segment[hit_epoch[1] : hit_epoch[2]]
            if "." in text or "e" in text.lower():
                # 'epoch': 0.05 (the Trainer's fractional epochs): never an epoch count
                self.fractional_epochs = True
                self.epoch = None
            else:
                number = float(text)
                if abs(number) < 1e15:
                    self.epoch = int(number)
        record: Record = {}
        for key in _ROLES:
            hit = found.get(key)
            if hit is not None:
                record[key] = float(segment[hit[1] : hit[2]])
        if not record:
            return None
        if step is None and "step" in found and number == number and abs(number) < 1e15:
            step = self.map_step(printed, total)
        if step is not None:
            record["step"] = step
        elif self.merger.steps_seen and "loss" in record:
            # an epoch summary in a per-update log: keep its validation loss only
            record["extra"] = {"epoch_loss": record.pop("loss")}
        if self.epoch is not None:
            record["epoch"] = self.epoch
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


class _Layout:
    """One line shape found in a sample of the log, compiled into a regex for whole blocks.

    Lines of that shape (``step 120 | loss 0.52 | lr 1e-3 | 9.8 it/s``) are read straight from
    the regex groups; every other line goes through the general per-line reader. A shape is only
    used when it gives exactly what the general reader gives on every sampled line it matches.
    """

    def __init__(self, pattern: str, roles: list[str]) -> None:
        self.roles = roles
        # the catch-all alternative hands every other line to the general reader, in order
        self.regex = re.compile(r"(?:" + pattern + r")\r?\n|([^\n]*)\n")
        self.step = roles.index("step")
        self.total = roles.index("total") if "total" in roles else -1
        self.epoch = roles.index("epoch") if "epoch" in roles else -1
        self.values = [(key, roles.index(key)) for key in _ROLES if key in roles]
        self.fast_lines = 0
        self.pieces: list[str] | None = None
        self.n_fields = 0
        self.field_of: list[int] = []

    @staticmethod
    def of(segment: str, found: dict[str, _Hit]) -> _Layout | None:
        """The layout of a line read with a printed step (None for shapes we keep general)."""
        if "step" not in found or "\r" in segment or "\x08" in segment or "<" in segment:
            return None
        spans: list[tuple[int, int, str]] = []
        for key, hit in found.items():
            if key not in ("step", "epoch", *_ROLES):
                continue
            spans.append((hit[1], hit[2], key))
            if key == "step" and hit[3] >= 0:
                spans.append((hit[3], hit[4], "total"))
        spans.sort()
        parts: list[str] = []
        roles: list[str] = []
        at = 0
        for start, end, key in spans:
            if start < at:
                return None
            text = segment[start:end]
            if key in ("step", "total", "epoch"):
                if not text.isdigit():
                    return None
                parts.append(_literal(segment[at:start]) + r"(\d+)")
            else:
                parts.append(_literal(segment[at:start]) + "(" + _FAST_NUM + ")")
            roles.append(key)
            at = end
        parts.append(_literal(segment[at:]))
        layout = _Layout("".join(parts), roles)
        layout.plan_tokens(segment, [(start, end) for start, end, _ in spans])
        return layout

    def plan_tokens(self, segment: str, captured: list[tuple[int, int]]) -> None:
        """The exact text between the numbers of the sample line, for the str-method path:
        every number (captured or not) is a field, the text between them a fixed piece."""
        spans = sorted(
            {*captured}
            | {
                m.span()
                for m in _LITERAL_TOKEN.finditer(segment)
                if m.group()[0] not in " \t"
                and not any(a <= m.start() < b or m.start() <= a < m.end() for a, b in captured)
            }
        )
        pieces = []
        at = 0
        for start, end in spans:
            pieces.append(segment[at:start])
            at = end
        pieces.append(segment[at:])
        mids = pieces[1:-1]
        if (
            any(not piece for piece in mids)
            or _SEP in segment
            or any(piece in pieces[0] or piece in pieces[-1] for piece in mids)
        ):
            return  # a piece hiding in the line's ends: the regex path is safer
        where = {span: index for index, span in enumerate(spans)}
        self.pieces = pieces
        self.n_fields = len(spans)
        self.field_of = [where[span] for span in captured]  # role index -> field index

    def read(self, state: _State, block: str) -> list[Record]:
        """Records of one block of whole lines: runs of lines of this layout are converted a
        column at a time; every other line goes through the general reader, in order."""
        out: list[Record] = []
        plan = self._token_plan(block)
        if plan is not None:
            self._read_tokens(state, out, *plan)
            return out
        rows = self.regex.findall(block)
        if not rows:
            return out
        cols = list(zip(*rows))
        steps = cols[self.step]
        lineno = state.lineno
        others = [i for i, text in enumerate(steps) if not text] if "" in steps else []
        self.fast_lines = len(rows) - len(others)
        start = 0
        for index in (*others, len(rows)):
            if index > start:
                self._run(state, out, cols, start, index)
            if index < len(rows):
                line = rows[index][-1]
                if line:
                    state.lineno = lineno + index + 1
                    out.extend(state.line(line))
            start = index + 1
        state.lineno = lineno + len(rows)
        return out

    def _token_plan(self, block: str) -> tuple[list[str], list[str], list[int]] | None:
        """Lines of ``block`` (as read, and with the fixed pieces marked) and the indices of
        those not of this layout, found with str methods only (C loops, no regex per line);
        None where that cannot be done safely."""
        pieces = self.pieces
        if pieces is None or "\r" in block or _SEP in block:
            return None
        lines = block.split("\n")
        lines.pop()
        first, mids, last = pieces[0], pieces[1:-1], pieces[-1]
        text = block
        for piece in sorted(mids, key=len, reverse=True):
            text = text.replace(piece, _SEP)
        marked = text.split("\n")
        marked.pop()
        ok = np.array(list(map(str.count, marked, repeat(_SEP)))) == len(mids)
        if first:
            ok &= np.array(list(map(str.startswith, lines, repeat(first))), dtype=bool)
        if last:
            ok &= np.array(list(map(str.endswith, lines, repeat(last))), dtype=bool)
        low = block.lower()
        hits: list[int] = []
        for word in _MESSAGE_WORDS:
            at = low.find(word)
            while at >= 0:
                hits.append(at)
                if len(hits) > 256:
                    return None
                at = low.find(word, at + 1)
        line_at, upto = 0, 0
        for at in sorted(hits):
            line_at += block.count("\n", upto, at)
            upto = at
            ok[line_at] = False
        return lines, marked, np.flatnonzero(~ok).tolist()

    def _read_tokens(
        self, state: _State, out: list[Record], lines: list[str], marked: list[str],
        others: list[int],
    ) -> None:  # fmt: skip
        assert self.pieces is not None
        first, last = self.pieces[0], self.pieces[-1]
        boundary = last + _SEP + first
        lineno = state.lineno
        width = self.n_fields
        start = 0
        self.fast_lines = len(lines) - len(others)
        for index in (*others, len(lines)):
            if index > start:
                joined = _SEP.join(marked[start:index])
                if first or last:
                    joined = joined.replace(boundary, _SEP)[
                        len(first) : len(joined) - len(last) if last else None
                    ]
                tokens = joined.split(_SEP)
                done = False
                if len(tokens) == (index - start) * width:
                    cols = [tokens[field::width] for field in self.field_of]
                    try:
                        self._run(state, out, cols, 0, index - start)
                        done = True
                    except ValueError:
                        pass  # a field that is not a number: read these lines one by one
                if not done:
                    for line_index in range(start, index):
                        state.lineno = lineno + line_index + 1
                        out.extend(state.line(lines[line_index]))
            if index < len(lines):
                state.lineno = lineno + index + 1
                out.extend(state.line(lines[index]))
            start = index + 1
        state.lineno = lineno + len(lines)

    def _run(
        self, state: _State, out: list[Record], cols: Sequence[Sequence[str]], start: int,
        end: int,
    ) -> None:  # fmt: skip
        """Convert lines ``start:end`` (all of this layout) a column at a time. Raises
        ValueError (before changing any state) when a field is not a number."""
        merger = state.merger
        printed = list(map(int, cols[self.step][start:end]))
        totals = list(map(int, cols[self.total][start:end])) if self.total >= 0 else None
        epochs = None
        if self.epoch >= 0:
            epochs = list(map(int, cols[self.epoch][start:end]))
        columns = [(key, list(map(float, cols[i][start:end]))) for key, i in self.values]
        array = np.array(printed)
        pending = merger.pending
        last = state.last_printed
        if (
            (self.epoch >= 0 and state.fractional_epochs)
            or (len(printed) > 1 and not bool((array[1:] > array[:-1]).all()))
            or (last is not None and printed[0] < last)
            or (pending is not None and pending["step"] >= printed[0] + state.step_base)
        ):
            self._one_by_one(state, out, cols, start, end)
            return
        base = state.step_base
        steps = printed if base == 0 else [p + base for p in printed]
        records = _records(steps, columns)
        for key, values in columns:
            if key == "loss" or key == "grad_norm":
                flag = "nf_loss" if key == "loss" else "nf_grads"
                for i in np.flatnonzero(~np.isfinite(np.array(values))).tolist():
                    records[i][flag] = 1
        if epochs is not None:
            for record, epoch in zip(records, epochs):
                record["epoch"] = epoch
            state.epoch = epochs[-1]
        elif state.epoch is not None:
            epoch = state.epoch
            for record in records:
                record["epoch"] = epoch
        state.last_printed = printed[-1]
        state.last_total = totals[-1] if totals is not None else None
        state.last_epoch = state.epoch
        if pending is not None:
            out.append(mark_nonfinite(pending))
        merger.pending = records.pop()
        merger.count += len(records) + 1
        merger.steps_seen = True
        merger.epochs_only = False
        out.extend(records)

    def _one_by_one(
        self, state: _State, out: list[Record], cols: Sequence[Sequence[str]], start: int,
        end: int,
    ) -> None:  # fmt: skip
        push = state.merger.push
        for i in range(start, end):
            if self.epoch >= 0 and not state.fractional_epochs:
                state.epoch = int(cols[self.epoch][i])
            record: Record = {key: float(cols[index][i]) for key, index in self.values}
            total = int(cols[self.total][i]) if self.total >= 0 else None
            record["step"] = state.map_step(int(cols[self.step][i]), total)
            if state.epoch is not None:
                record["epoch"] = state.epoch
            done = push(record)
            if done is not None:
                out.append(done)


def _records(steps: list[int], columns: list[tuple[str, list[float]]]) -> list[Record]:
    return make_records(["step", *(key for key, _ in columns)], [steps, *(c for _, c in columns)])


_SEP = "\x1f"  # ASCII unit separator: never in a training log line we read this way

#: a number as the general reader's pattern reads it, spelled without IGNORECASE (faster)
_FAST_NUM = (
    r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|[nN][aA][nN]"
    r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
)


_LITERAL_TOKEN = re.compile(r"(?<![\w.])" + _NUM + r"(?![\w.])|[ \t]+", re.IGNORECASE)


def _literal(text: str) -> str:
    """The regex for the text between two values: other numbers and space runs may vary."""
    out: list[str] = []
    at = 0
    for match in _LITERAL_TOKEN.finditer(text):
        out.append(re.escape(text[at : match.start()]))
        out.append(r"[ \t]+" if match.group()[0] in " \t" else "(?:" + _FAST_NUM + ")")
        at = match.end()
    out.append(re.escape(text[at:]))
    return "".join(out)


#: Lines looked at to find a layout; a layout must cover this share of the sample's records.
_SAMPLE_LINES = 2000
_COVERAGE = 0.5


def _find_layout(block: str) -> _Layout | None:
    """The commonest line shape with a printed step in the first lines of ``block``, checked
    against the general reader on every sampled line it matches."""
    lines = block.split("\n", _SAMPLE_LINES)[:_SAMPLE_LINES]
    parsed: list[tuple[str, dict[str, _Hit]]] = []
    shapes: dict[str, tuple[int, _Layout]] = {}
    for line in lines:
        line = line.rstrip("\r")
        if "\r" in line or "\x08" in line or _has_message(line.lower()):
            continue
        found, val_mode = _parse(line)
        if val_mode or not found:
            continue
        if not any(key in found for key in _ROLES):
            continue
        parsed.append((line, found))
        if len(parsed) > 64:
            continue  # enough shapes seen; the rest of the sample only checks the winner
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
        if groups is None or groups.group(layout.step + 1) is None:
            continue
        matched += 1
        checks = [*layout.values, ("step", layout.step)]
        if layout.epoch >= 0:
            checks.append(("epoch", layout.epoch))
        for key, index in checks:
            hit = found.get(key)
            if hit is None or line[hit[1] : hit[2]] != groups.group(index + 1):
                return None
        if len(layout.values) != sum(1 for key in _ROLES if key in found):
            return None
    if matched < _COVERAGE * len(parsed):
        return None
    return layout


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    state = _State(meta)
    layout: _Layout | None = None
    tries = 0
    for block in iter_blocks(path, meta):
        if layout is None and tries < 8:
            tries += 1
            layout = _find_layout(block)
        if layout is not None:
            yield from layout.read(state, block)
            if layout.fast_lines * 4 < block.count("\n"):
                layout, tries = None, 0  # the log changed shape: look again
            continue
        lines = block.split("\n")
        lines.pop()
        for line in lines:
            state.lineno += 1
            yield from state.line(line)
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
