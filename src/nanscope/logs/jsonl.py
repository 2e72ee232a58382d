"""JSON Lines logs: one JSON object a line, with any key names that mean step / loss / ...

``{"global_step": 10, "train/loss": 0.4, "learning_rate": 1e-3}``. Keys are matched through the
alias tables in :mod:`nanscope.logs._common` (step, global_step, iteration, iter, epoch; loss,
train_loss, training_loss, train/loss; grad_norm, gradient_norm, grad_norm_total; lr,
learning_rate; val_loss, eval_loss ...). Objects nested one level deep (``{"metrics": {...}}``)
are looked into. Bare ``NaN`` / ``Infinity`` tokens and ``"nan"`` strings are both accepted.
Consecutive lines of the same step (a train line and an eval line) become one record.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from nanscope.logs._common import (
    FlatRecords,
    Merger,
    Record,
    iter_blocks,
    record_from_mapping,
    skipped,
    warn,
)

NAME = "jsonl"
DESCRIPTION = "JSON Lines, one object a line with step/loss/grad_norm/lr keys under any usual name"


def _flatten(obj: dict[str, Any]) -> dict[str, Any]:
    if not any(isinstance(v, dict) for v in obj.values()):
        return obj
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            for inner, inner_value in value.items():
                if not isinstance(inner_value, (dict, list)):
                    flat.setdefault(str(inner), inner_value)
        else:
            flat[key] = value
    return flat


def _objects(block: str) -> list[Any] | None:
    """Every line of ``block`` decoded in one ``json.loads`` call (a JSON array of the lines);
    None when some line is not valid JSON on its own (then lines are read one by one)."""
    if "\n\n" in block or block.startswith("\n") or "\r" in block:
        return None
    try:
        objects = json.loads("[" + block[:-1].replace("\n", ",") + "]")
    except (ValueError, RecursionError):
        return None
    if len(objects) != block.count("\n"):
        return None  # a line held two values ("1, 2"): read one by one to count it as bad
    return objects


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    # a chain over lists of records: no Python frame is resumed per record
    return chain.from_iterable(_record_lists(path, meta))


def _record_lists(path: Path, meta: dict[str, Any]) -> Iterator[list[Record]]:
    merger = Merger(meta)
    fast = FlatRecords()
    bad = 0
    cut = ""
    for block in iter_blocks(path, meta):
        objects = _objects(block)
        if objects is None:
            objects = []
            lines = block.split("\n")
            lines.pop()
            for line in lines:
                text = line.strip()
                if not text:
                    continue
                try:
                    objects.append(json.loads(text))
                    cut = ""
                except (ValueError, RecursionError):
                    objects.append(None)
                    cut = text
        else:
            cut = ""
        out: list[Record] = []
        for obj in objects:
            if obj.__class__ is not dict:
                bad += 1
                continue
            record = fast(obj)
            if record is None:
                record = record_from_mapping(_flatten(obj))
            done = merger.push(record)
            if done is not None:
                out.append(done)
        yield out
    last = merger.close()
    if last is not None:
        yield [last]
    if cut and not _ends_with_newline(path):
        # the last line was cut mid-record (a run killed while writing, a copy cut short)
        bad -= 1
        meta["truncated"] = True
        warn(f"{path}: the last line is cut short mid-record; read the {merger.count} before it")
    skipped(meta, path, bad, "line(s) that are not JSON objects")


def _ends_with_newline(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            handle.seek(-1, 2)
            return handle.read(1) == b"\n"
    except OSError:
        return True
