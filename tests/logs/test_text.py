"""Plain-text training output: real numpy fits print logs, the reader gets the numbers back."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from nanscope.logs import load_trace, sniff

from ._fits import least_squares_losses

FIXTURES = Path(__file__).parent / "fixtures"


def _diverging_fit(steps: int, lr: float = 0.9) -> list[float]:
    """Least squares on unscaled features with a step far too large: loss grows, then inf/NaN."""
    return least_squares_losses(steps, lr, scales=(1.0, 10.0, 100.0))


def test_seed_000_epoch_blocks() -> None:
    path = FIXTURES / "seed_000_epochs.txt"
    assert sniff(path) == "text"
    trace = load_trace(path)
    assert trace.meta["granularity"] == "epoch"
    assert trace.meta["lines"] == 22
    assert [r["step"] for r in trace] == list(range(80, 91))
    assert trace[0]["loss"] == pytest.approx(0.972911523852701)
    assert trace[0]["val_loss"] == pytest.approx(0.9729658)
    first_nan = next(r for r in trace if math.isnan(r["loss"]))
    assert first_nan["step"] == 85 and first_nan["epoch"] == 85 and first_nan["nf_loss"] == 1
    assert math.isnan(first_nan["val_loss"])
    assert trace.meta["messages"] == []


def test_print_loop_from_a_real_diverging_fit(tmp_path: Path) -> None:
    losses = _diverging_fit(400)
    path = tmp_path / "train.log"
    with path.open("w") as out:
        print("loading data... 64 rows", file=out)
        for step, loss in enumerate(losses, start=1):
            print(f"step {step} | loss {loss:.6g} | lr 9e-1", file=out)
    trace = load_trace(path)
    assert trace.meta["format"] == "text"
    assert trace.meta["granularity"] == "update"
    assert [r["step"] for r in trace] == list(range(1, 401))
    assert trace[0]["lr"] == 0.9
    got = trace.column("loss")
    want = np.array([float(f"{v:.6g}") for v in losses])
    assert np.array_equal(np.isfinite(got), np.isfinite(want))
    finite = np.isfinite(want)
    assert np.allclose(got[finite], want[finite])
    first_bad = int(np.argmin(np.isfinite(want)))
    assert first_bad > 10  # a growth phase, then inf/NaN
    assert trace[first_bad]["nf_loss"] == 1


@pytest.mark.parametrize(
    "template",
    [
        "iter {s}: loss={v}",
        "Epoch [1/5], Step [{s}/600], Loss: {v}",
        "[train] global_step={s} train/loss={v} grad_norm=1.5",
        "it {s}, loss tensor({v}, grad_fn=<MseLossBackward0>)",
    ],
)
def test_update_loop_shapes(tmp_path: Path, template: str) -> None:
    values = ["0.5", "0.25", "NaN", "-INF", "Infinity", "inf"]
    path = tmp_path / "loop.txt"
    path.write_text("\n".join(template.format(s=i * 10, v=v) for i, v in enumerate(values, 1)))
    trace = load_trace(path)
    assert trace.meta["granularity"] == "update"
    assert [r["step"] for r in trace] == [10, 20, 30, 40, 50, 60]
    loss = trace.column("loss")
    assert loss[0] == 0.5 and loss[1] == 0.25 and math.isnan(loss[2])
    assert list(loss[3:]) == [-math.inf, math.inf, math.inf]


def test_keras_progress_with_carriage_returns_and_backspaces(tmp_path: Path) -> None:
    losses = _diverging_fit(6, lr=0.02)
    lines = []
    for epoch, loss in enumerate(losses, start=1):
        lines.append(f"Epoch {epoch}/6")
        bar = "".join(
            f"\r {k}/10 [{'=' * k}>{'.' * (10 - k)}] - ETA: 1s - loss: {loss * 2:.4f}"
            for k in range(1, 10)
        )
        final = (
            "\x08\x08\x0810/10 [==========] - 0s 2ms/step"
            f" - loss: {loss:.4f} - val_loss: {loss + 1:.4f}"
        )
        lines.append(bar + final)
    path = tmp_path / "keras.txt"
    path.write_text("\n".join(lines) + "\n")
    trace = load_trace(path)
    assert trace.meta["granularity"] == "epoch"
    assert [r["step"] for r in trace] == [1, 2, 3, 4, 5, 6]
    for record, loss in zip(trace, losses):
        assert record["loss"] == pytest.approx(float(f"{loss:.4f}"))
        assert record["val_loss"] == pytest.approx(float(f"{loss + 1:.4f}"))


def test_keras3_progress_and_terminate_on_nan(tmp_path: Path) -> None:
    path = tmp_path / "k3.log"
    path.write_text(
        "Epoch 1/3\n"
        "\x1b[1m32/32\x1b[0m \x1b[32m━━━━━━━━━━━━━━━━━━━━\x1b[0m\x1b[37m\x1b[0m \x1b[1m1s\x1b[0m"
        " 3ms/step - loss: 12.5 - val_loss: 11.0\n"
        "Epoch 2/3\n"
        "\x1b[1m32/32\x1b[0m ━━━━━━━━━━━━━━━━━━━━ 0s 2ms/step - loss: nan - val_loss: nan\n"
        "Batch 3: Invalid loss, terminating training\n"
    )
    trace = load_trace(path)
    assert [r["step"] for r in trace] == [1, 2]
    assert trace[0]["loss"] == 12.5 and math.isnan(trace[1]["loss"])
    assert [m["kind"] for m in trace.meta["messages"]] == ["terminate_on_nan"]
    assert trace.meta["messages"][0]["step"] == 2


def test_tqdm_postfix_counts_on_across_epochs(tmp_path: Path) -> None:
    rows = []
    for epoch in range(2):
        segments = [
            f"Epoch {epoch}: {n * 25}%|##| {n}/4 [00:0{n}<00:01, 9.1it/s, v_num=0, "
            f"train_loss={0.9 - 0.1 * (4 * epoch + n):.2f}]"
            for n in range(1, 5)
        ]
        rows.append("\r".join(segments))
    rows[-1] = rows[-1].replace("train_loss=0.10", "train_loss=nan")
    path = tmp_path / "tqdm.log"
    path.write_text("\n".join(rows) + "\n")
    trace = load_trace(path)
    assert trace.meta["granularity"] == "update"
    assert [r["step"] for r in trace] == list(range(1, 9))
    assert [r["epoch"] for r in trace] == [0] * 4 + [1] * 4
    assert trace[0]["loss"] == 0.8 and math.isnan(trace[7]["loss"])


def test_trainer_printed_dicts(tmp_path: Path) -> None:
    path = tmp_path / "hf.out"
    path.write_text(
        "{'loss': 2.31, 'grad_norm': 4.5, 'learning_rate': 5e-05, 'epoch': 0.1}\n"
        "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4e-05, 'epoch': 0.2}\n"
        "{'eval_loss': nan, 'eval_runtime': 1.2, 'epoch': 0.2}\n"
    )
    trace = load_trace(path)
    assert len(trace) == 2
    assert trace[0]["lr"] == 5e-05 and trace[0]["grad_norm"] == 4.5
    assert math.isnan(trace[1]["grad_norm"]) and trace[1]["nf_grads"] == 1
    assert math.isnan(trace[1]["val_loss"])


def test_framework_messages(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(
        "step 1 | loss 0.9\n"
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0\n"
        "step 2 | loss 0.8\n"
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1\n"
        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n"
        "step 3 | loss nan\n"
        "[W python_anomaly_mode.cpp:104] Warning: Error detected in LogBackward0. Traceback of"
        " forward call that caused the error:\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 9, in <module>\n'
        "    loss.backward()\n"
        "RuntimeError: Function 'LogBackward0' returned nan values in its 0th output.\n"
    )
    trace = load_trace(path)
    kinds = [m["kind"] for m in trace.meta["messages"]]
    assert kinds == [
        "loss_scale_overflow",
        "loss_scale_overflow",
        "loss_scale_min",
        "anomaly",
        "traceback",
        "anomaly",
    ]
    messages = trace.meta["messages"]
    assert messages[0]["step"] == 1 and messages[0]["line"] == 2 and messages[0]["scale"] == 32768.0
    assert messages[1]["scale"] == 1.0
    assert messages[3]["op"] == "LogBackward0" and messages[5]["op"] == "LogBackward0"
    assert messages[4]["ends_run"] is True
    assert messages[4]["exception"].startswith("RuntimeError: Function 'LogBackward0'")
    assert trace.meta["message_counts"]["loss_scale_overflow"] == 2


def test_oom_and_nccl_without_any_loss(tmp_path: Path) -> None:
    path = tmp_path / "crash.log"
    path.write_text(
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "[rank1]:[E ProcessGroupNCCL.cpp:563] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
    )
    assert sniff(path) == "text"
    trace = load_trace(path)
    assert len(trace) == 0
    kinds = [m["kind"] for m in trace.meta["messages"]]
    assert kinds == ["traceback", "oom", "nccl"]
    assert trace.meta["messages"][0]["exception"].startswith("torch.OutOfMemoryError")
    assert all(m["step"] is None for m in trace.meta["messages"])


def test_epoch_summaries_in_update_log_only_add_val_loss(tmp_path: Path) -> None:
    path = tmp_path / "mixed.log"
    path.write_text(
        "step 1 loss 1.0\nstep 2 loss 0.9\nEpoch 1 done: loss 0.95 val_loss 0.97\nstep 3 loss 0.8\n"
    )
    trace = load_trace(path)
    assert [r["step"] for r in trace] == [1, 2, 3]
    assert trace[1]["val_loss"] == 0.97 and trace[1]["loss"] == 0.9


def test_loss_after_pages_of_warnings_is_still_found(tmp_path: Path) -> None:
    path = tmp_path / "slurm-123.out"
    noise = "".join(f"UserWarning: something deprecated in module {i}\n" for i in range(3000))
    path.write_text(noise + "iter 1: loss=0.5\niter 2: loss=nan\n")
    assert path.stat().st_size > 64 * 1024
    assert sniff(path) == "text"
    trace = load_trace(path)
    assert [r["step"] for r in trace] == [1, 2]
    assert trace.meta["lines"] == 3002


def test_fractional_epochs_never_become_steps(tmp_path: Path) -> None:
    lines = [f"{{'loss': {1.0 / k:.3f}, 'epoch': {k / 4:.2f}}}" for k in range(1, 9)]
    path = tmp_path / "hf.out"
    path.write_text("\n".join(lines) + "\n")
    trace = load_trace(path)
    assert [r["step"] for r in trace] == list(range(1, 9))
    assert all("epoch" not in r for r in trace)
    jsonl = tmp_path / "hf.jsonl"
    jsonl.write_text("".join(f'{{"loss": 0.5, "epoch": {k / 4}}}\n' for k in range(1, 9)))
    trace = load_trace(jsonl)
    assert [r["step"] for r in trace] == list(range(1, 9))
    assert trace[3]["extra"]["epoch"] == 1.0
