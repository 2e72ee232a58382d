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
