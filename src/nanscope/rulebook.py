"""The one convention every rule follows, and the one generator of their docs pages.

nanscope has three families of rules; each has one explicit registry (a missing or broken rule file
fails at import), a folder with one file per rule, a fixture per rule and a folder of pages:

- **D** diagnosis rules: ``nanscope.diagnose.rules.RULES``, ``diagnose/rules/D001_<cause>.py``,
  recorded traces in ``tests/diagnose/fixtures/``, pages in ``docs/rules/``;
- **L** lint rules: ``nanscope.lint.registry.RULES``, ``lint/rules/L001_<name>.py``, fixtures
  ``tests/lint/fixtures/L001.py``, pages in ``docs/lint/``;
- **S** scan checks: ``nanscope.data.checks.CHECKS``, ``data/checks/S001_<name>.py``, fixtures
  ``tests/data/fixtures/S001.csv``, pages in ``docs/scan/``.

A rule's file is named by its code and its slug (the cause for D, the kebab name with ``_`` for L
and S), and opens with a docstring in one syntax::

    \"\"\"L001 log-of-probability: log of a probability that can be exactly 0.

    What it does
        Flags ...

    Why is this bad?
        ...
    \"\"\"

The first paragraph is ``CODE slug: summary``; each section is its heading alone on a line, then an
indented block of Markdown. The sections are fixed per family (:data:`SECTIONS`). The pages under
``docs/`` are rendered from those docstrings; ``python -m nanscope.rulebook`` rewrites them, and a
test fails when a committed page differs from what this module renders. An index page keeps its
hand-written prose; only the part between :data:`BEGIN` and :data:`END` is generated.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

__all__ = [
    "BEGIN",
    "END",
    "FAMILIES",
    "SECTIONS",
    "Family",
    "RuleDoc",
    "main",
    "parse_doc",
    "render_index",
    "render_rule",
    "write_docs",
]

_COMMON = ("What it does", "Why is this bad?", "Example")

#: the doc sections of each family, in the order the pages show them
SECTIONS: dict[str, tuple[str, ...]] = {
    "D": ("What it does", "Why is this bad?", "Fingerprint", "Evidence", "Action", "Example"),
    "L": (*_COMMON, "Use instead"),
    "S": (*_COMMON, "Use instead", "Fix"),
}

BEGIN = "<!-- generated from the rule docstrings by `python -m nanscope.rulebook`: edit those -->"
END = "<!-- end of generated part -->"


@dataclass(frozen=True)
class RuleDoc:
    """What the docs need of one rule, the same for every family."""

    code: str
    slug: str
    summary: str
    sections: dict[str, str]
    module: ModuleType
    #: sections added by the family after the docstring's (how to suppress, the report's line)
    footer: tuple[tuple[str, str], ...] = ()

    @property
    def file_stem(self) -> str:
        """The name the rule's file must have: ``D001_step_size_too_large``."""
        return f"{self.code}_{self.slug.replace('-', '_')}"


@dataclass(frozen=True)
class Family:
    """One family of rules: its code prefix, where its docs go and how to list its rules."""

    prefix: str
    title: str
    folder: str
    rules: Callable[[], list[RuleDoc]] = field(repr=False)

    @property
    def sections(self) -> tuple[str, ...]:
        return SECTIONS[self.prefix]


def parse_doc(doc: str | None) -> tuple[str, str, str, dict[str, str]]:
    """``(code, slug, summary, sections)`` of a rule docstring in the common syntax.

    Raises ``ValueError`` when the first line is not ``CODE slug: summary``.
    """
    lines = (doc or "").strip("\n").splitlines()
    first = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    head = " ".join(line.strip() for line in lines[:first])  # the summary may wrap
    ident, colon, summary = head.partition(": ")
    code, _, slug = ident.partition(" ")
    if not colon or not code or not slug or " " in slug:
        raise ValueError(f"a rule docstring opens with 'CODE slug: summary', not {head!r}")
    found: dict[str, list[str]] = {}
    current: str | None = None
    for line in lines[first:]:
        if line.strip() and not line[0].isspace():
            current = line.strip()
            found[current] = []
        elif current is not None:
            found[current].append(line)
    sections = {k: textwrap.dedent("\n".join(v)).strip() for k, v in found.items()}
    return code, slug, summary.strip(), sections


