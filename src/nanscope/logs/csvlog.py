"""CSV logs with a header row: Keras ``CSVLogger``, Lightning ``CSVLogger`` ``metrics.csv``, and
any ``step,loss[,grad_norm,lr,...]`` table.

The header names the columns; they are matched through the alias tables of
:mod:`nanscope.logs._common`. The loss column is the most train-like, per-update one
(``loss`` > ``train_loss`` > ``train_loss_step`` > ... > ``train_loss_epoch``); the others are
kept in ``extra``. Lightning writes sparse rows (a train row with empty validation cells, a
validation row with empty train cells): rows of the same step are merged into one record. With a
``step``-like column the trace is per update; with only ``epoch`` it is per epoch (``step`` =
the epoch number as logged: Keras' ``CSVLogger`` counts epochs from 0). Comma, tab and semicolon
separated files are read; a cell that is not a number is skipped (counted in
``meta["bad_cells"]``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from nanscope.errors import TraceError
from nanscope.logs._common import (
    Merger,
    Record,
    flag_nonfinite,
    iter_blocks,
    make_records,
    role_of,
    skipped,
    to_float,
    to_step,
    warn,
)

NAME = "csv"
DESCRIPTION = "CSV with a header row (Keras/Lightning CSVLogger, step,loss,grad_norm,lr,...)"

_DELIMITERS = (",", "\t", ";")


def split_header(line: str) -> tuple[str, list[str]]:
    delimiter = max(_DELIMITERS, key=line.count)
    return delimiter, _split(line, delimiter)


def _split(line: str, delimiter: str) -> list[str]:
    if '"' not in line:
        return line.split(delimiter)
    try:
        return next(csv.reader([line], delimiter=delimiter))
    except (csv.Error, StopIteration):
        return line.split(delimiter)


def header_roles(names: list[str]) -> dict[int, str]:
    """Column index -> record key for the columns we read; the others go to ``extra``."""
    best: dict[str, tuple[int, int]] = {}
    for index, name in enumerate(names):
        role = role_of(name)
        if role is None:
            continue
        key, rank = role
        if key not in best or rank < best[key][0]:
            best[key] = (rank, index)
    return {index: key for key, (_, index) in best.items()}


def _record_lists(path: Path, meta: dict[str, Any]) -> Iterator[list[Record]]:
    blocks = iter_blocks(path, meta)
    header: list[str] | None = None
    delimiter = ","
    pending_lines: list[str] = []
    for block in blocks:
        lines = block.split("\n")
        lines.pop()
        for index, line in enumerate(lines):
            if line.strip():
                delimiter, header = split_header(line.lstrip("\ufeff").rstrip("\r"))
                pending_lines = lines[index + 1 :]
                break
        if header is not None:
            break
    if header is None:
        raise TraceError(f"{path}: the file holds no CSV header")
    names = [name.strip().strip('"') for name in header]
    roles = header_roles(names)
    if "loss" not in roles.values() and "val_loss" not in roles.values():
        raise TraceError(
            f"{path}: CSV header has no loss column (columns: {', '.join(names[:12])[:200]})"
        )
    reader = _Reader(path, meta, names, roles, delimiter)
    if pending_lines:
        yield reader.block("\n".join(pending_lines) + "\n")
    for block in blocks:
        yield reader.block(block)
    yield reader.close()


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    # a chain over lists of records: no Python frame is resumed per record
    return chain.from_iterable(_record_lists(path, meta))


def _lines(block: str) -> list[str]:
    lines = block.split("\n")
    lines.pop()  # the empty string after the block's last newline
    return lines


class _Reader:
    """Rows to records: whole blocks a column at a time where every row is plain (no quotes,
    one cell per column, numbers where numbers belong), row by row elsewhere."""

    def __init__(
        self, path: Path, meta: dict[str, Any], names: list[str], roles: dict[int, str],
        delimiter: str,
    ) -> None:  # fmt: skip
        self.path = path
        self.meta = meta
        self.delimiter = delimiter
        self.width = len(names)
        self.cols = sorted(roles.items())
        self.extra_cols = [
            (i, name) for i, name in enumerate(names) if i not in roles and name and len(name) < 80
        ][:32]
        meta["columns"] = {key: names[i] for i, key in self.cols}
        self.merger = Merger(meta)
        self.bad_cells = 0
        self.bad_rows = 0

    def block(self, block: str) -> list[Record]:
        if '"' in block or "\r" in block:
            return self.rows(_lines(block))
        delimiter, width = self.delimiter, self.width
        # every line's cells, then a "\n" token: a line with a cell too many or too few moves
        # the "\n" tokens after it off their places, so one count checks every line
        tokens = block.replace("\n", delimiter + "\n" + delimiter).split(delimiter)
        n = block.count("\n")
        if tokens[width :: width + 1].count("\n") != n:
            return self.rows(_lines(block))
        step = width + 1
        try:
            keys: list[str] = []
            values: list[list[Any]] = []
            for index, key in self.cols:
                cells = tokens[index::step][:n]
                if not cells[0] and not cells[-1] and cells.count("") == n:
                    continue  # a column this block leaves empty (Lightning's val rows)
                if key in ("step", "epoch"):
                    numbers: list[Any] = list(map(int, cells))
                    if max(numbers) >= 10**15 or min(numbers) <= -(10**15):
                        return self.rows(_lines(block))  # not a step to_step would read
                else:
                    numbers = list(map(float, cells))
                keys.append(key)
                values.append(numbers)
            names: list[str] = []
            extra: list[list[float]] = []
            for index, name in self.extra_cols:
                cells = tokens[index::step][:n]
                if cells[0] or cells[-1] or cells.count("") != n:
                    names.append(name)
                    extra.append(list(map(float, cells)))
        except ValueError:
            return self.rows(_lines(block))  # an empty or non-number cell somewhere: row by row
        if "step" not in keys:
            return self.rows(_lines(block))
        steps = values[keys.index("step")]
        valued = any(key not in ("step", "epoch") for key in keys)
        if extra:
            keys.append("extra")
            values.append(make_records(names, extra))
        records = make_records(keys, values)
        flag_nonfinite(records, keys, values)
        return self.merger.extend(records, marked=True, steps=steps, valued=valued)

    def rows(self, lines: list[str]) -> list[Record]:
        out: list[Record] = []
        delimiter, width, cols, extra_cols = self.delimiter, self.width, self.cols, self.extra_cols
        push = self.merger.push
        for line in lines:
            if not line.strip():
                continue
            fields = _split(line.rstrip("\r"), delimiter)
            if len(fields) > width + 8:
                self.bad_rows += 1
                continue
            record: Record = {}
            n_fields = len(fields)
            for index, key in cols:
                if index >= n_fields:
                    continue
                cell = fields[index].strip()
                if not cell:
                    continue
                if key in ("step", "epoch"):
                    number = to_step(cell)
                    if number is not None:
                        record[key] = number
                        continue
                else:
                    value = to_float(cell)
                    if value is not None:
                        record[key] = value
                        continue
                self.bad_cells += 1
            if extra_cols:
                extra = {}
                for index, name in extra_cols:
                    if index < n_fields and fields[index].strip():
                        value = to_float(fields[index])
                        if value is not None:
                            extra[name] = value
                if extra:
                    record["extra"] = extra
            if record:
                done = push(record)
                if done is not None:
                    out.append(done)
        return out

    def close(self) -> list[Record]:
        out = []
        last = self.merger.close()
        if last is not None:
            out.append(last)
        if self.bad_cells:
            self.meta["bad_cells"] = self.bad_cells
            warn(f"{self.path}: skipped {self.bad_cells} cell(s) that are not numbers")
        skipped(self.meta, self.path, self.bad_rows, "row(s) with far more cells than columns")
        return out
