"""Hugging Face trainer_state.json and TensorBoard event files, written by the real libraries."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nanscope.errors import TraceError
from nanscope.logs import load_trace, sniff

LOG_HISTORY = [
    {"epoch": 0.1, "grad_norm": 3.2, "learning_rate": 5e-05, "loss": 2.5, "step": 10},
    {"epoch": 0.2, "grad_norm": 2.9, "learning_rate": 4.5e-05, "loss": 2.1, "step": 20},
    {"epoch": 0.2, "eval_loss": 2.2, "eval_runtime": 0.5, "step": 20},
    {"epoch": 0.3, "grad_norm": math.nan, "learning_rate": 4e-05, "loss": 0.0, "step": 30},
    {"epoch": 0.4, "grad_norm": math.inf, "learning_rate": 3.5e-05, "loss": math.nan, "step": 40},
    {"epoch": 0.4, "eval_loss": math.nan, "step": 40},
    {"epoch": 0.4, "step": 40, "total_flos": 1.0, "train_loss": math.nan, "train_runtime": 9.0},
]


@dataclasses.dataclass
class _State:
    """The fields of transformers.TrainerState that matter here, saved the way it saves itself."""

    epoch: float | None = 0.4
    global_step: int = 40
    max_steps: int = 40
    logging_steps: int = 10
    log_history: list = dataclasses.field(default_factory=list)

    def save_to_json(self, json_path: str) -> None:
        # TrainerState.save_to_json: json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"
        text = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
        Path(json_path).write_text(text, encoding="utf-8")


def _write_state(path: Path) -> None:
    _State(log_history=[dict(e) for e in LOG_HISTORY]).save_to_json(str(path))


@pytest.mark.slow
def test_real_trainer_state_class(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers = pytest.importorskip("transformers")
    state = transformers.TrainerState(global_step=40, logging_steps=10, max_steps=40)
    state.log_history = [dict(e) for e in LOG_HISTORY]
    path = tmp_path / "trainer_state.json"
    state.save_to_json(str(path))
    trace = load_trace(path)
    assert [r["step"] for r in trace] == [10, 20, 30, 40]
    assert trace[2]["events"] == ["loss_nan_filtered"]
    assert trace.meta["trainer_state"]["global_step"] == 40


def test_trainer_state(tmp_path: Path) -> None:
    ckpt = tmp_path / "out" / "checkpoint-40"
    ckpt.mkdir(parents=True)
    path = ckpt / "trainer_state.json"
    _write_state(path)
    assert "NaN" in path.read_text()  # the bare tokens Python's json writes
    assert sniff(path) == "trainer_state"
    assert sniff(tmp_path / "out") == "trainer_state"
    trace = load_trace(tmp_path / "out")
    assert trace.meta["format"] == "trainer_state"
    assert trace.meta["granularity"] == "update"
    assert [r["step"] for r in trace] == [10, 20, 30, 40]
    assert trace[1]["val_loss"] == 2.2 and trace[1]["lr"] == 4.5e-05
    assert trace[0]["extra"]["epoch"] == 0.1
    hidden = trace[2]
    assert hidden["loss"] == 0.0 and hidden["events"] == ["loss_nan_filtered"]
    assert hidden["nf_grads"] == 1
    assert math.isnan(trace[3]["loss"]) and trace[3]["nf_loss"] == 1
    assert math.isnan(trace[3]["val_loss"])
    [message] = trace.meta["messages"]
    assert message["kind"] == "nan_filter" and message["step"] == 30
    assert "logging_nan_inf_filter" in message["text"]
    assert trace.meta["trainer_state"]["global_step"] == 40
    assert trace.meta["train_summary"]["train_runtime"] == 9.0


def test_trainer_state_truncated_keeps_entries(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    _write_state(path)
    text = path.read_text()
    cut = text.index('"step": 30')
    path.write_text(text[:cut])
    with pytest.warns(UserWarning, match="cut short"):
        trace = load_trace(path)
    assert [r["step"] for r in trace] == [10, 20]
    assert trace.meta["truncated"] is True


def test_trainer_state_without_history_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text('{"global_step": 3}\n')
    with pytest.raises(TraceError, match="log_history"):
        load_trace(path)


class _Writer:
    """A scalar writer on tensorboard's own EventFileWriter (what torch's SummaryWriter wraps)."""

    def __init__(self, logdir: str) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._writer = EventFileWriter(logdir)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)])
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        self._writer.close()


def _write_torch_run(logdir: Path, writer_class: Any = _Writer) -> list[float]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 2)) * 30.0
    y = x.sum(axis=1)
    w = np.zeros(2)
    losses = []
    writer = writer_class(str(logdir))
    with np.errstate(all="ignore"):
        for step in range(1, 61):
            residual = x @ w - y
            loss = float(np.mean(residual**2))
            grad = 2 * x.T @ residual / len(y)
            losses.append(loss)
            writer.add_scalar("train/loss", loss, step)
            writer.add_scalar("train/grad_norm", float(np.linalg.norm(grad)), step)
            writer.add_scalar("lr", 0.01, step)
            writer.add_scalar("loss_scale", 1024.0, step)
            if step % 20 == 0:
                writer.add_scalar("val/loss", loss * 1.1, step)
            w = w - 0.01 * grad
    writer.close()
    return losses


@pytest.mark.parametrize("writer", ["tensorboard", pytest.param("torch", marks=pytest.mark.slow)])
def test_tensorboard_real_writers(tmp_path: Path, writer: str) -> None:
    pytest.importorskip("tensorboard")
    if writer == "torch":
        from torch.utils.tensorboard import SummaryWriter

        losses = _write_torch_run(tmp_path / "runs" / "exp1", SummaryWriter)
    else:
        losses = _write_torch_run(tmp_path / "runs" / "exp1")
    [event_file] = list((tmp_path / "runs").rglob("events.out.tfevents*"))
    assert sniff(event_file) == "tensorboard"
    assert sniff(tmp_path / "runs") == "tensorboard"
    trace = load_trace(tmp_path / "runs")
    assert trace.meta["loss_tag"] == "exp1/train/loss"
    assert "exp1/val/loss" in trace.meta["tags"] and "exp1/loss_scale" in trace.meta["tags"]
    assert trace.meta["val_loss_tag"] == "exp1/val/loss"
    assert trace.meta["lr_tag"] == "exp1/lr"
    assert trace.meta["grad_norm_tag"] == "exp1/train/grad_norm"
    assert trace.meta["granularity"] == "update"
    assert [r["step"] for r in trace] == list(range(1, 61))
    got = trace.column("loss")
    with np.errstate(over="ignore"):
        want = np.array(losses, dtype=np.float32).astype(float)
        val_20 = float(np.float32(losses[19] * 1.1))
    assert np.array_equal(np.isfinite(got), np.isfinite(want))
    assert np.allclose(got[np.isfinite(want)], want[np.isfinite(want)])
    assert trace[19]["val_loss"] == pytest.approx(val_20, rel=1e-6)
    assert trace[0]["lr"] == pytest.approx(0.01)
    if not np.isfinite(want).all():
        first = int(np.argmin(np.isfinite(want)))
        assert trace[first]["nf_loss"] == 1


def test_tensorboard_keras_layout_prefers_train_and_batch(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    for run, tag_values in {
        "train": {"epoch_loss": [1.0, 0.5, math.nan], "batch_loss": [2.0, 1.0, 0.7, 0.4, math.nan]},
        "validation": {"epoch_loss": [1.1, 0.6, math.nan]},
    }.items():
        writer = _Writer(str(tmp_path / run))
        for tag, values in tag_values.items():
            for step, value in enumerate(values):
                writer.add_scalar(tag, value, step)
        writer.close()
    trace = load_trace(tmp_path)
    assert trace.meta["loss_tag"] == "train/batch_loss"
    assert trace.meta["granularity"] == "update"
    assert [r["step"] for r in trace] == [0, 1, 2, 3, 4]
    assert math.isnan(trace[4]["loss"])


def test_tensorboard_epoch_level(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    writer = _Writer(str(tmp_path))
    for step, value in enumerate([1.0, 0.8, math.inf], start=1):
        writer.add_scalar("Loss/train_epoch", value, step)
        writer.add_scalar("Loss/val_epoch", value, step)
    writer.close()
    trace = load_trace(tmp_path)
    assert trace.meta["loss_tag"] == "Loss/train_epoch"
    assert trace.meta["val_loss_tag"] == "Loss/val_epoch"
    assert trace.meta["granularity"] == "epoch"
    assert trace[2]["loss"] == math.inf and trace[2]["epoch"] == 3


def test_tensorboard_garbage_named_like_events(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    path = tmp_path / "events.out.tfevents.123.host"
    path.write_bytes(b"\x13\x00\x00\x00\x00\x00\x00\x00garbage garbage garbage")
    with pytest.raises(TraceError, match=r"events\.out\.tfevents"):
        load_trace(path)
