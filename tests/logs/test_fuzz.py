"""Bad input never gives a traceback: a Trace or a one-line TraceError naming the file."""

from __future__ import annotations

import json
import math
import tracemalloc
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nanscope.logs._common as common
import nanscope.logs.nanscope_trace as nanscope_trace
from nanscope.errors import TraceError
from nanscope.logs import FORMATS, _load, load_trace, sniff
from nanscope.trace import NUMERIC_KEYS, Trace

FIXTURES = Path(__file__).parent / "fixtures"
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SAMPLES: dict[str, bytes] = {
    "train.log": (FIXTURES / "seed_000_epochs.txt").read_bytes()
    + b"step 1 | loss 0.5 | lr 1e-3\r12/100 [00:01<00:09, loss=0.42]\n"
    b"Gradient overflow.  Skipping step\nTraceback (most recent call last):\nValueError: x\n",
    "metrics.csv": b"epoch,step,train_loss_step,val_loss\n0,1,0.5,\n0,2,nan,\n0,2,,0.7\n1,3,x,\n",
    "log.jsonl": b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": NaN, "lr": "1e-3"}\n'
    b'{"iter": 3, "train/loss": "Infinity", "grad_norm": null}\n',
    "trainer_state.json": json.dumps(
        {
            "global_step": 2,
            "log_history": [
                {"loss": 0.5, "grad_norm": 1.0, "learning_rate": 1e-3, "step": 1, "epoch": 0.5},
                {"loss": 0.0, "grad_norm": math.nan, "learning_rate": 1e-3, "step": 2},
                {"eval_loss": math.inf, "step": 2},
            ],
        },
        indent=2,
        sort_keys=True,
    ).encode(),
    "trace.jsonl": b'{"schema": "nanscope.trace/1"}\n{"step": 1, "loss": 0.5}\n'
    b'{"step": 2, "loss": "nan"}\n',
}
NAMES = [*SAMPLES, "events.out.tfevents.1.host", "noext"]


def _check(path: Path) -> Trace | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trace = _load(path)
        except TraceError as exc:
            message = str(exc)
            assert "\n" not in message
            assert str(path) in message or path.name in message
            return None
    assert trace.meta["format"] in FORMATS
    assert trace.meta["granularity"] in ("update", "epoch")
    assert isinstance(trace.meta["lines"], int)
    for record in trace:
        assert isinstance(record["step"], int) and not isinstance(record["step"], bool)
        for key in NUMERIC_KEYS & record.keys():
            assert isinstance(record[key], float)
    trace.column("loss")
    trace.nonfinite("loss")
    return trace


@pytest.mark.slow
@SETTINGS
@given(data=st.binary(max_size=2000), name=st.sampled_from(NAMES))
def test_random_bytes(tmp_path: Path, data: bytes, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    _check(path)


@SETTINGS
@given(
    name=st.sampled_from(list(SAMPLES)),
    cut=st.floats(0, 1),
    junk=st.binary(max_size=40),
    where=st.floats(0, 1),
    encoding=st.sampled_from(["utf-8", "latin-1", "utf-16", "cp1252"]),
)
def test_mutated_samples(
    tmp_path: Path, name: str, cut: float, junk: bytes, where: float, encoding: str
) -> None:
    data = SAMPLES[name]
    data = data[: max(1, int(len(data) * cut))] if cut < 0.95 else data
    at = int(len(data) * where)
    mixed = "é µ ü loss: nän".encode(encoding, errors="replace")
    path = tmp_path / name
    path.write_bytes(data[:at] + junk + mixed + data[at:])
    _check(path)


@SETTINGS
@given(
    cells=st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True).map(repr),
            st.text(alphabet="abc nNaIi,\"'-+.e0123456789", max_size=8),
            st.just(""),
        ),
        min_size=3,
        max_size=30,
    )
)
def test_csv_column_sometimes_text(tmp_path: Path, cells: list[str]) -> None:
    path = tmp_path / "m.csv"
    path.write_text("step,loss\n" + "".join(f"{i},{c}\n" for i, c in enumerate(cells, 1)))
    trace = _check(path)
    if trace is not None:
        assert all(1 <= r["step"] <= len(cells) + 1 for r in trace)


@SETTINGS
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=20))
def test_jsonl_roundtrip_values(tmp_path: Path, values: list[float]) -> None:
    path = tmp_path / "v.jsonl"
    path.write_text(
        "".join(json.dumps({"step": i, "train_loss": v}) + "\n" for i, v in enumerate(values, 1))
    )
    trace = load_trace(path)
    got = trace.column("loss")
    for a, b in zip(got, values):
        assert (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("name", ["train.log", "metrics.csv", "log.jsonl", "trace.jsonl"])
def test_overlong_line_is_skipped_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(common, "MAX_LINE_BYTES", 64 * 1024)
    monkeypatch.setattr(nanscope_trace, "STREAM_ABOVE_BYTES", 1024 * 1024)
    path = tmp_path / name
    sample = SAMPLES[name]
    first, _, rest = sample.partition(b"\n")
    huge = b"9" * (4 * 1024 * 1024)  # 64 times the cap, standing in for a 2 GB line
    path.write_bytes(first + b"\n" + huge + b"\n" + rest)
    tracemalloc.start()
    try:
        trace = _check(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert trace is not None and len(trace) >= 1
    assert trace.meta.get("skipped_long_lines") == 1
    assert peak < 2 * 1024 * 1024


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"\x00\x01\x02\x03" * 100])
def test_empty_blank_binary(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=r"x\.log"):
        load_trace(path)


def test_missing_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.log")
    path = tmp_path / "notes.txt"
    path.write_text("dear diary,\ntoday the model was fine.\n")
    with pytest.raises(TraceError, match="known formats: nanscope, jsonl, csv") as info:
        sniff(path)
    assert "notes.txt" in str(info.value)
    with pytest.raises(TraceError, match="known formats"):
        load_trace(tmp_path)  # an empty directory


WORDS = st.sampled_from(
    [
        "Epoch", "epoch", "step", "iter", "loss", "Loss", "val_loss", "Val Loss", "lr", "grad_norm",
        ":", "=", " ", " | ", "\r", "\x08", "\n", "[", "]", "/", "nan", "-inf", "Infinity", "1e-3",
        "0.5", "12", "100/100", "[00:01<00:02, ", "tensor(", "Traceback (most recent call last):",
        "Gradient overflow", "CUDA out of memory", "{'loss': ", "é", "\ufeff",
    ]
)  # fmt: skip


@SETTINGS
@given(tokens=st.lists(WORDS, min_size=1, max_size=80))
def test_text_made_of_log_tokens(tmp_path: Path, tokens: list[str]) -> None:
    path = tmp_path / "train.log"
    path.write_text("".join(tokens), encoding="utf-8")
    trace = _check(path)
    if trace is not None and trace.meta["format"] == "text":
        steps = [r["step"] for r in trace]
        assert len(steps) == len(trace)
