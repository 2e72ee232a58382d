"""The output formats of ``nanscope lint``, named as ruff names them.

- ``text``: ``path:line:col: L### [*] message`` and the fix on an indented second line;
- ``concise``: the first line only;
- ``grouped``: the findings under their file's name;
- ``json``: a list of finding objects;
- ``github``: GitHub Actions ``::error`` workflow commands (annotations on the pull request);
- ``sarif``: SARIF 2.1.0, for code-scanning dashboards.

``[*]`` marks a finding ``--fix`` can fix.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

from nanscope.lint._types import LintFinding
from nanscope.lint.registry import RULES

__all__ = ["FORMATS", "render", "statistics"]

FORMATS = ("text", "concise", "grouped", "json", "github", "sarif")
_INDENT = "    "


def _fix_line(finding: LintFinding) -> str:
    return f"{_INDENT}fix: {finding.fix}"


def _text(findings: Sequence[LintFinding]) -> str:
    out: list[str] = []
    for f in findings:
        out.append(f.format())
        if f.fix:
            out.append(_fix_line(f))
    return "\n".join(out)


def _grouped(findings: Sequence[LintFinding]) -> str:
    by_path: dict[str, list[LintFinding]] = {}
    for f in findings:
        by_path.setdefault(f.path, []).append(f)
    out: list[str] = []
    for path, group in by_path.items():
        out.append(f"{path}:")
        for f in sorted(group, key=lambda f: (f.line, f.col)):
            mark = "[*] " if f.fixable else ""
            out.append(f"  {f.line}:{f.col} {f.code} {mark}{f.message}")
            if f.fix:
                out.append(f"  {_INDENT}fix: {f.fix}")
        out.append("")
    return "\n".join(out).rstrip("\n")


def _json_payload(findings: Sequence[LintFinding]) -> list[dict[str, Any]]:
    return [f.to_dict() for f in findings]


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _github(findings: Sequence[LintFinding]) -> str:
    out: list[str] = []
    for f in findings:
        props = [
            f"title={_escape_property(f'nanscope ({f.code})')}",
            f"file={_escape_property(f.path)}",
            f"line={f.line}",
            f"col={f.col}",
        ]
        if f.end_line is not None and f.end_col is not None:
            props += [f"endLine={f.end_line}", f"endColumn={f.end_col}"]
        text = f"{f.path}:{f.line}:{f.col}: {f.code} {f.message} (fix: {f.fix})"
        out.append(f"::error {','.join(props)}::{_escape_data(text)}")
    return "\n".join(out)


def _sarif(findings: Sequence[LintFinding]) -> str:
    from nanscope._version import __version__

    codes = sorted({f.code for f in findings} | set(RULES))
    rules: list[dict[str, Any]] = []
    for code in codes:
        rule = RULES.get(code)
        name = rule.name if rule is not None else "syntax-error"
        summary = (rule.__doc__ or "").strip().splitlines()[0] if rule else "file does not parse"
        rules.append(
            {
                "id": code,
                "name": name,
                "shortDescription": {"text": summary},
                "help": {"text": rule.fix if rule is not None else "fix the syntax error"},
                "properties": {"tags": ["numerical-stability"]},
            }
        )
    index = {code: i for i, code in enumerate(codes)}
    results: list[dict[str, Any]] = []
    for f in findings:
        region: dict[str, int] = {"startLine": f.line, "startColumn": f.col}
        if f.end_line is not None and f.end_col is not None:
            region.update(endLine=f.end_line, endColumn=f.end_col)
        results.append(
            {
                "ruleId": f.code,
                "ruleIndex": index[f.code],
                "level": "error",
                "message": {"text": f"{f.message}; fix: {f.fix}"},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": PurePath(f.path).as_posix()},
                            "region": region,
                        }
                    }
                ],
                "properties": {"place": f.place},
            }
        )
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "nanscope",
                        "version": __version__,
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2)


def render(findings: Sequence[LintFinding], fmt: str) -> str:
    """The findings in output format ``fmt`` (one of :data:`FORMATS`), without a summary."""
    if fmt == "text":
        return _text(findings)
    if fmt == "concise":
        return "\n".join(f.format() for f in findings)
    if fmt == "grouped":
        return _grouped(findings)
    if fmt == "json":
        return json.dumps(_json_payload(findings), indent=2)
    if fmt == "github":
        return _github(findings)
    if fmt == "sarif":
        return _sarif(findings)
    raise ValueError(f"unknown output format {fmt!r}")


def statistics(findings: Sequence[LintFinding]) -> str:
    """One line per code, most frequent first: count, code, ``[*]`` when fixable, name."""
    counts = Counter(f.code for f in findings)
    fixable = {f.code for f in findings if f.fixable}
    width = max((len(str(n)) for n in counts.values()), default=1)
    lines = []
    for code, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        rule = RULES.get(code)
        name = rule.name if rule is not None else "syntax-error"
        mark = "[*]" if code in fixable else "[ ]"
        lines.append(f"{n:>{width}}\t{code}\t{mark} {name}")
    return "\n".join(lines)
