"""Every diagnosis rule has a fixture: a small trace recorded by nanscope from a real fit that
fails that way (``fixtures/record.py``), with the cause and the least confidence the engine must
give it, and the trace of the same fit with the rule's fix applied, which must come out healthy.
The engine is replayed on the recorded traces and the probes' recorded evidence."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from nanscope.diagnose import diagnose
from nanscope.diagnose.rules import RULES
from nanscope.trace import read_trace

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"
#: a fixture is a few dozen updates, not a zoo run
MAX_RECORDS = 80


def _load_recorder() -> ModuleType:
    name = "_nanscope_rule_fixtures_record"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES_DIR / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


record = _load_recorder()
FIXTURES = list(record.FIXTURES.values())
IDS = [fx.code for fx in FIXTURES]


def test_every_rule_has_one_fixture_for_its_cause() -> None:
    assert {fx.code: fx.cause for fx in FIXTURES} == {m.CODE: m.CAUSE for m in RULES}
    on_disk = sorted(p.name for p in FIXTURES_DIR.glob("D*.jsonl"))
    expected = [fx.trace(fixed=fixed).name for fx in FIXTURES for fixed in (False, True)]
    assert on_disk == sorted(expected), "a trace without a fixture, or a fixture without a trace"


@pytest.mark.parametrize("fixed", [False, True], ids=["fails", "fixed"])
@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_fixture_is_a_small_trace_nanscope_recorded(fx, fixed: bool) -> None:
    trace = read_trace(fx.trace(fixed=fixed))
    assert trace.meta.get("schema") == "nanscope.trace/1"
    assert trace.meta.get("source") == "monitor" and trace.meta.get("fixture") == fx.code
    assert trace.meta.get("fixed") is fixed
    assert trace.meta.get("run_id"), "written by a Monitor, which names every run"
    assert 1 <= len(trace) <= MAX_RECORDS


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_engine_finds_the_fixture_cause(fx) -> None:
    evidence = json.loads(fx.evidence().read_text())
    diagnosis = diagnose(read_trace(fx.trace()), evidence=evidence)
    summary = f"{fx.code}: {diagnosis.cause} {diagnosis.confidence:.2f} ({diagnosis.verdict})"
    assert diagnosis.cause == fx.cause, summary
    assert diagnosis.confidence >= fx.min_confidence, summary
    assert any(item.rule == fx.code for item in diagnosis.evidence), "another rule won"
    assert diagnosis.verdict in ("nonfinite", "diverging", "suspect")


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_the_fixed_fit_is_healthy(fx) -> None:
    """The rule is built on the mechanism: the same fit with the fix applied does not trip it."""
    evidence = json.loads(fx.evidence(fixed=True).read_text())
    diagnosis = diagnose(read_trace(fx.trace(fixed=True)), evidence=evidence)
    assert (diagnosis.verdict, diagnosis.cause) == ("healthy", "healthy"), diagnosis.cause
    assert not any(
        a["cause"] == fx.cause and a["confidence"] >= fx.min_confidence
        for a in diagnosis.alternatives
    )


#: fixtures whose fit is chaotic, and how many of their first updates hold to 1e-5 on any CPU:
#: D006's tanh RNN at recurrent gain 3 multiplies a rounding difference (OpenBLAS picks its
#: kernels per CPU) by ~1e4 over one 70-step sequence, so its later losses are machine-specific
CHAOTIC = {"D006": 2}


@pytest.mark.parametrize("fx", [fx for fx in FIXTURES if not fx.uses_torch],
                         ids=[fx.code for fx in FIXTURES if not fx.uses_torch])  # fmt: skip
def test_recording_again_gives_the_committed_fixture(fx, tmp_path: Path) -> None:
    """The script still produces what is committed (the numpy fits are deterministic and fast)."""
    cause, confidence = record.record(fx, tmp_path)
    assert cause == fx.cause and confidence >= fx.min_confidence
    again, committed = read_trace(fx.trace(tmp_path)), read_trace(fx.trace())
    assert len(again) == len(committed)
    # the same fit up to the last bits a different BLAS may round differently; a chaotic fit
    # amplifies those bits, so only its first updates can be compared across machines
    upto = CHAOTIC.get(fx.code, len(committed))
    assert np.allclose(
        again.column("loss")[:upto], committed.column("loss")[:upto], rtol=1e-5, equal_nan=True
    )
    assert (
        json.loads(fx.evidence(tmp_path).read_text()).keys()
        == json.loads(fx.evidence().read_text()).keys()
    )
