"""Every diagnosis rule has its doc sections, a docs page in sync, and a zoo case for its cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanscope.diagnose.docs import SECTIONS, render_index, render_rule, sections
from nanscope.diagnose.rules import RULE_MODULES, load_rules

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules"
ZOO = Path(__file__).resolve().parents[1] / "zoo"


def test_every_registered_rule_loads():
    assert [m.CODE for m in load_rules()] == sorted(RULE_MODULES)


@pytest.mark.parametrize("module", load_rules(), ids=lambda m: m.CODE)
def test_rule_has_all_doc_sections(module):
    found = sections(module)
    missing = [name for name in SECTIONS if not found.get(name)]
    assert not missing, f"{module.CODE} lacks {missing}"


@pytest.mark.parametrize("module", load_rules(), ids=lambda m: m.CODE)
def test_rule_docs_page_is_in_sync(module):
    page = DOCS / f"{module.CODE}.md"
    assert page.exists(), "run: python -m nanscope.diagnose.docs docs/rules"
    assert page.read_text() == render_rule(module)


def test_index_in_sync():
    assert (DOCS / "index.md").read_text() == render_index(load_rules())


@pytest.mark.parametrize("module", load_rules(), ids=lambda m: m.CODE)
def test_each_cause_has_zoo_cases(module):
    texts = [p.read_text() for p in ZOO.rglob("*.py")]
    hits = sum(f'CAUSE = "{module.CAUSE}"' in t for t in texts)
    assert hits >= 2, f"{module.CAUSE} needs at least two zoo cases"
