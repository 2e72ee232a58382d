"""TensorBoard event files (``events.out.tfevents.*``): one file, or a run directory searched
recursively (Keras writes ``train/`` and ``validation/`` sub-runs).

Read with the ``tensorboard`` package's own event reader (``pip install nanscope[logs]``); it is
imported only here. Every scalar series is collected as ``"<sub-run>/<tag>"`` (just ``<tag>`` for
files directly in the given directory). The loss series is chosen as:

1. a name containing ``loss`` (not ``loss_scale``) and no ``val``/``valid``/``eval``/``test``;
2. among those, one that says ``train`` first; per-step before per-epoch (``epoch`` in the name);
   then the one with the most points; then the shortest name.

``meta["loss_tag"]`` says which was chosen and ``meta["tags"]`` lists every scalar series; a
validation-loss series (``meta["val_loss_tag"]``), a learning-rate series (``lr_tag``) and a
gradient-norm series (``grad_norm_tag``) are merged in by step. A chosen series with ``epoch`` in
its name gives ``granularity = "epoch"``.
"""

from __future__ import annotations

import re
import warnings
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nanscope.errors import TraceError
from nanscope.logs._common import LogWarning, Record, mark_nonfinite, role_of

NAME = "tensorboard"
DESCRIPTION = "TensorBoard event files (events.out.tfevents.*, a file or a run directory)"

_VAL = re.compile(r"(?<![a-z])(val|valid|validation|eval|evaluation|test|dev)(?![a-z])|val_|_val")


class _Series:
    __slots__ = ("steps", "values")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")


def _files(path: Path) -> list[tuple[str, Path]]:
    if path.is_file():
        return [("", path)]
    found = sorted(p for p in path.rglob("events.out.tfevents*") if p.is_file())
    out = []
    for file in found:
        run = file.parent.relative_to(path).as_posix()
        out.append(("" if run == "." else run, file))
    return out


def _scalar(value: Any, tensor_util: Any) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        plugin = value.metadata.plugin_data.plugin_name
        if plugin and plugin != "scalars":
            return None
        array_value = tensor_util.make_ndarray(value.tensor)
        if array_value.size != 1 or array_value.dtype.kind not in "fiu":
            return None
        return float(array_value.reshape(-1)[0])
    return None


def _read(path: Path, meta: dict[str, Any]) -> dict[str, _Series]:
    try:
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.util import tensor_util
    except ImportError:
        raise TraceError(
            f"{path}: reading TensorBoard files needs the tensorboard package "
            "(pip install 'nanscope[logs]')"
        ) from None
    series: dict[str, _Series] = {}
    events = 0
    problems: list[str] = []
    files = _files(path)
    if not files:
        raise TraceError(f"{path}: holds no events.out.tfevents.* file")
    for run, file in files:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for event in event_file_loader.EventFileLoader(str(file)).Load():
                    events += 1
                    if not event.HasField("summary"):
                        continue
                    for value in event.summary.value:
                        number = _scalar(value, tensor_util)
                        if number is None:
                            continue
                        name = f"{run}/{value.tag}" if run else value.tag
                        item = series.get(name)
                        if item is None:
                            item = series[name] = _Series()
                        item.steps.append(int(event.step))
                        item.values.append(number)
        except Exception as exc:  # the reader raises protobuf/IO errors of its own on bad bytes
            problems.append(f"{file.name}: {type(exc).__name__}")
    meta["lines"] = events
    meta["files"] = len(files)
    if problems:
        meta["problems"] = problems[:20]
        if not series:
            raise TraceError(f"{path}: not readable as TensorBoard events ({problems[0]})")
        warnings.warn(
            f"{path}: some event data could not be read: {problems[0]}", LogWarning, stacklevel=3
        )
    return series


def _is_val(name: str) -> bool:
    return bool(_VAL.search(name.lower()))


def _is_loss(name: str) -> bool:
    low = name.lower()
    return "loss" in low and "scale" not in low


def choose_loss_tag(names: dict[str, int]) -> str | None:
    """The train-loss series among ``{name: number of points}``, or None."""
    candidates = [n for n in names if _is_loss(n) and not _is_val(n)]
    if not candidates:
        return None

    def key(name: str) -> tuple[int, int, int, int, str]:
        low = name.lower()
        return ("train" not in low, "epoch" in low, -names[name], len(name), name)

    return min(candidates, key=key)


def _choose_other(names: dict[str, int], loss_tag: str | None) -> dict[str, str]:
    chosen: dict[str, str] = {}
    val = [n for n in names if _is_loss(n) and _is_val(n)]
    if val:
        epoch_level = loss_tag is not None and "epoch" in loss_tag.lower()
        chosen["val_loss"] = min(
            val, key=lambda n: (("epoch" in n.lower()) != epoch_level, len(n), n)
        )
    for name in sorted(names, key=len):
        role = role_of(name.rsplit("/", 1)[-1]) or role_of(name)
        if role is None:
            continue
        if role[0] in ("lr", "grad_norm") and role[0] not in chosen:
            chosen[role[0]] = name
    return chosen


def iter_records(path: Path, meta: dict[str, Any]) -> Iterator[Record]:
    series = _read(path, meta)
    counts = {name: len(item.steps) for name, item in series.items()}
    meta["tags"] = sorted(counts)
    loss_tag = choose_loss_tag(counts)
    others = _choose_other(counts, loss_tag)
    if loss_tag is None and "val_loss" not in others:
        raise TraceError(
            f"{path}: no loss series among the TensorBoard tags "
            f"({', '.join(sorted(counts)[:10]) or 'no scalars'})"
        )
    meta["loss_tag"] = loss_tag
    for key, name in others.items():
        meta[f"{key}_tag"] = name
    meta["granularity"] = "epoch" if loss_tag and "epoch" in loss_tag.lower() else "update"
    columns: dict[str, dict[int, float]] = {}
    for key, name in ([("loss", loss_tag)] if loss_tag else []) + list(others.items()):
        item = series[name]
        columns[key] = dict(zip(item.steps, item.values))
    base = columns.get("loss") or columns["val_loss"]
    steps = sorted(set(base) | set(columns.get("val_loss", {})))
    duplicates = len(series[loss_tag].steps) - len(columns["loss"]) if loss_tag else 0
    if duplicates:
        meta["duplicate_steps"] = duplicates  # a restarted run: the last value of a step wins
    for step in steps:
        record: Record = {"step": step}
        if meta["granularity"] == "epoch":
            record["epoch"] = step
        for key, values in columns.items():
            value = values.get(step)
            if value is not None:
                record[key] = value
        if len(record) > 1 + ("epoch" in record):
            yield mark_nonfinite(record)
