"""Logs in the shape each framework prints them (``fixtures/write.py``, from real fits): every
layout is read, every numerics message is evidence, and each log gets the verdict it must."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

import nanscope
from nanscope.logs import load_trace
from nanscope.report.terminal import render

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


def _writer() -> ModuleType:
    name = "_nanscope_log_fixtures_write"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES_DIR / "write.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


WRITER = _writer()
NAMES = list(WRITER.FIXTURES)


def _read(name: str):
    trace = load_trace(FIXTURES_DIR / name)
    return trace, nanscope.diagnose(trace)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_is_what_the_writer_writes(name: str) -> None:
    write, _ = WRITER.FIXTURES[name]
    assert (FIXTURES_DIR / name).read_bytes().decode("utf-8") == write()


@pytest.mark.parametrize("name", NAMES)
def test_each_log_gets_its_verdict(name: str) -> None:
    _, expect = WRITER.FIXTURES[name]
    trace, diagnosis = _read(name)
    summary = f"{name}: {diagnosis.verdict} {diagnosis.cause} {diagnosis.confidence}"
    assert diagnosis.verdict == expect.verdict, summary
    if expect.cause is not None:
        assert diagnosis.cause == expect.cause, summary
    if expect.step is not None:
        assert (diagnosis.first_nonfinite or {}).get("step", diagnosis.step) == expect.step
    assert trace.granularity == expect.granularity
    # what a log cannot show is never claimed, and the advice fits a run that is over
    text = render(diagnosis, trace)
    assert "Monitor.update" not in text and "pass params" not in text
    assert "finite weights" not in text and "still finite" not in text


def test_yolov5_table_rows_under_their_header() -> None:
    trace, diagnosis = _read("yolov5_table.log")
    assert trace.meta["loss_column"] == "box_loss + obj_loss + cls_loss"
    assert [r["step"] for r in trace] == list(range(1, 25))  # the bar counted on per epoch
    assert [r["epoch"] for r in trace][7:9] == [0, 1]
    first = trace[0]["loss"]
    assert first == pytest.approx(WRITER.classifier(24, lr=0.3, bad_batch=12).loss[0], rel=1e-3)
    assert diagnosis.first_nonfinite == {"step": 13, "what": "loss"}


def test_yolov5_total_column_is_the_loss() -> None:
    trace, _ = _read("yolov5_v5_total.log")
    assert trace.meta["loss_column"] == "total" and len(trace) == 12
    assert [r["epoch"] for r in trace] == list(range(12))


def test_fastai_table_keeps_train_and_validation_apart() -> None:
    trace, _ = _read("fastai_table.log")
    assert len(trace) == 6 and all(r["val_loss"] > r["loss"] for r in trace)


def test_bracketed_epoch_with_bare_iterations_and_one_letter_losses() -> None:
    trace, _ = _read("yolact.log")
    assert [r["step"] for r in trace] == list(range(10, 401, 10))
    assert trace[0]["epoch"] == 0 and trace[-1]["epoch"] == 2
    # the loss is T, the total of B, C, M, S
    assert trace[0]["loss"] == pytest.approx(float(
        (FIXTURES_DIR / "yolact.log").read_text().split("T: ")[1].split()[0]))  # fmt: skip


def test_tutorial_counter_restarts_each_epoch_and_is_counted_on() -> None:
    trace, _ = _read("pytorch_tutorial.log")
    assert [r["step"] for r in trace] == [20, 40, 60, 80, 100, 120, 140, 160, 180, 200]
    assert [r["epoch"] for r in trace] == [1] * 5 + [2] * 5


def test_lightning_bar_and_early_stopping_message() -> None:
    trace, _ = _read("lightning_bar.log")
    assert [r["step"] for r in trace] == list(range(1, 101))
    (message,) = [m for m in trace.meta["messages"] if m["kind"] == "metric_nonfinite"]
    assert message["metric"] == "val_loss"


def test_finest_counter_is_the_update() -> None:
    trace, _ = _read("accumulation_iter_step.log")
    assert [r["step"] for r in trace] == list(range(60))  # iter, not the optimizer step


def test_banner_and_config_dump_are_no_records() -> None:
    trace, diagnosis = _read("new_user_epochs.log")
    assert [r["step"] for r in trace] == list(range(1, 11))  # "lr=0.5" in the banner: no epoch
    assert "lr" not in trace[0]
    evidence = " ".join(item.text for item in diagnosis.evidence)
    assert "at epoch 7" in evidence and "inf" not in evidence.replace("infer", "")
    trace, _ = _read("namespace_config.log")
    assert len(trace) == 40 and trace[0]["step"] == 1 and "loss" in trace[0]


def test_deepspeed_calibration_overflows_are_no_alarm() -> None:
    trace, diagnosis = _read("deepspeed_calibration.log")
    overflows = [m for m in trace.meta["messages"] if m["kind"] == "loss_scale_overflow"]
    assert len(overflows) >= 8 and overflows[0]["scale"] == 2.0**31
    # DeepSpeed's own count of the steps it skipped so far, beside its step report
    assert trace[9]["step"] == 10 and trace[9]["extra"]["skipped_total"] == 10
    assert diagnosis.confidence >= 0.9 and not diagnosis.alternatives


def test_fairseq_validation_merges_without_replacing_the_training_loss() -> None:
    trace, diagnosis = _read("fairseq_minimum.log")
    text = (FIXTURES_DIR / "fairseq_minimum.log").read_text()
    last = trace[3]
    assert last["step"] == 400 and f"loss={last['loss']:.3f}" in text
    assert last["val_loss"] > last["loss"]  # the valid line's loss, beside it
    assert last["extra"]["loss_scale"] == 128.0
    assert [m["kind"] for m in trace.meta["messages"]][-1] == "loss_scale_min"
    assert "Minimum loss scale reached" in diagnosis.evidence[0].text


def test_megatron_scale_and_skipped_iterations_are_read() -> None:
    trace, diagnosis = _read("megatron_skipped.log")
    assert trace[0]["step"] == 10 and "loss_scale" in trace[0]["extra"]
    assert any(r.get("extra", {}).get("skipped") == 10 for r in trace)
    assert diagnosis.cause == "fp16_overflow"
    alternatives = {a["cause"]: a["confidence"] for a in diagnosis.alternatives}
    assert alternatives.get("exploding_gradients", 0) <= 0.5  # the scaler's overflow, not that


def test_trainer_nan_filter_is_named_and_not_called_finite() -> None:
    trace, diagnosis = _read("hf_nan_filter.log")
    filtered = [r["step"] for r in trace if "loss_nan_filtered" in (r.get("events") or ())]
    assert filtered == list(range(12, 31))
    text = render(diagnosis, trace)
    assert "NaN filter" in text and "NaN" in diagnosis.evidence[0].text
    assert "learning rate stopped" in diagnosis.evidence[0].text
    assert "logging_nan_inf_filter" in " ".join(diagnosis.actions)


def test_one_skipped_step_under_a_scaler_is_not_a_failure() -> None:
    trace, diagnosis = _read("trainer_state_skipped_first.json")
    assert math.isnan(trace[0]["grad_norm"]) and "skipped_step" in trace[0]["events"]
    assert "skipped" in " ".join(item.text for item in diagnosis.evidence)


def test_detectron2_reported_iteration_is_the_failure() -> None:
    trace, diagnosis = _read("detectron2_floating_point.log")
    assert trace[-1]["step"] == 157 and "loss_nonfinite_reported" in trace[-1]["events"]
    assert diagnosis.step == 157


def test_messages_of_mmdet_and_ultralytics() -> None:
    trace, _ = _read("mmdet_invalid_loss.log")
    assert [m["kind"] for m in trace.meta["messages"]] == ["nonfinite_loss"]
    trace, diagnosis = _read("ultralytics_recovered.log")
    # the NaN epoch was reloaded from a checkpoint, not skipped: it stays the failure
    assert not any("skipped_step" in (r.get("events") or ()) for r in trace)
    assert diagnosis.first_nonfinite == {"step": 40, "what": "loss"}


def test_messages_only_log_is_judged_from_the_scaler() -> None:
    trace, diagnosis = _read("apex_only_messages.log")
    assert "loss" not in trace[0] and trace.meta["loss_scale"]["floor"] is True
    assert diagnosis.cause == "fp16_overflow" and diagnosis.confidence >= 0.8


def test_absurd_first_record_and_short_jump_are_not_healthy() -> None:
    _, absurd = _read("absurd_first_record.log")
    assert absurd.rule == "D010" and "orders of magnitude" in absurd.evidence[0].text
    _, jump = _read("short_jump.log")
    assert jump.rule == "D011" and jump.evidence[0].data["ratio"] > 3
