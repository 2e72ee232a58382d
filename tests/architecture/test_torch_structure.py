"""The torch adapter's shape, pinned: no import cycle among its modules, no class over 400 lines
and no function over 100 in it, in the numpy capture and in the schedule.

Read as ASTs (nothing is imported, so it runs without torch). An import counts at any depth, a
lazy one inside a function too, but not one under ``if TYPE_CHECKING:`` (types only);
``from nanscope.torch import sharded`` is an import of the submodule ``nanscope.torch.sharded``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "nanscope"
TORCH = "nanscope.torch"
SIZED = [*sorted((SRC / "torch").glob("*.py")), *sorted((SRC / "capture").glob("*.py")),
         SRC / "schedule.py"]  # fmt: skip
CLASS_LINES = 400
FUNCTION_LINES = 100


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted((SRC / "torch").glob("*.py"))}


def _nodes(node: ast.AST):
    """Every node below ``node``, leaving out ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
            for other in child.orelse:
                yield other
                yield from _nodes(other)
            continue
        yield child
        yield from _nodes(child)


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    found: set[str] = set()
    for node in _nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            found.update(subs & set(MODULES) or {node.module})
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            found.add(str(node.args[0].value))
    return {m for m in found if m in MODULES and m != module}


def _cycle() -> list[str] | None:
    graph = {m: _imports(m) for m in MODULES}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_walker_sees_the_adapters_imports():
    assert "nanscope.torch.watcher" in _imports("nanscope.torch.watch")
    assert "nanscope.torch.distributed" in _imports("nanscope.torch.watch")
    assert "nanscope.torch.sharded" in _imports("nanscope.torch.records")
    assert "nanscope.torch.watcher" in _imports("nanscope.torch.autowatch")  # (a lazy import)


def test_no_import_cycle_in_the_torch_adapter():
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_the_watcher_knows_no_ranks_and_the_measure_no_shards():
    """The caller registers the cross-rank agreement (``watch``, ``nanscope run``); the sharded
    measure is picked by ``sharded.measure_for``, not by the base class."""
    assert "nanscope.torch.distributed" not in _imports("nanscope.torch.watcher")
    assert "nanscope.torch.sharded" not in _imports("nanscope.torch.measure")


@pytest.mark.parametrize("path", SIZED, ids=lambda p: p.name)
def test_no_class_or_function_too_long(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = []
    for node in ast.walk(tree):
        size = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
        if isinstance(node, ast.ClassDef) and size > CLASS_LINES:
            long.append(f"class {node.name}: {size} lines")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > FUNCTION_LINES:
            long.append(f"def {node.name}: {size} lines")
    assert not long, long
