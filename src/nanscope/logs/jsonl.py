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
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nanscope.logs._common import Merger, Record, iter_lines, record_from_mapping

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


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    merger = Merger(meta)
    bad = 0
    for line in iter_lines(path, meta):
        text = line.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            bad += 1
            continue
        if not isinstance(obj, dict):
            bad += 1
            continue
        done = merger.push(record_from_mapping(_flatten(obj)))
        if done is not None:
            yield done
    last = merger.close()
    if last is not None:
        yield last
    if bad:
        meta["skipped_lines"] = bad
        warnings.warn(f"{path}: skipped {bad} line(s) that are not JSON objects", stacklevel=2)
