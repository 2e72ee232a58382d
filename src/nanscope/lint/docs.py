"""Render the lint rules' docstrings as the pages under ``docs/lint/``.

``python -m nanscope.lint.docs docs/lint`` rewrites the pages; a test checks that the committed
pages are exactly what this module renders, so the docs never drift from the rules.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from nanscope.lint._types import Rule
from nanscope.lint.registry import RULES, SYNTAX_ERROR_CODE

__all__ = ["REQUIRED_SECTIONS", "main", "render_index", "render_rule", "sections", "write_docs"]

REQUIRED_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead")


def sections(rule: type[Rule]) -> tuple[str, dict[str, str]]:
    """The summary line and the ``## `` sections of a rule's docstring."""
    doc = inspect.cleandoc(rule.__doc__ or "")
    summary, _, rest = doc.partition("\n")
    found: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []
    for line in rest.splitlines():
        if line.startswith("## "):
            if current is not None:
                found[current] = "\n".join(lines).strip()
            current, lines = line[3:].strip(), []
        elif current is not None:
            lines.append(line)
    if current is not None:
        found[current] = "\n".join(lines).strip()
    return summary.strip(), found


def render_rule(rule: type[Rule]) -> str:
    summary, found = sections(rule)
    parts = [f"# {rule.code} `{rule.name}`", "", summary, ""]
    for title in REQUIRED_SECTIONS:
        parts += [f"## {title}", "", found.get(title, ""), ""]
    parts += ["## Suppress", "", f"`# nanscope: noqa: {rule.code}` on the flagged line.", ""]
    return "\n".join(parts)


def render_index() -> str:
    lines = [
        "# nanscope lint rules",
        "",
        "`nanscope lint PATH... [--select CODES] [--ignore CODES] [--json PATH]` checks",
        "training code for the numerical hazards that make a loss go NaN. Codes are stable;",
        "prefixes work in `--select` / `--ignore` (`--select L00`). Exit code 0: clean,",
        "1: findings, 2: usage error.",
        "Suppress one line with `# nanscope: noqa` or `# nanscope: noqa: L001,L003`.",
        "",
        "| code | name | what it flags |",
        "|---|---|---|",
        f"| {SYNTAX_ERROR_CODE} | `syntax-error` | a file that does not parse (reported, the other "
        "files are still linted) |",
    ]
    for code, rule in RULES.items():
        summary, _ = sections(rule)
        lines.append(f"| [{code}]({code}.md) | `{rule.name}` | {summary} |")
    lines.append("")
    return "\n".join(lines)


def write_docs(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for code, rule in RULES.items():
        path = directory / f"{code}.md"
        path.write_text(render_rule(rule), encoding="utf-8")
        written.append(path)
    index = directory / "index.md"
    index.write_text(render_index(), encoding="utf-8")
    written.append(index)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0] if args else "docs/lint")
    for path in write_docs(target):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
