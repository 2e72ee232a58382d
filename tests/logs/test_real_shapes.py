"""Logs in the shapes real frameworks print, written from real small fits in this test."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.logs import LogWarning, load_trace, sniff, textlog

from ._fits import least_squares_losses


def _fit(steps: int, lr: float, seed: int = 0) -> list[float]:
    """Least squares by gradient descent on unscaled features: too large an lr diverges."""
    return least_squares_losses(steps, lr, scales=(1.0, 3.0, 10.0), seed=seed)


def _same(got: np.ndarray, want: list[float]) -> None:
    want_a = np.array(want)
    assert np.array_equal(np.isfinite(got), np.isfinite(want_a))
    ok = np.isfinite(want_a)
    assert np.allclose(got[ok], want_a[ok], rtol=1e-3)


def test_mmdetection_iterations_are_updates_counted_across_epochs(tmp_path: Path) -> None:
    losses = _fit(40, lr=0.02)  # diverges to inf/nan within 40 updates
    path = tmp_path / "20240101_000000.log"
    lines = []
    for i, loss in enumerate(losses):
        epoch, it = divmod(i, 20)
        lines.append(
            f"2024-01-01 00:00:{i:02d},123 - mmdet - INFO - Epoch [{epoch + 1}][{(it + 1) * 5}/100]"
            f"\tlr: 1.000e-02, eta: 1:02:03, time: 0.512, data_time: 0.010, memory: 3021, "
            f"loss_cls: {loss / 2:.4f}, loss_bbox: {loss / 2:.4f}, loss: {loss:.4f}, "
            f"grad_norm: {loss * 3:.4f}"
        )
    path.write_text("\n".join(lines) + "\n")
    trace = load_trace(path)
    assert trace.meta["granularity"] == "update"
    steps = [r["step"] for r in trace]
    assert steps[:3] == [5, 10, 15] and steps[20] == 105  # epoch 2 counts on from 100
    assert [r["epoch"] for r in trace][19:21] == [1, 2]
    _same(trace.column("loss"), [float(f"{v:.4f}") for v in losses])
    assert trace[0]["lr"] == 1e-2


@pytest.mark.parametrize(
    "template",
    [
        "iteration : {s}, losses : {v}",
        "Epoch[0] Batch[{s}]\tSpeed: 2.38 samples/sec\tIDLoss={v}",
        "[step {s}] loss_heatmap: {v} | lr 0.001",
        "| epoch 001 | loss {v} | nll_loss {v} | ppl 3.1 | num_updates {s} | lr 0.0005 |",
    ],
)
def test_loss_columns_people_name_anything(tmp_path: Path, template: str) -> None:
    losses = _fit(30, lr=0.001)
    path = tmp_path / "run.log"
    path.write_text(
        "\n".join(template.format(s=i, v=f"{v:.6g}") for i, v in enumerate(losses, 1)) + "\n"
    )
    assert sniff(path) == "text"
    trace = load_trace(path)
    assert [r["step"] for r in trace] == list(range(1, 31))
    _same(trace.column("loss"), [float(f"{v:.6g}") for v in losses])


def test_validation_only_losses_make_no_nonfinite_updates(tmp_path: Path) -> None:
    path = tmp_path / "val.log"
    losses = _fit(5, lr=0.001)
    rows = []
    for epoch, v in enumerate(losses, 1):
        rows.append(f"Epoch {epoch}: val_loss improved from inf to {v:.5f}, saving model")
        rows.append(f"[Epoch {epoch}] valid loss: {v:.5f} best_val_loss: inf")
    path.write_text("\n".join(rows) + "\n")
    with pytest.warns(LogWarning, match="validation loss is read as the loss"):
        trace = load_trace(path)
    assert len(trace) == 5
    # the only loss is the validation loss: read as the loss ("best_val_loss: inf" is not one)
    assert trace.meta["loss_key"] == "val_loss"
    assert all("nf_loss" not in r and r["loss"] == r["val_loss"] for r in trace)
    assert np.all(np.isfinite(trace.column("val_loss")))
    # no update is non-finite; with no training loss read, nothing says how the fit went
    # (unobserved), unless the reader takes the validation loss as the loss (then healthy)
    assert nanscope.diagnose(trace).verdict in ("healthy", "unobserved")


def test_exact_zeros_after_a_finite_loss_are_read_as_zeros(tmp_path: Path) -> None:
    path = tmp_path / "hf.out"
    rows = [f"{{'loss': {3.8 / k:.4f}, 'grad_norm': 1.5, 'learning_rate': 5e-05}}" for k in (1, 2)]
    rows += ["{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 5e-05}"] * 3
    rows += ["step 6 loss: 0.0000"]
    path.write_text("\n".join(rows) + "\n")
    trace = load_trace(path)
    assert list(trace.column("loss")) == [3.8, 1.9, 0.0, 0.0, 0.0, 0.0]
    assert not any(r.get("nf_loss") for r in trace)


@pytest.mark.slow
def test_block_reader_gives_what_the_line_reader_gives(tmp_path: Path) -> None:
    losses = _fit(30_000, lr=0.0205)
    path = tmp_path / "big.log"
    with path.open("w") as out:
        for step, loss in enumerate(losses, 1):
            if step % 997 == 0:
                print("Gradient overflow.  Skipping step, reducing loss scale to 1024.0", file=out)
            if step % 5000 == 0:
                print(f"Epoch {step // 5000} done: loss {loss:.3g} val_loss 0.5", file=out)
            print(f"step {step} | loss {loss:.6g} | lr 2.05e-02 | {step % 13}.5 it/s", file=out)
    fast_meta: dict = {}
    fast = list(textlog.iter_records(path, fast_meta))
    slow_meta: dict = {}
    state = textlog._State(slow_meta)
    slow = []
    for line in path.read_text().splitlines():
        state.lineno += 1
        slow.extend(state.line(line))
    last = state.merger.close()
    slow.append(last)
    assert len(fast) == len(slow) == 30_000

    def key(r: dict) -> str:
        return json.dumps(r, sort_keys=True, default=str)

    assert [key(r) for r in fast] == [key(r) for r in slow]
    assert [m["line"] for m in fast_meta["messages"]] == [m["line"] for m in state.messages]


def test_one_row_of_invalid_utf8_does_not_make_a_log_binary(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    rows = [f"step {i} | loss {v:.5f}".encode() for i, v in enumerate(_fit(6, 0.001), 1)]
    rows.insert(3, b"saving to /data/\xe9t\xe9/\xff\xfe\xfa\xfb\xfc\xfd\x80\x81\x82\x83\x84 ok")
    path.write_bytes(b"\n".join(rows) + b"\n")
    assert sniff(path) == "text"
    assert len(load_trace(path)) == 6
    diagnosis = nanscope.diagnose(path)
    assert diagnosis.verdict == "healthy"


def test_utf16_log_from_powershell_redirection(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("step 1 loss 0.5\r\nstep 2 loss nan\r\n", encoding="utf-16")
    trace = load_trace(path)
    assert trace[0]["loss"] == 0.5 and trace[1]["nf_loss"] == 1


def test_trainer_state_strings_are_counted_and_warned(tmp_path: Path) -> None:
    history = [{"loss": 1.0, "step": 1}, {"loss": "0.5", "step": 2}, {"loss": "n/a", "step": 3}]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": history}))
    with pytest.warns(LogWarning) as caught:
        trace = load_trace(path)
    text = " ".join(str(w.message) for w in caught)
    assert "numbers written as strings" in text and "not numbers" in text
    assert [r["loss"] for r in trace if "loss" in r] == [1.0, 0.5]
    assert trace.meta["quoted_numbers"] == 1 and trace.meta["bad_values"] == 1
    assert trace.meta["skipped_entries"] == 1


def test_jsonl_cut_mid_record_is_read_up_to_the_cut(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"step": 1, "train/loss": 0.9}\n{"step": 2, "train/loss": 0.8}\n{"step": 3, "tra'
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(path)
    assert [r["step"] for r in trace] == [1, 2]
    assert trace.meta["truncated"] is True and "skipped_lines" not in trace.meta
    assert any(issubclass(w.category, LogWarning) and "cut short" in str(w.message) for w in caught)
    assert trace.meta["format"] == "jsonl" and math.isfinite(trace[1]["loss"])
    ours = tmp_path / "trace.jsonl"
    ours.write_text('{"step": 1, "loss": 0.9}\n{"step": 2, "loss": 0.8}\n{"step": 3, "lo')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load_trace(ours).meta["truncated"] is True