def _doc(module: ModuleType, footer: tuple[tuple[str, str], ...] = ()) -> RuleDoc:
    code, slug, summary, sections = parse_doc(module.__doc__)
    return RuleDoc(code, slug, summary, sections, module, footer)


def _diagnosis_rules() -> list[RuleDoc]:
    from nanscope.diagnose.rules import RULES

    return [_doc(module) for module in RULES]


def _lint_rules() -> list[RuleDoc]:
    from nanscope.lint.registry import RULES

    out = []
    for code, rule in RULES.items():
        suppress = f"`# nanscope: noqa: {code}` on the flagged line."
        out.append(_doc(sys.modules[rule.__module__], (("Suppress", suppress),)))
    return out


def _scan_checks() -> list[RuleDoc]:
    from nanscope.data.checks import CHECKS

    return [
        _doc(module, (("In the report", f"The finding's one-line `fix`: *{module.FIX}*."),))
        for module in CHECKS
    ]


FAMILIES: dict[str, Family] = {
    "D": Family("D", "Diagnosis rules", "docs/rules", _diagnosis_rules),
    "L": Family("L", "Lint rules", "docs/lint", _lint_rules),
    "S": Family("S", "Scan checks", "docs/scan", _scan_checks),
}


def _sentence(text: str) -> str:
    """The summary as a sentence; one opening with `code` keeps it as it is."""
    return text if text.startswith("`") else text[:1].upper() + text[1:]


def render_rule(rule: RuleDoc, family: Family) -> str:
    """The Markdown page of one rule."""
    out = [f"# {rule.code} `{rule.slug}`", "", _sentence(rule.summary), ""]
    for name in family.sections:
        out += [f"## {name}", "", rule.sections.get(name, ""), ""]
    for name, text in rule.footer:
        out += [f"## {name}", "", text, ""]
    return "\n".join(out).rstrip() + "\n"


def _table(rules: list[RuleDoc]) -> str:
    out = ["| code | name | what it finds |", "|---|---|---|"]
    for rule in rules:
        summary = _sentence(rule.summary).replace("|", "\\|")
        out.append(f"| [{rule.code}]({rule.code}.md) | `{rule.slug}` | {summary} |")
    return "\n".join(out)


def render_index(family: Family, current: str | None = None) -> str:
    """The index page: ``current``'s hand-written prose with the generated table put in."""
    block = f"{BEGIN}\n\n{_table(family.rules())}\n\n{END}"
    if current and BEGIN in current and END in current:
        before, _, rest = current.partition(BEGIN)
        _, _, after = rest.partition(END)
        return before + block + after
    return f"# {family.title}\n\n{block}\n"


def write_docs(root: Path, prefixes: str = "DLS") -> list[Path]:
    """Rewrite every rule page and index of the given families under ``root``; the paths."""
    written = []
    for prefix in prefixes:
        family = FAMILIES[prefix]
        folder = root / family.folder
        folder.mkdir(parents=True, exist_ok=True)
        for rule in family.rules():
            path = folder / f"{rule.code}.md"
            path.write_text(render_rule(rule, family), encoding="utf-8")
            written.append(path)
        index = folder / "index.md"
        current = index.read_text(encoding="utf-8") if index.exists() else None
        index.write_text(render_index(family, current), encoding="utf-8")
        written.append(index)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m nanscope.rulebook [ROOT]``: regenerate the docs of all three families."""
    args = sys.argv[1:] if argv is None else argv
    for path in write_docs(Path(args[0] if args else ".")):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
