"""The numpy fault zoo: every case is a real fit with a known cause; the diagnosis must name it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import nanscope

pytestmark = pytest.mark.slow  # the zoo: every case a whole fit

_spec = importlib.util.spec_from_file_location(
    "_nanscope_zoo_loader", Path(__file__).with_name("_zoo.py")
)
assert _spec is not None and _spec.loader is not None
_zoo = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("_nanscope_zoo_loader", _zoo)
_spec.loader.exec_module(_zoo)

CASES = _zoo.load_cases(("numpy",))
BY_NAME = {case.name: case for case in CASES}

#: cases whose diagnosis the rules get wrong today: name -> why (none at the moment)
KNOWN_MISJUDGED: dict[str, str] = {}

#: a sample whose JSON and trace file are checked too, one per cause at most
SAMPLE = sorted({case.cause: case.name for case in CASES}.values())


def _param(case):  # type: ignore[no-untyped-def]
    marks = []
    if case.name in KNOWN_MISJUDGED:
        marks.append(pytest.mark.xfail(reason=KNOWN_MISJUDGED[case.name], strict=True))
    return pytest.param(case, id=case.name, marks=marks)


def test_zoo_is_complete() -> None:
    counts: dict[str, int] = {}
    for case in CASES:
        assert case.cause in nanscope.CAUSES, f"{case.name}: unknown cause {case.cause!r}"
        counts[case.cause] = counts.get(case.cause, 0) + 1
    assert len(CASES) >= 16
    for cause in (
        "step_size_too_large",
        "nonfinite_input",
        "update_sign_error",
        "extreme_batch",
        "log_of_zero",
        "exploding_gradients",
    ):
        assert counts.get(cause, 0) >= 2, f"the zoo needs two cases of {cause}: {counts}"
    assert counts.get("healthy", 0) >= 4, counts


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_case_diagnosis(case, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    outcome = _zoo.run_case(case, tmp_path / "run")
    diagnosis = outcome.diagnosis
    if case.cause == "healthy":
        assert not outcome.raised, f"a healthy fit was stopped: {diagnosis.message()}"
        assert diagnosis.verdict == "healthy", diagnosis.message()
    assert diagnosis.cause == case.cause, diagnosis.message()
    if case.cause != "healthy":
        assert diagnosis.verdict in ("nonfinite", "diverging", "suspect")
    decided = _zoo.margin(diagnosis.to_dict())
    assert decided >= _zoo.MARGIN, f"decided without margin ({decided:.2f}): {diagnosis.message()}"
    if diagnosis.verdict == "nonfinite":  # the confirming experiment, run or said why not
        data = diagnosis.to_dict()
        assert data.get("confirmation"), diagnosis.message()
        assert all({"change", "ran", "text"} <= set(c) for c in data["confirmation"])
    named = {row.get("dataset_row") for row in diagnosis.rows}
    for row in case.bad_rows:
        assert row in named, f"row {row} not named; rows: {diagnosis.rows}"


@pytest.mark.parametrize("name", SAMPLE)
def test_case_artifacts(name: str, tmp_path: Path) -> None:
    case = BY_NAME[name]
    run_dir = tmp_path / "run"
    outcome = _zoo.run_case(case, run_dir)
    data = outcome.diagnosis.to_dict()
    assert data["schema"] == "nanscope.diagnosis/1"
    assert data["cause"] == outcome.diagnosis.cause
    json.dumps(data, allow_nan=False)
    on_disk = json.loads((run_dir / "diagnosis.json").read_text())
    assert on_disk["schema"] == "nanscope.diagnosis/1"
    assert on_disk["verdict"] == data["verdict"]
    trace = nanscope.read_trace(run_dir / "trace.jsonl")
    assert len(trace.records) == len(outcome.monitor.trace.records)
    assert [r["step"] for r in trace.records] == [r["step"] for r in outcome.monitor.trace.records]


def test_cases_run_as_scripts_define_main() -> None:
    for case in CASES:
        text = case.path.read_text()
        assert 'if __name__ == "__main__":' in text and "nanscope.Monitor()" in text, case.name


def _nanscope_run(case, tmp_path: Path, monkeypatch) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    from nanscope.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NANSCOPE_DIR", str(tmp_path / "runs"))
    out = tmp_path / "diagnosis.json"
    code = main(["run", "--json", str(out), "--", "python", str(case.path)])
    return code, json.loads(out.read_text()) if out.exists() else {}


def test_nanscope_run_on_a_breaking_case(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    code, data = _nanscope_run(BY_NAME["step_size_linreg_money"], tmp_path, monkeypatch)
    assert code == 3
    assert data["cause"] == "step_size_too_large"


def test_nanscope_run_on_a_healthy_case(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    code, data = _nanscope_run(BY_NAME["healthy_noisy_sgd"], tmp_path, monkeypatch)
    assert code == 0
    assert data.get("verdict") == "healthy"


@pytest.mark.parametrize("name", ["step_size_momentum_prices", "sign_error_logreg_ascent"])
def test_trace_on_disk_rediagnoses_a_stopped_run(name: str, tmp_path: Path) -> None:
    outcome = _zoo.run_case(BY_NAME[name], tmp_path / "run")
    assert outcome.raised and outcome.diagnosis.verdict == "diverging"
    again = nanscope.diagnose(tmp_path / "run" / "trace.jsonl")
    assert again.verdict == "diverging"
    assert again.cause == outcome.diagnosis.cause
