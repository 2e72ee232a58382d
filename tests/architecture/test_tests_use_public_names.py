"""Tests assert on public behaviour: the trace, the diagnosis, the output, not private state.

Every module under ``tests/`` (fixtures left out) is read as a syntax tree; a private name it
reads (``obj._name``, ``from nanscope.x import _name``) fails unless :data:`ALLOWED` lists it.
``self._x``, dunders and IPython's ``_repr_html_`` protocol are not private state; a public name
in a private module (``from nanscope.logs._common import Columns``) is a public name.

ALLOWED is the few places where a test must look inside (a planted fault, the state a property
test counts out, torch's own hook tables, which torch offers no public reading of). It may only
shrink: a new entry needs a reason no public behaviour can stand in for.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ._source import is_private

TESTS = Path(__file__).resolve().parents[1]

#: (file under tests/, the private name as written); may only shrink
ALLOWED: set[tuple[str, str]] = {
    # torch's hook tables and GradScaler's scale tensor: that nanscope left no hook on a user's
    # model, or reads the scaler's own tensor, has no public reading in torch
    ("compat/scripts/deepcopy_ema.py", "ema._forward_hooks"),
    ("compat/scripts/deepcopy_ema.py", "ema._forward_pre_hooks"),
    ("compat/scripts/deepcopy_ema.py", "shallow._forward_hooks"),
    ("compat/scripts/deepcopy_ema.py", "shallow._forward_pre_hooks"),
    ("compat/scripts/save_whole_model.py", "loaded._forward_hooks"),
    ("compat/scripts/save_whole_model.py", "loaded._forward_pre_hooks"),
    ("torch/test_invisible.py", "model._forward_hooks"),
    ("torch/test_invisible.py", "model._forward_pre_hooks"),
    ("torch/test_invisible.py", "other._forward_hooks"),
    ("torch/test_invisible.py", "other._forward_pre_hooks"),
    ("torch/test_precision.py", "scaler._scale"),
    # a planted fault in an internal part (the Monitor's measures, the sharded pack)
    ("distributed/fsdp_train.py", "sharded.ShardedMeasure._pack"),
    ("monitor/test_monitor.py", "mon._params"),
    # property tests that count out an internal rule against its fast path
    ("detectors/test_quiet_detectors.py", "spikes._grad"),
    ("detectors/test_quiet_detectors.py", "spikes._loss"),
    ("detectors/test_quiet_detectors.py", "spikes._waiting"),
    ("diagnose/test_climb.py", "detectors._climbing"),
    ("logs/test_fast_path.py", "textlog._Layout"),
    ("logs/test_fast_path.py", "textlog._Layout._one_by_one"),
    ("logs/test_fast_path.py", "textlog._State"),
    ("logs/test_fast_path.py", "textlog._find_layout"),
    ("logs/test_fast_tables.py", "csvlog._Reader"),
    ("logs/test_real_shapes.py", "textlog._State"),
    ("report/test_plots.py", "plots._reduce"),
    # the reader below load_trace's net of last resort: the fuzz must see what escapes it
    ("logs/test_fuzz.py", "nanscope.logs._load"),
    # the v1 schema, to write a file the migration starts from
    ("ledger/test_ledger.py", "nanscope.ledger._V1"),
    # that a batch of deferred updates waits, and how many are judged at once
    ("monitor/test_deferred_judging.py", "mon._deferred"),
    ("monitor/test_deferred_judging.py", "nanscope.Monitor._judge_deferred"),
    # which updates took the lean check, and the global module hooks' narrowing
    ("torch/test_autowatch_narrow.py", "autowatch._MODULE_HANDLES"),
    ("torch/test_lean_check.py", "watcher.records.measure._lean_stacked"),
}

#: names of other libraries' modules whose private names a test may call (os._exit, torch._C)
_OTHERS = {"os", "sys", "atexit", "torch"}


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_reads(tree: ast.AST) -> set[str]:
    """The private names a test module reads, as written (``watcher._batched``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            if node.attr.startswith("_repr_") and node.attr.endswith("_"):
                continue  # IPython's display protocol
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if _root(node.value) in _OTHERS:
                continue
            found.add(f"{ast.unparse(node.value)}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nanscope"):
            found.update(f"{node.module}.{a.name}" for a in node.names if is_private(a.name))
    return found


def _found() -> set[tuple[str, str]]:
    return {
        (path.relative_to(TESTS).as_posix(), name)
        for path in sorted(TESTS.rglob("*.py"))
        if "fixtures" not in path.relative_to(TESTS).parts
        for name in private_reads(ast.parse(path.read_text(encoding="utf-8")))
    }


def test_tests_read_no_private_state() -> None:
    found = _found()
    new = sorted(found - ALLOWED)
    assert not new, "tests reading private names (assert on public behaviour):\n" + "\n".join(
        f"tests/{path}: {name}" for path, name in new
    )
    gone = sorted(ALLOWED - found)
    assert not gone, f"no longer read, remove from ALLOWED: {gone}"


def test_the_reader_sees_private_reads_and_leaves_public_ones() -> None:
    code = """
from nanscope.ledger import _V1, Ledger
from nanscope.logs._common import Columns
import os

class T:
    def f(self, mon, d):
        self._mine, os._exit, d._repr_html_, mon.trace
        return mon._deferred, mon.records.measure._lean
"""
    assert private_reads(ast.parse(code)) == {
        "nanscope.ledger._V1", "mon._deferred", "mon.records.measure._lean",
    }  # fmt: skip
