"""JSONL, CSV and nanscope-trace readers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nanscope.errors import TraceError
from nanscope.logs import load_trace, sniff
from nanscope.trace import TraceWriter


def test_nanscope_trace_is_delegated(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, {"run": "r1"})
    writer.write({"step": 1, "loss": 1.0, "grad_norm": 2.0})
    writer.write({"step": 2, "loss": math.inf, "nf_loss": 1})
    writer.close()
    assert sniff(path) == "nanscope"
    assert sniff(tmp_path) == "nanscope"
    trace = load_trace(path)
    assert trace.meta["format"] == "nanscope"
    assert trace.meta["run"] == "r1"
    assert [r["step"] for r in trace] == [1, 2]
    assert trace[1]["loss"] == math.inf


def test_headerless_records_that_look_like_ours(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": "nan", "nf_loss": 1}\n')
    assert sniff(path) == "nanscope"
    trace = load_trace(path)
    assert math.isnan(trace[1]["loss"])


def test_jsonl_any_key_names(tmp_path: Path) -> None:
    path = tmp_path / "metrics.log"
    lines = [
        {"global_step": 10, "train/loss": 0.9, "learning_rate": 1e-3, "gradient_norm": 1.5},
        {"global_step": 20, "train/loss": 0.7, "learning_rate": 1e-3, "gradient_norm": 2.5},
        {"global_step": 20, "eval_loss": 0.8},
        {"global_step": 30, "train/loss": "NaN", "learning_rate": 1e-3, "gradient_norm": "inf"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert sniff(path) == "jsonl"
    trace = load_trace(path)
    assert trace.meta["format"] == "jsonl"
    assert trace.meta["granularity"] == "update"
    assert [r["step"] for r in trace] == [10, 20, 30]
    assert trace[1]["val_loss"] == 0.8 and trace[1]["loss"] == 0.7
    assert trace[0]["lr"] == 1e-3 and trace[0]["grad_norm"] == 1.5
    assert math.isnan(trace[2]["loss"]) and trace[2]["nf_loss"] == 1
    assert trace[2]["grad_norm"] == math.inf and trace[2]["nf_grads"] == 1


def test_jsonl_bare_nan_tokens_and_nesting(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"iteration": 1, "metrics": {"training_loss": 0.5, "lr": 0.1}}\n'
        '{"iteration": 2, "metrics": {"training_loss": NaN, "lr": 0.1}}\n'
        '{"iteration": 3, "metrics": {"training_loss": -Infinity}}\n'
    )
    trace = load_trace(path)
    assert [r["step"] for r in trace] == [1, 2, 3]
    assert trace[0]["lr"] == 0.1
    assert math.isnan(trace[1]["loss"])
    assert trace[2]["loss"] == -math.inf


def test_jsonl_epoch_only_is_epoch_granularity(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text(
        '{"epoch": 1, "loss": 2.0}\n{"epoch": 2, "loss": 1.0}\n{"epoch": 3, "loss": NaN}\n'
    )
    trace = load_trace(path)
    assert trace.meta["granularity"] == "epoch"
    assert [r["step"] for r in trace] == [1, 2, 3]


def test_csv_step_loss(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text(
        "step,loss,grad_norm,lr,acc\n1,0.9,1.0,0.1,0.5\n2,0.8,2.0,0.1,0.6\n3,nan,inf,0.1,x\n"
    )
    assert sniff(path) == "csv"
    trace = load_trace(path)
    assert trace.meta["granularity"] == "update"
    assert [r["step"] for r in trace] == [1, 2, 3]
    assert trace[0]["extra"] == {"acc": 0.5}
    assert "extra" not in trace[2]
    assert math.isnan(trace[2]["loss"]) and trace[2]["nf_grads"] == 1


def test_keras_csvlogger(tmp_path: Path) -> None:
    path = tmp_path / "training.log"
    # what keras.callbacks.CSVLogger writes: epoch from 0, keys sorted
    path.write_text(
        "epoch,accuracy,loss,val_accuracy,val_loss\n"
        "0,0.5,0.69,0.55,0.68\n1,0.6,0.60,0.58,0.61\n2,0.1,nan,0.1,nan\n"
    )
    trace = load_trace(path)
    assert trace.meta["granularity"] == "epoch"
    assert [r["step"] for r in trace] == [0, 1, 2]
    assert trace[1]["val_loss"] == 0.61
    assert math.isnan(trace[2]["loss"]) and trace[2]["nf_loss"] == 1
    assert trace.meta["columns"]["loss"] == "loss"


def test_lightning_sparse_metrics_csv(tmp_path: Path) -> None:
    run = tmp_path / "lightning_logs" / "version_0"
    run.mkdir(parents=True)
    path = run / "metrics.csv"
    path.write_text(
        "epoch,step,train_loss_epoch,train_loss_step,val_loss\n"
        "0,9,,0.90,\n"
        "0,19,,0.70,\n"
        "0,19,,,0.75\n"
        "0,19,0.80,,\n"
        "1,29,,nan,\n"
        "1,39,,,nan\n"
    )
    assert sniff(tmp_path) == "csv"
    trace = load_trace(tmp_path)
    assert trace.meta["columns"]["loss"] == "train_loss_step"
    assert [r["step"] for r in trace] == [9, 19, 29, 39]
    assert trace[1]["loss"] == 0.70 and trace[1]["val_loss"] == 0.75
    assert trace[1]["extra"]["train_loss_epoch"] == 0.80
    assert math.isnan(trace[2]["loss"]) and trace[2]["epoch"] == 1
    assert "loss" not in trace[3] and math.isnan(trace[3]["val_loss"])


def test_csv_without_loss_column_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match=r"x\.csv"):
        load_trace(path)


def test_max_records_thins_but_keeps_the_run_up_to_the_nan(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    n = 20_000
    rows = [f"{i},{'nan' if i >= 15_000 else 1.0 / i}" for i in range(1, n + 1)]
    path.write_text("step,loss\n" + "\n".join(rows) + "\n")
    full = load_trace(path)
    assert len(full) == n and "thinned" not in full.meta
    small = load_trace(path, max_records=1000)
    thinned = small.meta["thinned"]
    assert thinned["of"] == n and len(small) == thinned["kept"] <= 1000 + 2 * 125
    steps = [r["step"] for r in small]
    assert steps == sorted(steps) and steps[0] == 1
    window = thinned["window"]
    # full resolution just before and after the first NaN (step 15000)
    assert set(range(15_000 - window, 15_000 + window)) <= set(steps)
    assert small[steps.index(15_000)]["nf_loss"] == 1
    assert load_trace(path, max_records=n).meta.get("thinned") is None


def test_sniffing_is_by_content_not_name(tmp_path: Path) -> None:
    cases = {
        "a.txt": ("step,loss\n1,0.5\n2,nan\n", "csv"),
        "b.csv": ('{"iter": 1, "loss": 0.5}\n{"iter": 2, "loss": NaN}\n', "jsonl"),
        "c.json": (
            "Epoch 1/2\n10/10 [====] - loss: 0.5\nEpoch 2/2\n10/10 [====] - loss: nan\n",
            "text",
        ),
        "d.log": ('{\n  "log_history": [\n    {"loss": 0.5, "step": 1}\n  ]\n}\n', "trainer_state"),
    }
    for name, (content, fmt) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        assert sniff(path) == fmt, name
        assert len(load_trace(path)) >= 1
