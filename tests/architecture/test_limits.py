"""The package's shape, pinned: no import cycle, no private name taken from another module, no
class over 400 lines, no function over 100 lines (``src/nanscope``; tests are not counted).

Each check has an allowance: the violations of the tree when the check was written, one entry each.
An allowance may only shrink: a new violation fails, an allowed one that grew fails (functions and
classes carry the length they had as a ceiling), and an entry whose violation is gone fails too
until it is removed, so a fixed violation cannot come back unnoticed. Never add an entry: fix the
code (split the function, move the shared helper into a module of its own under a public name).
"""

from __future__ import annotations

import ast
from functools import cache

from ._source import MODULES, cycles, definitions, edges_of, private_uses, tree_of

MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 100

#: imports (importer, imported) that close an import cycle today; may only shrink
CYCLE_EDGES: set[tuple[str, str]] = set()

#: (module, "<other module>.<private name>") it takes today; may only shrink
PRIVATE_IMPORTS: set[tuple[str, str]] = set()

#: "module:Class" -> its lines today, a ceiling; may only shrink
LARGE_CLASSES: dict[str, int] = {}

#: "module:qualified.name" -> its lines today, a ceiling; may only shrink
LONG_FUNCTIONS: dict[str, int] = {}

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@cache
def _private_uses() -> frozenset[tuple[str, str]]:
    return frozenset((module, used) for module in MODULES for used in private_uses(module))


def _stale(allowed: set[str], found: set[str], what: str) -> str:
    gone = sorted(allowed - found)
    return f"fixed, remove from {what}: {gone}" if gone else ""


@cache
def _cycle_edges() -> frozenset[tuple[str, str]]:
    graph = {module: edges_of(module) for module in MODULES}
    return frozenset((a, b) for ring in cycles(graph) for a in ring for b in graph[a] & ring)


@cache
def _over(kind: type[ast.AST] | tuple[type[ast.AST], ...], limit: int) -> dict[str, int]:
    return {
        f"{module}:{name}": lines
        for module in MODULES
        for name, lines in definitions(tree_of(module), kind)
        if lines > limit
    }


def _check_lengths(found: dict[str, int], allowed: dict[str, int], limit: int, what: str) -> None:
    new = sorted(f"{name}: {lines} lines" for name, lines in found.items() if name not in allowed)
    grown = sorted(
        f"{name}: {lines} lines, allowed {allowed[name]}"
        for name, lines in found.items()
        if name in allowed and lines > allowed[name]
    )
    assert not new, f"over {limit} lines, split it:\n" + "\n".join(new)
    assert not grown, f"an allowed long {what} grew:\n" + "\n".join(grown)


# --- the checks -----------------------------------------------------------------------------


def test_no_import_cycle() -> None:
    found = _cycle_edges()
    new = sorted(found - CYCLE_EDGES)
    assert not new, "imports that close a cycle:\n" + "\n".join(f"{a} -> {b}" for a, b in new)


def test_no_private_name_taken_from_another_module() -> None:
    new = sorted(_private_uses() - PRIVATE_IMPORTS)
    assert not new, (
        "private names taken from another module (make them public, in a module of their own):\n"
        + "\n".join(f"{module}: {used}" for module, used in new)
    )


def test_no_class_over_400_lines() -> None:
    _check_lengths(_over(ast.ClassDef, MAX_CLASS_LINES), LARGE_CLASSES, MAX_CLASS_LINES, "class")


def test_no_function_over_100_lines() -> None:
    found = _over(_FUNCTIONS, MAX_FUNCTION_LINES)
    _check_lengths(found, LONG_FUNCTIONS, MAX_FUNCTION_LINES, "function")


def test_the_allowances_only_shrink() -> None:
    stale = [
        _stale({f"{a} -> {b}" for a, b in CYCLE_EDGES},
               {f"{a} -> {b}" for a, b in _cycle_edges()}, "CYCLE_EDGES"),
        _stale({f"{m}: {u}" for m, u in PRIVATE_IMPORTS},
               {f"{m}: {u}" for m, u in _private_uses()}, "PRIVATE_IMPORTS"),
        _stale(set(LARGE_CLASSES), set(_over(ast.ClassDef, MAX_CLASS_LINES)), "LARGE_CLASSES"),
        _stale(set(LONG_FUNCTIONS), set(_over(_FUNCTIONS, MAX_FUNCTION_LINES)), "LONG_FUNCTIONS"),
    ]  # fmt: skip
    assert not any(stale), "\n".join(s for s in stale if s)


# --- the readers see what they must ---------------------------------------------------------


def test_a_cycle_is_found_round_any_number_of_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert cycles(graph) == [{"a", "b", "c"}]  # a self-import is no cycle of modules
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_private_names_are_seen_imported_and_read_through_a_module() -> None:
    code = """
from nanscope.monitor import _default_root, Monitor
from nanscope import detectors as found
from nanscope.torch import _hooks
import nanscope.ledger as book

def f():
    from nanscope.probes.locate import _scan_function
    return found._num, book._when, _hooks._is_library, book.__name__, _hooks.LIBRARY
"""
    uses = private_uses("nanscope.commands.runs", ast.parse(code))
    assert uses == {
        "nanscope.monitor._default_root", "nanscope.detectors._num", "nanscope.ledger._when",
        "nanscope.torch._hooks._is_library", "nanscope.probes.locate._scan_function",
    }  # fmt: skip  # a private module imported for its public names is fine


def test_lengths_count_every_line_of_nested_definitions() -> None:
    code = "class A:\n def f(self):\n  def g():\n   return 1\n\n  return g\n"
    assert dict(definitions(ast.parse(code), _FUNCTIONS)) == {"A.f": 5, "A.f.g": 2}
    assert dict(definitions(ast.parse(code), ast.ClassDef)) == {"A": 6}
