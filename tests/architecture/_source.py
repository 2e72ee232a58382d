"""The package's source read as syntax trees: its modules, what each imports, its definitions.

Nothing is imported: every module of ``src/nanscope`` is parsed with ``ast``. The architecture
tests build on these readers.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Mapping
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "nanscope"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


@cache
def tree_of(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(encoding="utf-8"))


def is_private(name: str) -> bool:
    """``_name``, not a dunder (``__version__``, ``__call__``)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node``, leaving out ``if TYPE_CHECKING:`` bodies (types only: they never
    run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from walk(other)
            continue
        yield child
        yield from walk(child)


def resolve(module: str, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if not level:
        return name or ""
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _import_module_call(node: ast.AST) -> str | None:
    """The literal name of an ``importlib.import_module("...")`` call."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


@cache
def imports_of(module: str) -> frozenset[str]:
    """The modules ``module`` imports, at any depth (a lazy import inside a function counts):
    ``from a import b`` counts ``a``, and ``a.b`` too when ``b`` is a module of the package. Wide
    on purpose: a layer may not even touch a package it must not know."""
    found: set[str] = set()
    for node in walk(tree_of(module)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, node.level, node.module)
            found.add(base)
            found.update(
                f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES
            )
        elif (name := _import_module_call(node)) is not None:
            found.add(name)
    found.discard(module)
    return frozenset(found)


@cache
def edges_of(module: str) -> frozenset[str]:
    """The package's modules whose code runs because ``module`` imports them, precisely:
    ``from a import b`` is an edge to ``a.b`` when ``b`` is a module, else to ``a``; ``import
    a.b`` is an edge to ``a.b`` (the parent packages' ``__init__`` are left out: every module has
    them, and they are checked as modules of their own)."""
    found: set[str] = set()
    for node in walk(tree_of(module)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
        elif (name := _import_module_call(node)) is not None:
            found.add(name)
    return frozenset(m for m in found if m in MODULES and m != module)


def definitions(
    tree: ast.AST, kind: type[ast.AST] | tuple[type[ast.AST], ...]
) -> Iterator[tuple[str, int]]:
    """``(qualified name, lines)`` of every class or function (``kind``) in ``tree``, nested ones
    included; lines run from the ``def``/``class`` line to the last line of the body."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if isinstance(child, kind):
                    yield name, (child.end_lineno or child.lineno) - child.lineno + 1
                yield from visit(child, name + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def private_uses(module: str, tree: ast.AST | None = None) -> set[str]:
    """The private names ``module`` takes from another module of the package, as
    ``"<module>.<name>"``: ``from a import _b`` (``_b`` not a module: a private module is a file
    of its package, imported by the public names in it), and ``m._b`` on a name ``m`` bound to a
    module of the package by an import."""
    found: set[str] = set()
    bound: dict[str, str] = {}  # local name -> the package's module it stands for
    tree = tree_of(module) if tree is None else tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, node.level, node.module)
            if base not in MODULES:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:
                    bound[alias.asname or alias.name] = sub
                elif is_private(alias.name) and base != module:
                    found.add(sub)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and is_private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and f"{bound[node.value.id]}.{node.attr}" not in MODULES
            and bound[node.value.id] != module
        ):
            found.add(f"{bound[node.value.id]}.{node.attr}")
    return found


def cycles(graph: Mapping[str, Collection[str]]) -> list[set[str]]:
    """The strongly connected components of ``graph`` with more than one node: each is a set of
    modules that import one another, round a cycle (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.add(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
