"""The typed vocabularies: verdicts and alarm kinds are enums whose members are the plain strings.

A diagnosis made with ``Verdict`` members writes the same JSON as one made with strings; the rank
and the "is it a failure" answer come from one table; every alarm kind the code raises is an
``AlarmKind``; the verdicts of runs ``nanscope run`` could not watch to their end are the engine's.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from nanscope.detectors import AlarmKind
from nanscope.diagnose.diagnosis import VERDICT_RANK, VERDICTS, Diagnosis, Evidence
from nanscope.diagnose.engine import (
    diagnose,
    note_crash,
    note_interruption,
    saw_no_update,
    unwatched,
)
from nanscope.diagnose.verdict import (
    UNRANKED,
    Verdict,
    is_failure,
    is_inconclusive,
    rank_of,
)
from nanscope.outcome import KINDS, OutcomeKind, judge
from nanscope.trace import Trace

SRC = Path(__file__).resolve().parents[2] / "src" / "nanscope"


@pytest.mark.parametrize("vocabulary", [Verdict, AlarmKind, OutcomeKind])
def test_a_member_is_its_plain_string_everywhere(vocabulary: type[Verdict]) -> None:
    for member in vocabulary:
        assert member == member.value and hash(member) == hash(member.value)
        assert str(member) == f"{member}" == f"{member:s}" == member.value
        assert json.dumps({"kind": member}) == json.dumps({"kind": member.value})
        assert {member.value: 1}[member] == 1


def test_a_verdict_is_its_plain_string_in_a_diagnosis() -> None:
    assert tuple(v.value for v in Verdict) == VERDICTS
    typed = Diagnosis(verdict=Verdict.SUSPECT, cause="unknown", confidence=0.25, step=3)
    plain = Diagnosis(verdict="suspect", cause="unknown", confidence=0.25, step=3)
    assert typed.to_json() == plain.to_json()
    assert type(typed.to_dict()["verdict"]) is str
    assert typed.headline() == plain.headline() == "suspect: unknown at update 3 (confidence 0.25)"


def test_one_table_ranks_verdicts_and_says_which_are_failures() -> None:
    assert {v.value: v.rank for v in Verdict} == VERDICT_RANK
    order = sorted(Verdict, key=lambda v: v.rank)
    assert [v.value for v in order] == [
        "nonfinite", "diverging", "crashed", "suspect", "interrupted", "healthy", "unobserved",
    ]  # fmt: skip
    assert {v for v in Verdict if v.is_failure} == {"nonfinite", "diverging", "suspect"}
    assert {v for v in Verdict if v.is_inconclusive} == {"unobserved", "interrupted", "crashed"}
    assert not Verdict.HEALTHY.is_failure and not Verdict.HEALTHY.is_inconclusive


@pytest.mark.parametrize("value", ["made-up", "", None, ["list"]])
def test_a_value_that_names_no_verdict_is_a_failure_ranked_last(value: object) -> None:
    assert is_failure(value) and not is_inconclusive(value)
    assert rank_of(value) == UNRANKED > max(v.rank for v in Verdict)
    assert is_failure("diverging") and not is_failure("crashed") and is_inconclusive("crashed")


def test_the_outcome_of_a_loss_curve_is_one_of_its_kinds() -> None:
    assert tuple(k.value for k in OutcomeKind) == KINDS
    assert judge([1.0, 0.5, 0.25]).kind is OutcomeKind.OK
    assert judge([1.0, 1e3, 1e6]).kind == "blown"
    assert judge([]).kind is OutcomeKind.EMPTY


def _alarm_kinds_raised() -> set[str]:
    """The first argument of every ``Alarm(...)`` in the package that names its kind outright."""
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Alarm"):
                continue
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
            elif (isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name)
                  and first.value.id == "AlarmKind"):  # fmt: skip
                found.add(AlarmKind[first.attr].value)
    return found


def _distributed_kinds() -> tuple[str, ...]:
    """``nanscope.torch.distributed.KINDS``, read without importing torch."""
    tree = ast.parse((SRC / "torch" / "distributed.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "KINDS":
            assert node.value is not None
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("distributed.py defines no KINDS")


def test_every_alarm_kind_the_code_raises_is_in_the_vocabulary() -> None:
    raised = _alarm_kinds_raised()
    kinds = {k.value for k in AlarmKind}
    assert raised <= kinds, raised - kinds
    assert {"nonfinite", "diverging", "ascending", "spike", "rank_failure"} == kinds
    assert set(_distributed_kinds()) - {""} <= kinds


def test_a_run_stopped_from_outside_before_any_update_is_interrupted_by_the_engine() -> None:
    diagnosis = unwatched("x.py created a Monitor but it saw no update; nothing was watched")
    assert diagnosis.verdict == Verdict.UNOBSERVED and diagnosis.cause == "unknown"
    note_interruption(diagnosis, "SIGINT", None)
    assert diagnosis.verdict == Verdict.INTERRUPTED and diagnosis.step is None
    assert diagnosis.evidence[0].text == (
        "the run was interrupted (SIGINT) before any update; no failure was seen up to there"
    )
    assert diagnosis.to_dict()["interrupted"] == {"signal": "SIGINT", "step": None}


def test_a_monitor_that_saw_no_update_is_never_healthy() -> None:
    healthy = Diagnosis(verdict=Verdict.HEALTHY, cause="healthy", confidence=1.0)
    judged = saw_no_update(healthy, "t.py created a Monitor but it saw no update")
    assert judged.verdict == "unobserved" and judged.cause == "unknown"
    assert judged.evidence[0].text == "t.py created a Monitor but it saw no update"
    crashed = Diagnosis(verdict=Verdict.CRASHED, cause="unknown", confidence=0.0)
    assert saw_no_update(crashed, "t.py saw nothing") is crashed


def test_a_failure_found_before_an_interruption_or_a_crash_stands() -> None:
    failed = Diagnosis(verdict="nonfinite", cause="zero_division", confidence=0.9, step=7,
                       evidence=[Evidence("D007", "a division by zero")])  # fmt: skip
    note_interruption(failed, "SIGTERM", 9)
    crash = {"type": "ValueError", "message": "bad", "file": "train.py", "line": 4}
    note_crash(failed, crash, 9)
    assert failed.verdict == "nonfinite" and failed.cause == "zero_division"
    assert failed.extra["interrupted"] == {"signal": "SIGTERM", "step": 9}
    assert failed.extra["crashed"] == {**crash, "step": 9}
    assert failed.evidence[-1].text.startswith("the script ended with its own exception after")


@pytest.mark.parametrize(
    ("flags", "starts"),
    [
        ({"refused": True}, "Fix the command line"),
        ({"program": True}, "Run the Python training script itself"),
        ({"crashed": True}, "The script raised before its first update"),
        ({}, "Check that the training loop ran"),
    ],
)
def test_a_run_nanscope_could_not_watch_gets_the_action_for_why(
    flags: dict[str, bool], starts: str
) -> None:
    diagnosis = unwatched("nothing ran", **flags)
    assert diagnosis.verdict == "unobserved" and diagnosis.evidence[0].text == "nothing ran"
    assert diagnosis.actions[0].startswith(starts)
    assert diagnosis.to_dict()["verdict"] == diagnose(Trace()).to_dict()["verdict"]
