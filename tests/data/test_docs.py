"""Every check is documented like the rules: sections in the module, a page in docs/scan."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanscope.data.checks import CHECKS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "scan"
SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix")


@pytest.mark.parametrize("check", CHECKS, ids=lambda m: m.CODE)
def test_check_is_documented(check):
    doc = check.__doc__ or ""
    assert doc.startswith(f"{check.CODE} {check.NAME}:")
    for section in SECTIONS:
        assert f"\n{section}\n" in doc, (check.CODE, section)
    page = (DOCS / f"{check.CODE}.md").read_text()
    assert page.startswith(f"# {check.CODE} `{check.NAME}`")
    for section in SECTIONS:
        assert f"## {section}" in page
    assert check.FIX in page
    assert f"[{check.CODE}]({check.CODE}.md)" in (DOCS / "index.md").read_text()


def test_codes_are_unique_and_ordered():
    codes = [m.CODE for m in CHECKS]
    assert codes == sorted(set(codes))
