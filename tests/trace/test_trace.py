"""The JSONL trace: strict JSON on disk, non-finite floats round-trip, bad files say why."""

from __future__ import annotations

import json
import math

import pytest

from nanscope.errors import TraceError
from nanscope.trace import Trace, TraceWriter, decode_record, encode_record, read_trace


def test_nonfinite_floats_round_trip_as_strict_json():
    line = encode_record({"step": 1, "loss": math.nan, "grad_norm": math.inf, "lr": None})
    obj = json.loads(line)  # strict JSON: no bare NaN tokens
    assert obj == {"step": 1, "loss": "nan", "grad_norm": "inf"}
    back = decode_record(obj)
    assert math.isnan(back["loss"]) and back["grad_norm"] == math.inf


def test_writer_flushes_every_record(tmp_path):
    writer = TraceWriter(tmp_path / "t.jsonl", {"run_id": "x"})
    writer.write({"step": 1, "loss": 1.0})
    # readable before close: each record is flushed
    trace = read_trace(tmp_path / "t.jsonl")
    assert trace.meta["run_id"] == "x" and len(trace) == 1
    writer.close()


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"schema": "nanscope.trace/1"}\n{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    with pytest.warns(UserWarning, match="truncated"):
        trace = read_trace(path)
    assert len(trace) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "empty"), (b"\x00\x01\x02binary", "binary"), (b"not json at all\n", "no trace")],
)
def test_bad_files_raise_trace_error(tmp_path, content, message):
    path = tmp_path / "t.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=message):
        if message == "no trace":
            with pytest.warns(UserWarning):
                read_trace(path)
        else:
            read_trace(path)


def test_missing_file():
    with pytest.raises(TraceError, match="no such file"):
        read_trace("/nonexistent/trace.jsonl")


def test_columns_and_nonfinite_counts():
    trace = Trace([{"step": 1, "loss": 1.0}, {"step": 2, "loss": math.nan, "grad_norm": 2.0}])
    assert trace.nonfinite("loss").tolist() == [0.0, 1.0]
    assert trace.present("grad_norm").tolist() == [False, True]


