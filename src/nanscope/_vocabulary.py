"""The base of nanscope's string vocabularies (verdicts, alarm kinds, outcome kinds).

A member is its plain string (``Verdict.HEALTHY == "healthy"``, the same hash, the same JSON from
``json`` and ``orjson``), so a typed name can replace a retyped literal without changing any
output. ``enum.StrEnum`` does this from Python 3.11; nanscope supports 3.10.
"""

from __future__ import annotations

import enum

__all__ = ["Vocabulary"]


class Vocabulary(str, enum.Enum):
    """A ``str`` enum whose ``str()`` and f-string are the value on every Python (3.12 changed
    what ``format()`` of a str-mixin enum prints)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
