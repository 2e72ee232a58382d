"""The linter's shared analysis is three modules with one job each; rules import only their
exported names."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

LINT = Path(__file__).resolve().parents[2] / "src" / "nanscope" / "lint"
SHARED = ("vocabulary", "scopes", "inference", "ranking", "fixes")
RULE_FILES = sorted((LINT / "rules").glob("L*.py"))


@pytest.mark.parametrize("name", SHARED)
def test_shared_module_exports_what_it_defines(name: str) -> None:
    module = importlib.import_module(f"nanscope.lint.{name}")
    assert module.__all__ and all(hasattr(module, n) for n in module.__all__)


@pytest.mark.parametrize("path", RULE_FILES, ids=[p.stem[:4] for p in RULE_FILES])
def test_rules_import_only_exported_names(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nanscope.lint."):
            module = importlib.import_module(node.module or "")
            if node.module in ("nanscope.lint._types",):
                continue
            assert node.module.rpartition(".")[2] in SHARED, f"{path.name} imports {node.module}"
            for alias in node.names:
                assert alias.name in module.__all__, f"{path.name}: {node.module}.{alias.name}"


def test_the_inference_builds_on_the_walker() -> None:
    from nanscope.lint.inference import FileContext
    from nanscope.lint.scopes import ScopeWalker

    src = "import torch\ndef f(z):\n    p = torch.sigmoid(z)\n    return torch.log(p)\n"
    ctx = FileContext(ast.parse(src), frozenset({ast.Call}))
    assert isinstance(ctx, ScopeWalker)
    assert ctx.imports.get("torch") == "torch"
    calls = [n for n, _ in ctx.sites if isinstance(n, ast.Call)]
    log = next(c for c in calls if ctx.func_parts(c)[1] == "log")
    site = next(s for n, s in ctx.sites if n is log)
    from nanscope.lint.vocabulary import K

    assert ctx.kind(log.args[0], site.scope) & K.SIGMOID


def test_the_linter_reads_source_only() -> None:
    """No module of the linter imports numpy, torch or another framework: it is pure AST."""
    for path in LINT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                root = name.split(".")[0]
                assert root not in {"numpy", "torch", "tensorflow", "jax", "polars"}, path.name
