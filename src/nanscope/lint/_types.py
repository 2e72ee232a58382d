"""The finding record and the rule base class shared by the engine and every rule."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from nanscope.lint.inference import FileContext
    from nanscope.lint.scopes import Site

__all__ = ["CallRule", "Edit", "Hit", "LintFinding", "Rule"]


@dataclass(frozen=True)
class Edit:
    """Replace the source from (``line``, ``col``) to (``end_line``, ``end_col``) with ``text``.

    Lines are 1-based and columns are UTF-8 byte offsets, as in :mod:`ast` nodes.
    """

    line: int
    col: int
    end_line: int
    end_col: int
    text: str


@dataclass(frozen=True)
class LintFinding:
    """One problem found in one file: a stable code, where it is, what is wrong and the fix.

    ``line`` and ``col`` are 1-based, like every editor and like ruff. ``place`` says where the
    hazard stands (``loss``, ``update``, ``model``, ``training``, ``other``, ``data``, ``metrics``,
    ``inference``; see :mod:`nanscope.lint.ranking`). ``edits`` is the safe fix ``--fix`` applies,
    empty when the fix needs a person.
    """

    code: str
    name: str
    path: str
    line: int
    col: int
    message: str
    fix: str
    end_line: int | None = None
    end_col: int | None = None
    place: str = "other"
    edits: tuple[Edit, ...] = ()

    @property
    def fixable(self) -> bool:
        return bool(self.edits)

    def to_dict(self) -> dict[str, Any]:
        """The finding as plain data; the edits are summed up as ``fixable``."""
        out = asdict(self)
        del out["edits"]
        out["fixable"] = self.fixable
        return out

    def format(self) -> str:
        """``path:line:col: L### message`` (``[*]`` before the message when ``--fix`` can fix
        it), the line a terminal or an editor understands."""
        mark = "[*] " if self.edits else ""
        return f"{self.path}:{self.line}:{self.col}: {self.code} {mark}{self.message}"


@dataclass(frozen=True)
class Hit:
    """What a rule reports: the node it points at, the problem, (optionally) a specific fix text,
    and the edits that make the fix when it is safe to make without a person."""

    node: ast.AST
    message: str
    fix: str | None = None
    edits: tuple[Edit, ...] = ()


class Rule:
    """Base class of the lint rules.

    A rule declares the node types it wants (``node_types``); the engine walks the tree once and
    hands each rule the nodes of those types, in source order, with the :class:`Site` they were
    found at. A rule's docstring carries the sections *What it does*, *Why is this bad?*,
    *Example* and *Use instead*; the docs pages are generated from it.
    """

    code: ClassVar[str] = ""
    name: ClassVar[str] = ""
    #: the default fix text, used when a hit does not carry its own
    fix: ClassVar[str] = ""
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        raise NotImplementedError


class CallRule(Rule):
    """A rule that looks only at calls: the engine hands it every ``ast.Call``, and
    :meth:`check_call` receives the node already narrowed to one."""

    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        assert isinstance(node, ast.Call)
        return self.check_call(node, site, ctx)

    def check_call(self, node: ast.Call, site: Site, ctx: FileContext) -> Iterator[Hit]:
        raise NotImplementedError