def _least_squares(steps: int, lr: float = 0.01, seed: int = 0):
    """A real mini-batch least-squares fit: yields (loss, params, grads, X, y) per update."""
    import numpy as np

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(256, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.normal(size=256)
    w = np.zeros(4)
    for _ in range(steps):
        batch = rng.integers(0, 256, 32)
        residual = X[batch] @ w - y[batch]
        grad = 2 * X[batch].T @ residual / len(batch)
        yield float(np.mean(residual**2)), {"w": w}, {"w": grad}, X[batch], y[batch]
        w = w - lr * grad


@pytest.mark.usefixtures("ctrl_c")
def test_events_are_kept_apart_from_the_records(tmp_path):
    import signal

    import nanscope

    run = tmp_path / "run"
    mon = nanscope.Monitor(run_dir=run)
    seen = 0
    try:
        for loss, params, grads, xb, yb in _least_squares(200):
            if seen == 25:
                signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C
            mon.update(loss, params=params, grads=grads, lr=0.01, inputs=xb, targets=yb)
            seen += 1
    except KeyboardInterrupt:
        mon.close()
        TraceWriter(run / "trace.jsonl").event("interrupted", signal="SIGINT", step=seen)
    trace = read_trace(run / "trace.jsonl")
    assert len(trace) == 25 and all("event" not in r for r in trace.records)
    assert trace.meta["events"] == [{"event": "interrupted", "signal": "SIGINT", "step": 25}]
    # reopening the trace appended the event without a second header
    lines = (run / "trace.jsonl").read_text().splitlines()
    assert sum('"schema"' in line for line in lines) == 1
    assert json.loads(lines[-1])["event"] == "interrupted"


def test_a_header_without_updates_reads_as_an_empty_trace(tmp_path):
    path = tmp_path / "t.jsonl"
    TraceWriter(path, {"run_id": "x"}).event("interrupted", signal="SIGTERM", step=0)
    trace = read_trace(path)
    assert len(trace) == 0 and trace.meta["run_id"] == "x"
    assert trace.meta["events"][0]["signal"] == "SIGTERM"


def test_a_cut_last_line_marks_the_trace_truncated(tmp_path):
    import nanscope

    run = tmp_path / "run"
    mon = nanscope.Monitor(run_dir=run)
    for loss, params, grads, xb, yb in _least_squares(30):
        mon.update(loss, params=params, grads=grads, lr=0.01, inputs=xb, targets=yb)
    mon.close()
    path = run / "trace.jsonl"
    whole = path.read_bytes()
    assert "truncated" not in read_trace(path).meta
    path.write_bytes(whole[: whole.rstrip(b"\n").rfind(b"\n") + 20])  # killed mid-record
    with pytest.warns(UserWarning, match="truncated"):
        trace = read_trace(path)
    assert trace.meta["truncated"] is True and len(trace) == 29


def test_the_record_keys_are_the_documented_table():
    import re

    import nanscope.trace as trace_module
    from nanscope.trace import NUMERIC_KEYS, RECORD_KEYS

    doc = trace_module.__doc__ or ""
    table = doc.split("=================  ======", 2)[2].split("=================  ======")[0]
    documented = {m.group(1) for m in re.finditer(r"^(\w+)\s+(?:int|float|dict|list|bool)\s", table,
                                                   re.M)}  # fmt: skip
    assert documented == set(RECORD_KEYS)
    assert NUMERIC_KEYS <= RECORD_KEYS


def test_the_streaming_reader_keeps_events_apart_too(tmp_path, monkeypatch):
    # traces too big to read at once are streamed line by line: the same events, the same records
    import nanscope.logs.nanscope_trace as streamed
    from nanscope.loading import load

    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path, {"run_id": "x"})
    for i, (loss, *_rest) in enumerate(_least_squares(12)):
        writer.write({"step": i + 1, "loss": loss})
    writer.event("interrupted", signal="SIGTERM", step=12)
    writer.close()
    whole = load(path)
    monkeypatch.setattr(streamed, "STREAM_ABOVE_BYTES", 0)
    stream = load(path)
    assert len(stream) == len(whole) == 12
    assert stream.meta["events"] == whole.meta["events"] == [
        {"event": "interrupted", "signal": "SIGTERM", "step": 12}
    ]


def _reference_line(record):
    """The standard library's reading of a record, for comparing with the fast encoder."""
    import numpy as np

    def plain(value):
        if isinstance(value, float) and not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, np.generic):
            return plain(value.item())
        return value

    return {k: plain(v) for k, v in record.items() if v is not None}


@pytest.mark.parametrize(
    "record",
    [
        {"step": 3, "loss": 0.00001, "lr": 1e-3, "grad_norm": 12.5, "nf_grads": 0},
        {"step": 4, "loss": 2.5, "grad_norms": {"W1": 1.0, "b1": 0.25}, "events": ["loss_spike"]},
        {"step": 5, "loss": float("nan"), "grad_norm": float("inf"), "update_norm": None},
        {"step": 6, "loss": -float("inf"), "grad_norms": {"W1": float("nan")}},
        {"step": 7, "note": "nullable", "update_cos": None},
        {"step": 8, "loss": "np", "big": 2**70},
        {"step": 9, "grad_norms": {1: 2.0}},
    ],
)
def test_encoded_lines_parse_to_what_the_record_holds(record):
    line = encode_record(record)
    assert "\n" not in line
    parsed = json.loads(line)  # strict JSON: no NaN or Infinity tokens
    assert parsed == _reference_line(record)


def test_numpy_scalars_are_encoded_as_their_values():
    import numpy as np

    record = {"step": np.int64(2), "loss": np.float64(0.5), "nf_grads": np.int32(0),
              "flag": np.bool_(True), "update_cos": np.float32(float("nan"))}  # fmt: skip
    assert json.loads(encode_record(record)) == {
        "step": 2, "loss": 0.5, "nf_grads": 0, "flag": True, "update_cos": "nan"}  # fmt: skip
    # and they come back as the numbers they were
    back = decode_record(json.loads(encode_record(record)))
    assert back["loss"] == 0.5 and math.isnan(back["update_cos"])
