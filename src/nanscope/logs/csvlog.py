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
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nanscope.errors import TraceError
from nanscope.logs._common import Merger, Record, iter_lines, role_of, to_float, to_step

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


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    lines = iter_lines(path, meta)
    header: list[str] | None = None
    delimiter = ","
    for line in lines:
        if line.strip():
            delimiter, header = split_header(line.lstrip("\ufeff"))
            break
    if header is None:
        raise TraceError(f"{path}: the file holds no CSV header")
    names = [name.strip().strip('"') for name in header]
    roles = header_roles(names)
    if "loss" not in roles.values() and "val_loss" not in roles.values():
        raise TraceError(
            f"{path}: CSV header has no loss column (columns: {', '.join(names[:12])[:200]})"
        )
    extra_cols = [
        (i, name) for i, name in enumerate(names) if i not in roles and name and len(name) < 80
    ][:32]
    cols = sorted(roles.items())
    meta["columns"] = {key: names[i] for i, key in cols}
    merger = Merger(meta)
    bad_cells = 0
    bad_rows = 0
    width = len(names)
    for line in lines:
        if not line.strip():
            continue
        fields = _split(line, delimiter)
        if len(fields) > width + 8:
            bad_rows += 1
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
            bad_cells += 1
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
            done = merger.push(record)
            if done is not None:
                yield done
    last = merger.close()
    if last is not None:
        yield last
    if bad_cells:
        meta["bad_cells"] = bad_cells
        warnings.warn(f"{path}: skipped {bad_cells} cell(s) that are not numbers", stacklevel=2)
    if bad_rows:
        meta["skipped_lines"] = bad_rows
