"""Render the docs page of every diagnosis rule from its docstring.

    python -m nanscope.diagnose.docs docs/rules

Each rule's docstring carries the sections below; a test fails when one is missing or when the
pages in ``docs/rules/`` are stale.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import ModuleType

from nanscope.diagnose.rules import load_rules

__all__ = ["SECTIONS", "render_index", "render_rule", "sections", "write_docs"]

SECTIONS = ("What it does", "Why is this bad?", "Fingerprint", "Evidence", "Action", "Example")


def sections(module: ModuleType) -> dict[str, str]:
    """The docstring's sections: a heading line followed by an indented block."""
    doc = module.__doc__ or ""
    lines = doc.splitlines()[1:]
    found: dict[str, list[str]] = {}
    current: str | None = None
    for line in lines:
        if line.strip() in SECTIONS and not line.startswith(" "):
            current = line.strip()
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return {k: textwrap.dedent("\n".join(v)).strip() for k, v in found.items()}


def render_rule(module: ModuleType) -> str:
    parts = sections(module)
    title = (module.__doc__ or "").splitlines()[0].strip()
    out = [f"# {module.CODE} `{module.CAUSE}`", "", title, ""]
    for name in SECTIONS:
        out += [f"## {name}", "", parts.get(name, ""), ""]
    return "\n".join(out).rstrip() + "\n"


def render_index(modules: list[ModuleType]) -> str:
    out = [
        "# Diagnosis rules",
        "",
        "Each rule is a pure function from a trace (plus the probes' evidence) to a finding with a",
        "cause from the fixed vocabulary, a confidence, evidence with numbers and ordered actions.",
        "The engine ranks the findings into one cause with alternatives. A run with no finding of",
        "confidence 0.6 or more and nothing non-finite is `healthy`; a broken run no rule is at",
        "least 0.3 sure about is `unknown`, and its actions say what to record next.",
        "",
        "| code | cause | rule |",
        "|---|---|---|",
    ]
    for module in modules:
        out.append(f"| [{module.CODE}]({module.CODE}.md) | `{module.CAUSE}` | {module.TITLE} |")
    return "\n".join(out) + "\n"


def write_docs(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    modules = load_rules()
    written = []
    for module in modules:
        path = folder / f"{module.CODE}.md"
        path.write_text(render_rule(module))
        written.append(path)
    index = folder / "index.md"
    index.write_text(render_index(modules))
    written.append(index)
    return written


if __name__ == "__main__":
    for path in write_docs(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/rules")):
        print(path)
