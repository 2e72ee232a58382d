"""Every D, L and S rule follows the one convention of :mod:`nanscope.rulebook`: a file named by its
code and slug, in its family's one explicit registry, a docstring with the family's sections, and a
docs page equal to the one the docstrings render."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nanscope
from nanscope.diagnose.rules import RULES as D_RULES
from nanscope.rulebook import (
    BEGIN,
    END,
    FAMILIES,
    SECTIONS,
    Family,
    RuleDoc,
    parse_doc,
    render_index,
    render_rule,
)

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "nanscope"
ZOO = ROOT / "tests" / "zoo"
#: where each family's rule files live, and the module that registers them
FOLDERS = {"D": "diagnose/rules", "L": "lint/rules", "S": "data/checks"}
REGISTRY = {
    "D": "nanscope.diagnose.rules",
    "L": "nanscope.lint.registry",
    "S": "nanscope.data.checks",
}

#: the cause vocabulary of DESIGN.md, a contract: tests and other programs match on these strings
DESIGN_CAUSES = (
    "step_size_too_large",
    "nonfinite_input",
    "update_sign_error",
    "extreme_batch",
    "log_of_zero",
    "zero_division",
    "fp16_overflow",
    "exploding_gradients",
    "bad_initialization",
    "healthy",
    "unknown",
)

ALL: list[tuple[Family, RuleDoc]] = [(f, r) for f in FAMILIES.values() for r in f.rules()]
IDS = [rule.code for _, rule in ALL]


@pytest.mark.parametrize(("family", "rule"), ALL, ids=IDS)
def test_rule_file_is_named_by_code_and_slug(family: Family, rule: RuleDoc) -> None:
    assert re.fullmatch(family.prefix + r"\d{3}", rule.code)
    assert rule.module.__name__.rpartition(".")[2] == rule.file_stem
    assert Path(rule.module.__file__ or "").parent == SRC / FOLDERS[family.prefix]
    code = getattr(rule.module, "CODE", None)
    if family.prefix == "L":
        from nanscope.lint.registry import RULES

        code, name = RULES[rule.code].code, RULES[rule.code].name
        assert RULES[rule.code].fix and RULES[rule.code].node_types
    elif family.prefix == "S":
        name = rule.module.NAME
        assert rule.module.FIX and callable(rule.module.probes) and callable(rule.module.run)
    else:
        name = rule.module.CAUSE
    assert (code, name) == (rule.code, rule.slug), "the docstring's first line names another rule"


@pytest.mark.parametrize(("family", "rule"), ALL, ids=IDS)
def test_rule_has_exactly_its_family_sections(family: Family, rule: RuleDoc) -> None:
    assert rule.summary
    assert tuple(rule.sections) == SECTIONS[family.prefix], "sections missing, extra or reordered"
    empty = [name for name, text in rule.sections.items() if not text]
    assert not empty, f"{rule.code}: empty sections {empty}"
    if family.prefix == "L":
        assert "```python" in rule.sections["Example"]
        assert "```python" in rule.sections["Use instead"]


@pytest.mark.parametrize(("family", "rule"), ALL, ids=IDS)
def test_rule_page_is_generated(family: Family, rule: RuleDoc) -> None:
    page = ROOT / family.folder / f"{rule.code}.md"
    assert page.is_file(), "run: python -m nanscope.rulebook"
    assert page.read_text() == render_rule(rule, family), (
        f"{page} is stale: python -m nanscope.rulebook"
    )


@pytest.mark.parametrize("family", FAMILIES.values(), ids=list(FAMILIES))
def test_index_page_is_generated(family: Family) -> None:
    index = (ROOT / family.folder / "index.md").read_text()
    assert index == render_index(family, index), "stale index: python -m nanscope.rulebook"
    assert "python -m nanscope.rulebook" in index, "the index says how to regenerate the pages"
    for rule in family.rules():
        assert f"[{rule.code}]({rule.code}.md)" in index


@pytest.mark.parametrize("family", FAMILIES.values(), ids=list(FAMILIES))
def test_every_rule_file_is_registered_once_in_code_order(family: Family) -> None:
    on_disk = sorted(p.stem for p in (SRC / FOLDERS[family.prefix]).glob(f"{family.prefix}*.py"))
    registered = [rule.file_stem for rule in family.rules()]
    assert registered == on_disk, "a rule file is not in its registry, or the order is not by code"
    assert len({r.code for r in family.rules()}) == len(registered)


@pytest.mark.parametrize("family", list(FAMILIES), ids=list(FAMILIES))
@pytest.mark.parametrize("damage", ["missing", "broken"])
def test_a_missing_or_broken_rule_file_fails_at_import(
    family: str, damage: str, tmp_path: Path
) -> None:
    copy = tmp_path / "nanscope"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    victim = sorted((copy / FOLDERS[family]).glob(f"{family}0*.py"))[1]
    if damage == "missing":
        victim.unlink()
    else:
        victim.write_text(victim.read_text() + "\ndef (:\n")
    proc = subprocess.run(
        [sys.executable, "-c", f"import {REGISTRY[family]}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert proc.returncode != 0, f"the registry imported without {victim.name}"
    assert victim.stem in proc.stderr, proc.stderr[-2000:]


def test_cause_vocabulary_is_the_design_contract() -> None:
    assert nanscope.CAUSES == DESIGN_CAUSES


@pytest.mark.parametrize("module", D_RULES, ids=lambda m: m.CODE)
def test_every_diagnosis_rule_cause_is_in_the_vocabulary(module) -> None:
    assert module.CAUSE in DESIGN_CAUSES and module.CAUSE not in ("healthy", "unknown")
    assert callable(module.check) and module.TITLE


def test_every_failure_cause_has_a_rule() -> None:
    # a cause may have more than one rule (one per mechanism: D001 and D011 both find a step
    # too large, from a long climb and from a short run), each in its own file
    causes = {m.CAUSE for m in D_RULES}
    assert sorted(causes) == sorted(c for c in DESIGN_CAUSES if c not in ("healthy", "unknown"))


@pytest.mark.parametrize("module", D_RULES, ids=lambda m: m.CODE)
def test_each_cause_has_zoo_cases(module) -> None:
    texts = [p.read_text() for p in ZOO.rglob("*.py")]
    hits = sum(f'CAUSE = "{module.CAUSE}"' in t for t in texts)
    assert hits >= 2, f"{module.CAUSE} needs at least two zoo cases"


def test_a_docstring_without_code_and_slug_is_refused() -> None:
    with pytest.raises(ValueError, match="CODE slug: summary"):
        parse_doc("Log of a probability.\n\nWhat it does\n    Flags it.\n")
    code, slug, summary, sections = parse_doc(
        "L042 some-rule: a summary that\nwraps.\n\nWhat it does\n    Flags\n      this.\n"
    )
    assert (code, slug, summary) == ("L042", "some-rule", "a summary that wraps.")
    assert sections == {"What it does": "Flags\n  this."}


def test_an_index_keeps_its_prose_and_regenerates_the_table() -> None:
    family = FAMILIES["S"]
    page = f"# Intro\n\nprose\n\n{BEGIN}\nstale table\n{END}\n\n## More prose\n"
    out = render_index(family, page)
    assert out.startswith("# Intro\n\nprose\n\n") and out.endswith(f"{END}\n\n## More prose\n")
    assert "stale table" not in out and "[S001](S001.md)" in out
    assert render_index(family, out) == out
