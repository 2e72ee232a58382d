"""The text reader's block fast path gives exactly what the general per-line reader gives.

``textlog.iter_records`` reads whole blocks with one regex per line shape (``_Layout``); the
reference here reads the same decoded lines one at a time with ``_State.line`` only. Records
(values, key order, flags), messages and line numbers must be identical: on the shapes real
frameworks print (losses from a real diverging fit), on random mixes of shapes, perturbations,
messages and tracebacks, and with tiny blocks so that lines are cut across block boundaries.
"""

from __future__ import annotations

import json
import math
import random
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nanscope.logs._common as common
from nanscope.logs import textlog

from ._fits import least_squares_losses

FIXTURES = Path(__file__).parent / "fixtures"


def _general(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The reference: every line through the general reader, nothing else."""
    meta: dict[str, Any] = {}
    state = textlog._State(meta)
    records = []
    for block in common.iter_blocks(path, meta, split_cr=True):
        lines = block.split("\n")
        lines.pop()
        for line in lines:
            state.lineno += 1
            records.extend(state.line(line))
    last = state.merger.close()
    if last is not None:
        records.append(last)
    for entry in state.messages:
        if "_at" in entry:
            entry["ends_run"] = entry.pop("_at") >= state.merger.count
    meta["messages"] = state.messages
    if state.counts:
        meta["message_counts"] = dict(state.counts)
    return records, meta


def _dump(records: list[dict[str, Any]]) -> list[str]:
    # key order counts too: records are written to traces as they are
    return [json.dumps(list(r.items()), default=str) for r in records]


def _same(path: Path) -> list[dict[str, Any]]:
    meta: dict[str, Any] = {}
    fast = list(textlog.iter_records(path, meta))
    slow, slow_meta = _general(path)
    assert _dump(fast) == _dump(slow)
    assert meta == slow_meta
    return fast


def _losses(n: int) -> list[float]:
    """A real fit that diverges slowly: ~2,000 finite, growing losses, then inf and NaN."""
    return least_squares_losses(n, 0.01244, scales=(1.0, 3.0, 10.0))


#: line shapes frameworks print; {s} step, {e} epoch, {v} loss
SHAPES = [
    "step {s} | loss {v:.6f} | lr 1.0e-03 | 12.3 it/s",
    "step {s} | loss {v:.6g} | lr 2.05e-02 | {s3}.5 it/s",
    "iter {s}: loss={v:.4f}",
    "Epoch [{e}/5], Step [{s}/600], Loss: {v:.4f}",
    "[train] global_step={s} train/loss={v} grad_norm=1.5",
    "it {s}, loss tensor({v:.4f}, grad_fn=<MseLossBackward0>)",
    "2024-01-01 00:00:01,123 - mmdet - INFO - Epoch [{e}][{s}/100]\tlr: 1.000e-02, eta: 1:02:03, "
    "time: 0.512, loss_cls: {v:.4f}, loss: {v:.4f}, grad_norm: {v:.4f}",
    "iteration : {s}, losses : {v}",
    "Epoch[{e}] Batch[{s}]\tSpeed: 2.38 samples/sec\tIDLoss={v}",
    "[step {s}] loss_heatmap: {v} | lr 0.001",
    "| epoch {e:03d} | loss {v:.3f} | nll_loss {v:.3f} | ppl 3.1 | num_updates {s} | lr 0.0005 |",
    "{{'loss': {v}, 'grad_norm': {v}, 'learning_rate': 1e-05, 'epoch': {e}, 'step': {s}}}",
    "step {s:>6}  loss {v:>10.4f}  lr 3e-4",
    "Iter(train) [{s:>5}/90000]  lr: 1.0000e-02  eta: 1 day  time: 0.5  loss: {v:.4f}",
    # "loss nan 5": the general reader takes "loss nan" as a key there
    "step {s} loss {v} 5 lr 0.1",
    "step {s} loss {v}",
    # Keras written to a file: a header line, then the epoch's values
    "Epoch {s}/5000\n100/100 [==============================] - 2s 20ms/step - loss: {v:.4f} - "
    "val_loss: {v:.4f}",
    "Epoch {s}/5000\n63/63 - 0s - loss: {v:.4f}",
    # an epoch log, one line an epoch
    "Epoch {s}/5000, Loss: {v:.4f}, val_loss: {v:.4f}",
]
#: no printed step: the lines are counted (the Trainer's fractional epochs; Keras' bar)
COUNTED = [
    "{{'loss': {v:.4f}, 'grad_norm': {v:.4f}, 'learning_rate': 1e-05, 'epoch': {s3}.{s:04d}}}",
    "{s}/3000 [==============================] - 2s 20ms/step - loss: {v:.4f} - acc: 0.5",
]
SHAPES += COUNTED

OTHER_LINES = [
    "Gradient overflow.  Skipping step, reducing loss scale to 1024.0",
    "Epoch 3 done: loss 0.5 val_loss 0.25",
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in <module>',
    "RuntimeError: CUDA out of memory.",
    "ValueError: bad",
    "",
    "saving checkpoint to /tmp/ckpt_100.pt",
    "Function 'MulBackward0' returned nan values in its 0th output.",
    "12/100 [00:01<00:09, 9.8it/s, loss=0.42]",
    "step 7 | lr 0.3 | loss 1e-3 | 1 it/s",
    "step 8 | loss 0.5 | lr 1e-3 | 1 it/s extra",
    "step 99999999999999999 | loss 0.5 | lr 1e-3 | 1 it/s",
    "Epoch(val) [1][500/500]  loss: 0.25",
]


def _write(path: Path, lines: list[str], newline: str = "\n", end: bool = True) -> None:
    text = newline.join(lines) + (newline if end else "")
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_framework_shapes_from_a_real_fit(tmp_path: Path, shape: str) -> None:
    losses = _losses(3000)
    lines = []
    others = OTHER_LINES
    if "Epoch {s}/" in shape or shape in COUNTED:
        # (after a line with a printed step or a tqdm count, epoch lines and lines without a
        # step only add to that step: keep apart)
        others = [line for line in OTHER_LINES if "step" not in line.lower() and "<" not in line]
    for i, loss in enumerate(losses, 1):
        if i % 401 == 0:
            lines.append(others[i % len(others)])
        lines.append(shape.format(s=i, e=1 + i // 600, v=loss, s3=i % 3))
    path = tmp_path / "train.log"
    _write(path, lines)
    records = _same(path)
    assert len(records) >= 2900
    if "{v} 5" not in shape:  # (there "loss nan 5" reads as the key "loss nan", in both)
        assert any(r.get("nf_loss") for r in records)  # the fit's inf/NaN are read in both


def test_the_fast_path_is_taken_on_common_shapes() -> None:
    losses = _losses(200)[:150]  # finite part
    for shape in (*SHAPES[0:4], SHAPES[6], SHAPES[10], SHAPES[12], *SHAPES[14:]):
        block = "".join(shape.format(s=i, e=1, v=v, s3=1) + "\n" for i, v in enumerate(losses, 1))
        layout = textlog._find_layout(block)
        assert layout is not None, shape
        state = textlog._State({})
        layout.read(state, block)
        assert layout.fast_lines == block.count("\n"), shape


@pytest.mark.parametrize("odd", ["1.2.3", "e", "-", "1e5e", ".", "+-", "0.5x", "abc", "nan", "--1"])
def test_a_value_the_layout_skips_may_be_any_run_of_number_characters(
    tmp_path: Path, odd: str
) -> None:
    # mmdetection's lines carry values no role reads (time, data_time, loss_cls); the loose
    # pattern skips them as any run of number characters: an odd one there reads as the
    # general reader reads it, and the other lines stay on the fast path
    shape = (
        "2024-01-01 00:00:01,123 - mmdet - INFO - Epoch [1][{s}/3862]\tlr: 1.000e-02, "
        "eta: 1:02:03, time: {t}, data_time: 0.010, memory: 3021, loss_cls: {v:.4f}, "
        "loss: {v:.4f}, grad_norm: 3.1"
    )
    losses = _losses(400)[:300]
    lines = [
        shape.format(s=50 * i, t=odd if i % 37 == 0 else "0.512", v=v)
        for i, v in enumerate(losses, 1)
    ]
    path = tmp_path / "mmdet.log"
    _write(path, lines)
    records = _same(path)
    assert [r["step"] for r in records] == [50 * i for i in range(1, 301)]
    block = "".join(line + "\n" for line in lines)
    layout = textlog._find_layout(block)
    assert layout is not None
    layout.read(textlog._State({}), block)
    # a run of number characters stays on the fast path; anything else goes to the general one
    runs = all(c in "-+.0123456789eE" for c in odd)
    assert layout.fast_lines == (300 if runs else 300 - 300 // 37)


def test_seed_fixture_and_bench_shape() -> None:
    _same(FIXTURES / "seed_000_epochs.txt")


def _value(rng: random.Random, loss: float) -> str:
    roll = rng.random()
    if roll < 0.05:
        return rng.choice(["nan", "NaN", "-inf", "inf", "Infinity", "-nan", "+inf"])
    if roll < 0.08:
        return rng.choice(["0", "1", "-3", "1e400", "1.", ".5", "-0.0", "1E-5", "00012", "٣"])
    if roll < 0.1:
        return rng.choice(["1_0", "0x1", "1.2.3", "", "abc", "1e", "--1"])
    return rng.choice([f"{loss:.6f}", f"{loss:.4g}", repr(loss), f"{loss:e}"])


def _mix(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    shape = rng.choice(SHAPES)
    losses = _losses(n)
    lines = []
    step = 0
    for i, loss in enumerate(losses):
        roll = rng.random()
        step += 1 if roll > 0.02 else -rng.randint(1, 50)  # counters that restart
        if roll < 0.06:
            lines.append(rng.choice(OTHER_LINES))
            continue
        if roll < 0.062:
            shape = rng.choice(SHAPES)  # the log changes shape (now and then)
        line = shape.format(s=max(step, 0), e=1 + i // 97, v=0.0, s3=i % 7)
        line = line.replace("0.000000", "{v}").replace("0.0000", "{v}").replace("0.0", "{v}")
        line = line.replace("{v}", _value(rng, loss), 1).replace("{v}", _value(rng, loss))
        if rng.random() < 0.05:
            line = line.replace(" ", rng.choice(["  ", "\t", " \t", ""]), 1)
        if rng.random() < 0.03:
            line = line.replace(" ", "", 1)
        if rng.random() < 0.02:
            line = line.upper()
        lines.append(line)
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_random_mixes_with_tiny_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    lines = _mix(seed, 2500)
    path = tmp_path / "train.log"
    _write(path, lines, newline=rng.choice(["\n", "\r\n"]), end=rng.random() < 0.7)
    fast_lines = 0
    read = textlog._Layout.read

    def counted(self: textlog._Layout, state: Any, block: str) -> Any:
        nonlocal fast_lines
        out = read(self, state, block)
        fast_lines += self.fast_lines  # lines read from the layout's regex groups
        return out

    monkeypatch.setattr(textlog._Layout, "read", counted)
    _same(path)
    assert fast_lines > 0
    # small blocks: lines cut across reads, a layout looked for again where the shape changes
    monkeypatch.setattr(common, "CHUNK_BYTES", rng.choice([97, 256, 1000, 4096]))
    _same(path)
    assert fast_lines > len(lines) // 4  # the fast path did read a good part of it


def test_block_boundaries_crlf_and_no_final_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    losses = _losses(400)
    lines = [f"step {i} | loss {v:.6f} | lr 1e-3" for i, v in enumerate(losses, 1)]
    path = tmp_path / "train.log"
    for chunk in (31, 64, 1 << 20):
        monkeypatch.setattr(common, "CHUNK_BYTES", chunk)
        for newline in ("\n", "\r\n"):
            for end in (True, False):
                _write(path, lines, newline=newline, end=end)
                records = _same(path)
                assert [r["step"] for r in records] == list(range(1, 401))
                assert records[-1]["loss"] == float(f"{losses[-1]:.6f}") or (
                    records[-1].get("nf_loss") == 1
                )


def test_a_pending_traceback_is_ended_by_the_right_line(tmp_path: Path) -> None:
    losses = _losses(300)[:200]
    lines = [f"Loss={v:.4f} step={i}" for i, v in enumerate(losses, 1)]
    lines[100:100] = ["Traceback (most recent call last):", "  File 'x.py'", "LossError step=3"]
    lines.append("Traceback (most recent call last):")
    lines.extend(f"Loss={v:.4f} step={i}" for i, v in enumerate(losses, 300))
    path = tmp_path / "train.log"
    _write(path, lines)
    _same(path)


WORDS = st.sampled_from(
    [
        "step", "loss", "lr", "epoch", "val_loss", "grad_norm", "Loss", "iter", "nan", "inf",
        "returned", "error detected", "in", "overflow", "scale", "loss scale", "Error",
        " ", "  ", "\t", ": ", "=", " | ", "/", "-", "[", "]", "(", ")", "'", ",", ".",
        "0", "12", "0.5", "1e-3", "-2", "7.", ".25", "1e400", "١", "é",
        # fixed text that may vary within a layout: digits glued to a unit, a progress bar
        " 3s", "12ms/step", "ETA: 4s", "[==>...]", "[=]", "x3s", "3s_loss", "[.>=12]",
    ]
)  # fmt: skip


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    template=st.lists(WORDS, min_size=3, max_size=14),
    fills=st.lists(st.sampled_from(["0.25", "nan", "3", "-inf", "1e-2", "x", ""]), max_size=40),
)
def test_made_up_shapes(tmp_path: Path, template: list[str], fills: list[str]) -> None:
    base = "step {s} " + "".join(template) + " loss {v}"
    lines = []
    for i in range(120):
        fill = fills[i % len(fills)] if fills else "0.5"
        line = base.format(s=i + 1, v=f"0.{i + 1}")
        if i % 9 == 4:
            line = line.replace("0.5", fill).replace("12", fill)
        if i % 5 == 2:  # the unit's digits and the bar vary from line to line
            line = line.replace(" 3s", f" {i}s").replace("[==>...]", "[" + "=" * (i % 4) + ".]")
        lines.append(line)
    path = tmp_path / "train.log"
    _write(path, lines)
    _same(path)


def test_a_traceback_inside_a_block_before_lines_that_could_end_it(tmp_path: Path) -> None:
    # "ValueError: ..." lines are a layout that could be the exception line of a traceback
    losses = _losses(300)[:250]
    lines = [f"ValueError: loss {v:.4f} step {i}" for i, v in enumerate(losses, 1)]
    lines[120:120] = ["Traceback (most recent call last):", '  File "x.py", line 1']
    path = tmp_path / "train.log"
    _write(path, lines)
    records = _same(path)
    assert len(records) == 250
    meta: dict[str, Any] = {}
    list(textlog.iter_records(path, meta))
    assert meta["messages"][0]["exception"].startswith("ValueError: loss")


def test_eval_lines_between_train_lines_get_their_own_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    losses = _losses(6000)
    lines = []
    for i, loss in enumerate(losses, 1):
        lines.append(f"step {i} | loss {loss:.5f} | lr 1e-3")
        if i % 5 == 0:
            lines.append(f"step {i} | eval_loss {loss * 1.1:.5f} | acc 0.9")
    path = tmp_path / "train.log"
    _write(path, lines)
    fast_lines = 0
    read = textlog._Layout.read

    def counted(self: textlog._Layout, state: Any, block: str) -> Any:
        nonlocal fast_lines
        out = read(self, state, block)
        if self.depth == 0:
            fast_lines += self.fast_lines
        return out

    monkeypatch.setattr(textlog._Layout, "read", counted)
    records = _same(path)
    assert len(records) == 6000 and records[4]["val_loss"] == pytest.approx(losses[4] * 1.1, 1e-4)
    assert fast_lines > 0.95 * len(lines)  # the eval lines too, after the first block


def test_iter_records_stays_lazy_and_streams(tmp_path: Path) -> None:
    from nanscope.errors import TraceError
    from nanscope.logs import iter_records

    missing = iter_records(tmp_path / "missing.log")  # nothing opened yet
    with pytest.raises(TraceError):
        next(missing)
    path = tmp_path / "train.log"
    _write(path, [f"step {i} | loss {v:.5f}" for i, v in enumerate(_losses(50), 1)])
    meta: dict[str, Any] = {}
    stream = iter_records(path, meta)
    first = next(stream)
    assert first["step"] == 1 and meta["format"] == "text"
    assert len(list(stream)) == 49 and meta["granularity"] == "update"


@pytest.mark.parametrize(
    "shape",
    [
        # a count with its total, restarting each epoch (mmdetection logs every 50 iterations)
        "2024-01-01 00:00:01,123 - mmdet - INFO - Epoch [{e}][{it}/3862]\tlr: 1.000e-02, "
        "eta: 1:02:03, time: 0.512, loss_cls: {v:.4f}, loss: {v:.4f}, grad_norm: 3.1",
        "Epoch [{e}/5], Step [{it}/3862], Loss: {v:.4f}",
        # no total: the count restarts where the epoch changes
        "epoch {e} iter {it} loss {v:.5f} lr 0.001",
    ],
)
def test_counters_that_restart_each_epoch_stay_on_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    losses = _losses(3000)
    lines = []
    for i, loss in enumerate(losses):
        epoch, it = divmod(i, 77)  # 77 logged lines an epoch, every 50 iterations
        lines.append(shape.format(e=epoch + 1, it=(it + 1) * 50, v=loss))
        if i % 500 == 499:
            lines.append("Gradient overflow.  Skipping step, reducing loss scale to 1024.0")
    path = tmp_path / "train.log"
    _write(path, lines)
    slow_runs = 0
    one_by_one = textlog._Layout._one_by_one

    def counted(self: textlog._Layout, *args: Any) -> None:
        nonlocal slow_runs
        slow_runs += 1
        one_by_one(self, *args)

    monkeypatch.setattr(textlog._Layout, "_one_by_one", counted)
    records = _same(path)
    assert slow_runs == 0  # the fast path only (the reference reads line by line anyway)
    steps = [r["step"] for r in records]
    assert len(steps) == 3000 and steps == sorted(set(steps))
    if "3862" in shape:  # counted on by the total at each restart: 3862 updates an epoch
        assert steps[77] == 3862 + 50
    else:  # no total: counted on by the last count printed
        assert steps[77] == 77 * 50 + 50


def test_trainer_printed_dicts_with_eval_lines_and_the_summary(tmp_path: Path) -> None:
    # the Trainer prints no step: its lines are counted; eval lines join the update before
    losses = _losses(2600)
    lines = []
    for i, loss in enumerate(losses, 1):
        lines.append(
            f"{{'loss': {loss:.4f}, 'grad_norm': {loss * 3:.4f}, 'learning_rate': 1e-05, "
            f"'epoch': {i / 1000:.2f}}}"
        )
        if i % 50 == 0:
            lines.append(
                f"{{'eval_loss': {loss * 1.1:.4f}, 'eval_runtime': 10.2, "
                f"'eval_samples_per_second': 98.0, 'epoch': {i / 1000:.2f}}}"
            )
        if i == 1300:
            lines.append("")
            lines.append("Gradient overflow.  Skipping step, reducing loss scale to 1024.0")
    lines.append("{'train_runtime': 100.1, 'train_samples_per_second': 9.9, 'train_loss': 1.5, "
                 "'epoch': 2.6}")  # fmt: skip
    path = tmp_path / "trainer.out"
    _write(path, lines, end=False)  # a cut-off last line too
    records = _same(path)
    # the closing summary (train_runtime, the run's mean train_loss) is no update
    assert [r["step"] for r in records] == list(range(1, 2601))
    assert records[-1]["loss"] == float(f"{losses[-1]:.4f}") or math.isnan(records[-1]["loss"])
    assert records[49]["val_loss"] == pytest.approx(losses[49] * 1.1, rel=1e-3)
    assert "epoch" not in records[0]  # fractional epochs are no epoch counts
    assert any(r.get("nf_loss") for r in records)
    block = path.read_text()[:200_000]
    block = block[: block.rindex("\n") + 1]
    layout = textlog._find_layout(block)
    assert layout is not None and layout.fractional and layout.step < 0
    layout.read(textlog._State({}), block)
    assert layout.fast_lines > 0.9 * block.count("\n")


def _keras_progress(losses: list[float], batches: int) -> list[str]:
    """Keras 2's progress bar written to a file (not a terminal): a line per update, then the
    epoch's line with its time per step and validation loss; a real fit's losses."""
    lines = []
    epochs = len(losses) // batches
    for epoch in range(epochs):
        lines.append(f"Epoch {epoch + 1}/{epochs}")
        for k in range(1, batches + 1):
            loss = losses[epoch * batches + k - 1]
            done = 30 * k // batches
            bar = "=" * done + (">" if done < 30 else "") + "." * (29 - done)
            if k < batches:
                eta = f"{(batches - k) // 7}s" if k % 3 else f"{k // 60}:{k % 60:02d}"
                lines.append(f"{k:>4}/{batches} [{bar[:30]}] - ETA: {eta} - loss: {loss:.4f}")
            else:
                lines.append(
                    f"{k}/{batches} [{bar[:30]}] - {epoch % 4 + 1}s {epoch * 7 % 50 + 3}ms/step"
                    f" - loss: {loss:.4f} - val_loss: {loss * 1.1:.4f}"
                )
    return lines


def test_keras_progress_written_to_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _keras_progress(_losses(3000), batches=100)
    lines[1234:1234] = ["", "WARNING:tensorflow:Callback method `on_train_batch_end` is slow"]
    path = tmp_path / "train.log"
    _write(path, lines, end=False)
    slow_runs = 0
    one_by_one = textlog._Layout._one_by_one

    def counted(self: textlog._Layout, *args: Any) -> None:
        nonlocal slow_runs
        slow_runs += 1
        one_by_one(self, *args)

    monkeypatch.setattr(textlog._Layout, "_one_by_one", counted)
    records = _same(path)
    assert slow_runs == 0
    assert [r["step"] for r in records] == list(range(1, 31))  # one record an epoch
    assert records[0]["loss"] == pytest.approx(_losses(3000)[99], rel=1e-3)
    assert any(r.get("nf_loss") for r in records)
    text = path.read_text()
    block = text[: text.index("Epoch 11/")]
    layout = textlog._find_layout(block)
    assert layout is not None
    layout.read(textlog._State({}), block)
    # the ETA and bar vary from line to line, the template does not
    assert layout.fast_lines > 0.9 * block.count("\n")


def test_a_tqdm_bar_redrawn_for_hours_without_a_newline_is_read_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one tqdm bar over the whole run: one "line" of \r-separated redraws, longer than the
    # longest line a reader buffers (shrunk here to 64 KB)
    monkeypatch.setattr(common, "MAX_LINE_BYTES", 64 * 1024)
    monkeypatch.setattr(common, "CHUNK_BYTES", 4096)
    losses = _losses(3000)
    bar = "".join(
        f"\r{i * 100 // 3000:3d}%|#####     | {i}/3000 [00:{i // 60:02d}<00:10, 9.8it/s, "
        f"loss={loss:.4f}]"
        for i, loss in enumerate(losses, 1)
    )
    assert len(bar) > 3 * 64 * 1024
    path = tmp_path / "train.log"
    _write(path, ["Training", bar, "done"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "skipped line" warning
        records = _same(path)
    assert [r["step"] for r in records] == list(range(1, 3001))
    want = [float(f"{v:.4f}") for v in losses]
    assert [r["loss"] for r in records if not r.get("nf_loss")] == [
        v for v in want if math.isfinite(v)
    ]
