"""CSV and JSONL block fast paths give exactly what their row-by-row paths give.

The CSV reader converts whole blocks a column at a time where every row is plain; JSONL decodes
a block in one ``json.loads`` and maps flat objects with a per-key-set plan. The references
here switch those off (every row through ``_Reader.rows``; every line through ``json.loads``
and ``record_from_mapping``) on tables written from a real diverging fit, with sparse rows,
bad cells, huge steps and tiny blocks so that rows are cut across reads.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import Any

import pytest

import nanscope.logs._common as common
from nanscope.logs import csvlog, jsonl

from ._fits import least_squares_losses


def _losses(n: int) -> list[float]:
    return least_squares_losses(n, 0.01244, scales=(1.0, 3.0, 10.0))


def _read(module: Any, path: Path) -> tuple[list[str], dict[str, Any]]:
    meta: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = list(module.iter_records(path, meta))
    return [json.dumps(list(r.items()), default=str) for r in records], meta


def _csv_cell(rng: random.Random, value: float) -> str:
    roll = rng.random()
    if roll < 0.03:
        return rng.choice(["", "nan", "NaN", "inf", "-inf", "x", " 0.5", "1e400", '"0.25"'])
    return repr(value) if roll < 0.5 else f"{value:.6g}"


@pytest.mark.parametrize("seed", range(8))
def test_csv_blocks_match_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    losses = _losses(3000)
    sep = rng.choice([",", "\t", ";"])
    header = ["epoch", "step", "train_loss_step", "val_loss", "lr-Adam", "acc"]
    rows = [sep.join(header)]
    step = 0
    for i, loss in enumerate(losses):
        step += 1 if rng.random() > 0.01 else 0  # now and then a repeated step (merged)
        cells = [str(i // 500), str(step), _csv_cell(rng, loss), "", "0.001", "0.5"]
        if rng.random() < 0.01:
            cells[1] = rng.choice(["99999999999999999999", "-3", "1.5", ""])
        if i % 250 == 249:  # a Lightning validation row: train cells empty
            rows.append(sep.join([str(i // 500), str(step), "", _csv_cell(rng, loss), "", ""]))
        if rng.random() < 0.005:
            cells.append("extra")
        rows.append(sep.join(cells))
    path = tmp_path / "metrics.csv"
    newline = rng.choice(["\n", "\r\n"])
    path.write_text(newline.join(rows) + (newline if rng.random() < 0.7 else ""))
    for chunk in (common.CHUNK_BYTES, rng.choice([100, 333, 4096])):
        monkeypatch.setattr(common, "CHUNK_BYTES", chunk)
        fast = _read(csvlog, path)
        with monkeypatch.context() as m:
            m.setattr(csvlog._Reader, "block", lambda self, b: self.rows(b.split("\n")[:-1]))
            slow = _read(csvlog, path)
        assert fast == slow
        assert len(fast[0]) > 2500


def _json_value(rng: random.Random, value: float) -> Any:
    roll = rng.random()
    if roll < 0.03:
        return rng.choice(["nan", "NaN", None, "x", "0.5", True, [1], {"a": 1}, float("inf")])
    return value


@pytest.mark.parametrize("seed", range(8))
def test_jsonl_blocks_match_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    losses = _losses(3000)
    lines = []
    for i, loss in enumerate(losses, 1):
        obj: dict[str, Any] = {"step": i, "train/loss": _json_value(rng, loss), "lr": 1e-3}
        roll = rng.random()
        if roll < 0.01:
            obj["step"] = rng.choice([float(i), 1e20, "7", None])
        elif roll < 0.02:
            obj = {"metrics": obj}
        elif roll < 0.03:
            obj = {"step": i, "eval_loss": loss}
        text = json.dumps(obj)
        if rng.random() < 0.003:
            text = rng.choice(["", "[1, 2]", "not json", text[: len(text) // 2]])
        lines.append(text)
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + ("\n" if rng.random() < 0.7 else ""))
    for chunk in (common.CHUNK_BYTES, rng.choice([100, 333, 4096])):
        monkeypatch.setattr(common, "CHUNK_BYTES", chunk)
        fast = _read(jsonl, path)
        with monkeypatch.context() as m:
            m.setattr(jsonl, "_objects", lambda block: None)
            m.setattr(common.FlatRecords, "__call__", lambda self, obj: None)
            slow = _read(jsonl, path)
        assert fast == slow
        assert len(fast[0]) > 2500
