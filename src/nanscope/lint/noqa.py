"""Suppression comments, as ruff and flake8 read them.

- ``# noqa`` on a line suppresses every finding on it; ``# noqa: L003`` (or ``# noqa: L003, E501``)
  only the listed codes. ``# nanscope: noqa`` and ``# nanscope: noqa: L001`` work the same way
  and are not touched by other tools' unused-noqa checks.
- ``# nanscope: noqa`` on a line of its own (no code before it) exempts the whole file;
  ``# nanscope: noqa: L003`` on its own line exempts the file from those codes.

A finding spanning several lines is suppressed by a comment on its first or last line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["Suppressions"]

_CODES = r"(?P<codes>[A-Za-z]+[0-9]+(?:\s*,\s*[A-Za-z]+[0-9]+)*)"
_LINE = re.compile(rf"#\s*(?:nanscope\s*:\s*)?noqa(?::\s*{_CODES})?", re.I)
_FILE = re.compile(rf"^\s*#\s*nanscope\s*:\s*noqa(?::\s*{_CODES})?\s*$", re.I)


def _codes(match: re.Match[str]) -> frozenset[str]:
    codes = match.group("codes")
    if not codes:
        return frozenset()
    return frozenset(c.strip().upper() for c in codes.split(","))


class Suppressions:
    """The ``noqa`` comments of one source."""

    def __init__(self, lines: Sequence[str]) -> None:
        #: line number -> suppressed codes (empty: all)
        self.lines: dict[int, frozenset[str]] = {}
        #: None: no file-level comment; empty: the whole file; else the exempted codes
        self.file: frozenset[str] | None = None
        for number, text in enumerate(lines, start=1):
            if "noqa" not in text.lower():
                continue
            whole = _FILE.match(text)
            if whole is not None:
                codes = _codes(whole)
                if not codes or self.file == frozenset():
                    self.file = frozenset()
                else:
                    self.file = (self.file or frozenset()) | codes
                continue
            match = _LINE.search(text)
            if match is not None:
                self.lines[number] = _codes(match)

    def file_exempt(self, code: str) -> bool:
        return self.file is not None and (not self.file or code in self.file)

    def suppressed(self, code: str, *line_numbers: int) -> bool:
        if self.file_exempt(code):
            return True
        for number in line_numbers:
            codes = self.lines.get(number)
            if codes is not None and (not codes or code in codes):
                return True
        return False
