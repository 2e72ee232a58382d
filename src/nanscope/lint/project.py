"""The files linted together: where an imported class or function is defined, and whether a loss
scaler or gradient clipping is set up in some file of the package.

``from .models import Discriminator`` in ``train.py`` and ``netD = Discriminator()`` say nothing
about what the model returns; ``models.py``, linted in the same run, does (a ``Sigmoid`` last
layer). :class:`Project` indexes the top-level classes and functions of every file of the run and
answers, for an imported name, what calling it yields, from the defining file's own analysis
(made on demand, once). A name defined in a file outside the run is unknown, as before.
"""

from __future__ import annotations

import ast
from pathlib import PurePath

from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import NestingTooDeep
from nanscope.lint.vocabulary import PACKAGE_WIDE

__all__ = ["Project"]


def _module_parts(path: str) -> tuple[str, ...]:
    parts = PurePath(path).with_suffix("").parts
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return tuple(parts)


class Project:
    """The top-level definitions of the files of one run, and their analyses made on demand."""

    def __init__(self) -> None:
        self._trees: dict[str, ast.Module] = {}
        self._contexts: dict[str, FileContext] = {}
        self._defined: dict[str, list[str]] = {}
        self._active: set[tuple[str, str]] = set()
        self._answers: dict[tuple[str, str], int] = {}
        #: the names of :data:`PACKAGE_WIDE` some file of the run mentions
        self.mentioned: set[str] = set()

    def add(self, path: str, tree: ast.Module, source: str = "") -> None:
        """Index the classes and functions ``tree`` defines at its top level, and the package-wide
        names (a loss scaler, gradient clipping) its ``source`` mentions."""
        self._trees[path] = tree
        for name in PACKAGE_WIDE - self.mentioned:
            if name in source:
                self.mentioned.add(name)
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self._defined.setdefault(node.name, []).append(path)

    def _context(self, path: str) -> FileContext:
        ctx = self._contexts.get(path)
        if ctx is None:
            ctx = FileContext(self._trees[path], frozenset(), project=self, path=path)
            self._contexts[path] = ctx
        return ctx

    def _defining_file(self, qualname: str, asking: str) -> str | None:
        module, _, name = qualname.rpartition(".")
        wanted = tuple(p for p in module.split(".") if p)
        found = [
            p
            for p in self._defined.get(name, ())
            if p != asking and wanted and _module_parts(p)[-len(wanted) :] == wanted
        ]
        return found[0] if len(found) == 1 else None

    def callee_kind(self, qualname: str, asking: str) -> int:
        """What calling the imported ``qualname`` (``models.Discriminator``) yields, as the
        :class:`~nanscope.lint.vocabulary.K` flags of the defining file; 0 when it is not
        defined in exactly one file of the run."""
        path = self._defining_file(qualname, asking)
        if path is None:
            return 0
        name = qualname.rpartition(".")[2]
        key = (path, name)
        got = self._answers.get(key)
        if got is not None:
            return got
        if key in self._active:
            return 0
        self._active.add(key)
        try:
            result = self._context(path).call_kinds.callee_of(name)
        except (NestingTooDeep, RecursionError):
            result = 0  # that file gets its own L000 finding
        finally:
            self._active.discard(key)
        self._answers[key] = result
        return result
