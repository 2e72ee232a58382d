"""A log whose only loss is a validation loss is read with it as the loss (issue 13).

Keras prints ``Epoch 3/20 - val_loss: 0.33 - val_acc: 0.5`` lines when only validation is
logged; a ``CSVLogger`` with only validation metrics writes ``epoch,val_loss,val_acc``. Before,
such logs gave records without a ``loss`` and the diagnosis said "healthy, no loss recorded"
even when the validation loss went to NaN. The losses here are a real fit's (least squares by
gradient descent on unscaled features, a step size that diverges).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.logs import VAL_LOSS_NOTE, LogWarning, iter_records, load_trace

from ._fits import least_squares_losses


def _fit(epochs: int, lr: float) -> list[float]:
    return least_squares_losses(epochs, lr, scales=(1.0, 3.0, 10.0))


def _quiet_load(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)
        return load_trace(path)


def _keras_val_only(path: Path, losses: list[float]) -> None:
    n = len(losses)
    lines = [
        f"Epoch {e}/{n} - val_loss: {v:.4f} - val_acc: 0.5000" for e, v in enumerate(losses, 1)
    ]
    path.write_text("\n".join(lines) + "\n")


def test_keras_validation_only_log_of_a_diverging_fit_is_not_healthy(tmp_path: Path) -> None:
    losses = _fit(100, lr=0.5)  # grows geometrically, then inf / NaN
    assert not math.isfinite(losses[-1])
    path = tmp_path / "train.log"
    _keras_val_only(path, losses)
    with pytest.warns(LogWarning, match="no training loss in this log"):
        trace = load_trace(path)
    assert trace.meta["loss_key"] == "val_loss"
    assert trace.meta["loss_note"] == VAL_LOSS_NOTE
    assert trace.granularity == "epoch"
    assert [r["step"] for r in trace] == list(range(1, 101))
    got = trace.column("loss")
    want = np.array([float(f"{v:.4f}") for v in losses])
    assert np.array_equal(np.isfinite(got), np.isfinite(want))
    assert np.allclose(got[np.isfinite(want)], want[np.isfinite(want)])
    first_bad = int(np.flatnonzero(~np.isfinite(want))[0]) + 1
    assert next(r["step"] for r in trace if r.get("nf_loss")) == first_bad
    diagnosis = nanscope.diagnose(trace)
    assert diagnosis.verdict == "nonfinite"
    assert diagnosis.cause == "step_size_too_large"
    assert diagnosis.first_nonfinite is not None
    assert diagnosis.first_nonfinite["step"] == first_bad


def test_keras_validation_only_log_of_a_good_fit_has_a_loss(tmp_path: Path) -> None:
    losses = _fit(30, lr=0.001)
    path = tmp_path / "train.log"
    _keras_val_only(path, losses)
    trace = _quiet_load(path)
    diagnosis = nanscope.diagnose(trace)
    assert diagnosis.verdict == "healthy"
    assert "no loss recorded" not in diagnosis.evidence[0].text
    assert trace.column("loss")[-1] == pytest.approx(losses[-1], rel=1e-3)


def test_csv_with_only_a_validation_loss_column(tmp_path: Path) -> None:
    losses = _fit(100, lr=0.5)
    path = tmp_path / "log.csv"
    rows = ["epoch,val_loss,val_accuracy"]
    rows += [f"{e},{v!r},0.5" for e, v in enumerate(losses)]  # Keras' CSVLogger counts from 0
    path.write_text("\n".join(rows) + "\n")
    trace = _quiet_load(path)
    assert trace.meta["format"] == "csv" and trace.meta["loss_key"] == "val_loss"
    got = trace.column("loss")
    ok = np.isfinite(losses)
    assert np.array_equal(np.isfinite(got), ok)
    assert np.array_equal(got[ok], np.array(losses)[ok])
    diagnosis = nanscope.diagnose(trace)
    assert (diagnosis.verdict, diagnosis.cause) == ("nonfinite", "step_size_too_large")


def test_jsonl_with_only_eval_loss(tmp_path: Path) -> None:
    losses = _fit(40, lr=0.02)  # grows geometrically; finite within 40 evaluations
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": 10 * i, "eval_loss": v}) for i, v in enumerate(losses, 1)]
    path.write_text("\n".join(lines) + "\n")
    trace = _quiet_load(path)
    assert trace.meta["loss_key"] == "val_loss"
    assert [r["step"] for r in trace] == [10 * i for i in range(1, 41)]
    diagnosis = nanscope.diagnose(trace)
    assert (diagnosis.verdict, diagnosis.cause) == ("diverging", "step_size_too_large")


def test_a_training_loss_anywhere_keeps_the_validation_loss_apart(tmp_path: Path) -> None:
    losses = _fit(30, lr=0.001)
    path = tmp_path / "train.log"
    lines = [f"Epoch {e}/30 - val_loss: {v:.4f}" for e, v in enumerate(losses[:20], 1)]
    both = [f"Epoch {e}/30 - loss: {v:.4f} - val_loss: {v:.4f}" for e, v in enumerate(losses, 1)]
    lines += both[20:]
    path.write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LogWarning)
        trace = load_trace(path)
    assert "loss_key" not in trace.meta
    assert sum("loss" in r for r in trace) == 10  # only the lines that print a training loss


def test_many_validation_records_stream_past_the_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nanscope.logs as logs

    monkeypatch.setattr(logs, "HOLD_RECORDS", 50)  # converted as they come past the hold
    losses = _fit(300, lr=0.0125)
    path = tmp_path / "train.log"
    _keras_val_only(path, losses)
    meta: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)
        records = list(iter_records(path, meta))
    assert meta["loss_key"] == "val_loss"
    assert len(records) == 300
    assert all(r["loss"] == r["val_loss"] or not math.isfinite(r["loss"]) for r in records)
    assert [bool(r.get("nf_loss")) for r in records] == [
        not math.isfinite(float(f"{v:.4f}")) for v in losses
    ]
