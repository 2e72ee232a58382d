"""The fault zoo, linted: buggy cases are flagged by the rule for their cause, healthy ones not.

Skips when the zoo (``tests/zoo/numpy/*.py``, ``tests/zoo/torch/*.py``) is not there yet.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nanscope.lint import lint_file

ZOO = Path(__file__).resolve().parents[1] / "zoo"
CASES = sorted([*ZOO.glob("numpy/*.py"), *ZOO.glob("torch/*.py")]) if ZOO.is_dir() else []
#: the zoo's own test modules (``test_torch_zoo.py``) sit next to the cases and are no case
CASES = [p for p in CASES if not p.name.startswith(("_", "test_"))]

#: cause -> the lint codes any one of which must flag a case with that cause
EXPECTED: dict[str, set[str]] = {
    "update_sign_error": {"L005"},
    "log_of_zero": {"L001", "L002"},
    "zero_division": {"L003", "L004"},
}


def constant(path: Path, name: str) -> object:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
            and isinstance(node.value, ast.Constant)
        ):
            return node.value.value
    return None


def cause_of(path: Path) -> str | None:
    cause = constant(path, "CAUSE")
    return cause if isinstance(cause, str) else None


def test_zoo_present_or_skipped() -> None:
    if not CASES:
        pytest.skip("no fault zoo at tests/zoo/{numpy,torch}/*.py yet")
    assert all(cause_of(p) is not None for p in CASES), "every zoo case declares CAUSE"


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_zoo_case_lint(path: Path) -> None:
    cause = cause_of(path)
    findings = lint_file(path)
    codes = {f.code for f in findings}
    if cause == "healthy":
        assert findings == [], "healthy case flagged:\n" + "\n".join(f.format() for f in findings)
    elif constant(path, "LINT") is False:
        # the case says why: the zero is in the data, so no source-level rule can see it
        pytest.skip(f"{path.name}: its fault is not visible in the source")
    elif cause in EXPECTED:
        assert codes & EXPECTED[cause], (
            f"{cause} case not flagged by {sorted(EXPECTED[cause])}; got {sorted(codes)}"
        )
    else:
        pytest.skip(f"cause {cause!r} has no source-level lint expectation")
