"""What the probes share: one home for the tensor helpers, the user-frame list, the dtype limits
and op families, and the ``located`` key table; and ``probes/`` imports without a cycle."""

from __future__ import annotations

import ast
import contextlib
import copy
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from nanscope import numerics  # noqa: E402
from nanscope._frames import is_nanscope, is_user_file, owner, user_frame  # noqa: E402
from nanscope.located import KEYS, Located, unknown_keys  # noqa: E402
from nanscope.probes._tensors import (  # noqa: E402
    all_finite,
    float_tensors,
    saved_tensors,
    tensors,
)
from nanscope.probes.locate import inspect_graph  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src" / "nanscope"


# ------------------------------------------------------------------------------- imports


def _nanscope_imports(path: Path) -> tuple[set[str], list[str]]:
    """(modules imported at the top of the file, modules imported inside a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: set[str] = set()
    local: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nanscope"):
            top.add(str(node.module))
            top.update(f"{node.module}.{a.name}" for a in node.names)
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "nanscope.probes"
                ):
                    local.append(f"{func.name}: {node.module}")
    return top, local


def test_the_probes_import_each_other_at_the_top_and_without_a_cycle() -> None:
    modules = {f"nanscope.probes.{p.stem}": p for p in (SRC / "probes").glob("*.py")
               if p.stem != "__init__"}  # fmt: skip
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        top, local = _nanscope_imports(path)
        assert not local, f"{name} imports probes inside a function: {local}"
        graph[name] = {m for m in top if m in modules}

    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, " -> ".join((*trail, name))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, (*trail, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
    # the replay builds on the live watch, never the other way round
    assert "nanscope.probes.producer" in graph["nanscope.probes.locate"]
    assert "nanscope.probes.locate" not in graph["nanscope.probes.producer"]


@pytest.mark.parametrize("leaf", ["numerics.py", "_frames.py", "located.py"])
def test_the_shared_vocabularies_are_leaves(leaf: str) -> None:
    top, _ = _nanscope_imports(SRC / leaf)
    text = (SRC / leaf).read_text(encoding="utf-8")
    assert not top and "import nanscope" not in text and "import torch" not in text


# ------------------------------------------------------------------------------- numerics


def test_the_dtype_limits_are_torchs() -> None:
    assert torch.finfo(torch.float16).max == numerics.HALF_MAX
    assert torch.finfo(torch.bfloat16).max == numerics.BF16_MAX
    for name, limit in numerics.FLOAT_MAX.items():
        assert limit == torch.finfo(getattr(torch, name)).max
    tiny = torch.tensor(numerics.HALF_TINY, dtype=torch.float16)
    assert float(tiny) == numerics.HALF_TINY and float(tiny / 2) == 0.0  # the last one before 0


def test_op_names_read_pythons_spellings() -> None:
    assert numerics.op_name(torch.Tensor.__truediv__) == "div"
    assert numerics.op_name(torch.Tensor.__rtruediv__) == "div"
    assert numerics.op_name(torch.Tensor.__iadd__) == "add"
    assert numerics.op_name(torch.Tensor.__rpow__) == "pow"
    assert numerics.op_name(torch.square) == "pow"
    assert numerics.op_name(torch.log) == "log"


def test_the_families_take_forward_backward_and_numpy_names() -> None:
    def family(name: str) -> set[str]:
        low = name.lower()
        families = (("log", numerics.LOG_OPS), ("div", numerics.DIVISION_OPS),
                    ("grow", numerics.GROWTH_OPS))  # fmt: skip
        return {f for f, ops in families if any(k in low for k in ops)}

    assert "log" in family("LogBackward0") and "log" in family("NllLossBackward0")
    assert "log" in family("binary_cross_entropy") and "log" in family("log")
    assert "div" in family("DivBackward0") and "div" in family("divide")
    assert "div" in family("SqrtBackward0") and "div" in family("pdist")
    assert "grow" in family("exp") and "grow" in family("addmm") and "grow" in family("square")


# ------------------------------------------------------------------------------- frames


def test_whose_file_it_is() -> None:
    assert owner(__file__) == "user" and is_user_file(__file__)
    assert owner(torch.__file__) == "library" and owner(np.__file__) == "library"
    assert owner(contextlib.__file__) == "library"
    assert owner("<frozen runpy>") == "library"
    assert owner(str(SRC / "monitor.py")) == "nanscope" and is_nanscope(str(SRC / "monitor.py"))
    # nanscope's patches of torch only call through to the user's code
    hooks = str(SRC / "torch" / "_hooks.py")
    assert owner(hooks) == "library" and is_nanscope(hooks)
    # code run from a string is the user's, but there is no file to show
    assert owner("<string>") == "user" and not is_user_file("<string>")


def test_a_package_folder_counts_only_inside_an_installed_packages_folder(tmp_path: Path) -> None:
    packages = tmp_path / "lib" / "site-packages"
    assert owner(str(packages / "lightning" / "trainer.py")) == "library"
    assert owner(str(packages / "transformers" / "trainer.py")) == "library"
    assert owner(str(packages / "their_package" / "model.py")) == "user"
    assert owner(str(tmp_path / "torch" / "train.py")) == "user"  # the user's own folder


class _CopiedHere:
    """Records the first user frame when ``copy.deepcopy`` (standard library code) copies it."""

    found: FrameType | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> _CopiedHere:
        _CopiedHere.found = user_frame(sys._getframe(1))  # the frame of copy.py that called
        return self


def test_the_user_frame_is_found_past_the_standard_library() -> None:
    copy.deepcopy(_CopiedHere())  # the copying line
    frame = _CopiedHere.found
    assert frame is not None and frame.f_code.co_filename == __file__
    assert frame.f_code.co_name == "test_the_user_frame_is_found_past_the_standard_library"


def test_a_frame_of_nanscope_ends_the_walk() -> None:
    from nanscope.formatting import value

    class Spy(dict):  # type: ignore[type-arg]
        def items(self) -> Any:  # called by nanscope.formatting.value
            Spy.frame = user_frame(sys._getframe(1))
            Spy.through = user_frame(sys._getframe(1), through=(value.__code__.co_filename,))
            return super().items()

    value(Spy(a=1))
    assert Spy.frame is None  # nanscope's own code asked: not the user's
    assert Spy.through is not None and Spy.through.f_code.co_filename == __file__


# ------------------------------------------------------------------------------- tensors


def test_finite_is_exact_when_the_sum_overflows() -> None:
    big = torch.full((4,), 3e38)
    assert all_finite([big])  # the sum is inf, the values are not
    assert not all_finite([torch.tensor([1.0, float("nan")])])
    assert all_finite([torch.empty(3, device="meta")])  # no values to read
    half = torch.full((8,), 60000.0, dtype=torch.float16)
    assert all_finite([half]) and not all_finite([half * 2])


def test_the_tensors_of_nested_arguments() -> None:
    a, b, c = torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.ones(0)
    nested = (a, [b, {"k": c}], [[[[torch.ones(1)]]]])
    assert [t is x for t, x in zip(tensors(nested), (a, b, c), strict=True)] == [True] * 3
    assert float_tensors(nested) == [a]  # an integer and an empty tensor hold no float values
    item = tensors((np.zeros(2), 3.0), items=True)
    assert len(item) == 2 and item[1].shape == ()


def test_saved_tensors_say_when_the_graph_was_freed() -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = (x * 3.0).log()
    node = y.grad_fn
    assert list(saved_tensors(node)) == ["self"]
    y.sum().backward()
    with pytest.raises(RuntimeError):
        saved_tensors(node)


# ------------------------------------------------------------------------------- located


def test_located_reads_a_probes_dict_and_every_key_is_in_the_table() -> None:
    x = torch.tensor([1.0, 0.0, 2.0], requires_grad=True)
    loss = torch.log(x * 1.0).sum()  # log of 0: -inf
    found = inspect_graph(loss)
    assert found and found["op"] == "log" and found["from"] == "live graph"
    assert not unknown_keys(found)
    loc = Located.read(found)
    assert (loc.op, loc.phase, loc.observed, loc.from_) == ("log", "loss", True, "live graph")
    assert loc.why is not None and loc.why["kind"] == "log_domain"


def test_located_types_and_the_from_key() -> None:
    loc = Located.read({"op": "div", "from": "live graph", "observed": "yes", "step": 3,
                        "input_absmax": 2, "loss_scale": True})  # fmt: skip
    assert loc.op == "div" and loc.from_ == "live graph" and loc.step == 3
    assert loc.observed is None and loc.loss_scale is None  # the wrong type reads as absent
    assert loc.input_absmax == 2
    assert loc.to_dict() == {"op": "div", "step": 3, "input_absmax": 2, "from": "live graph"}
    assert Located.read(None) == Located()
    assert unknown_keys({"op": "x", "opp": 1}) == {"opp"}
    assert KEYS[:2] == ("phase", "op") and "from" in KEYS and "from_" not in KEYS


def _keys_written(path: Path) -> set[str]:
    """The literal keys the module writes into a located dict (``located``, ``found``,
    ``produced``): dict displays assigned to those names, item stores, ``setdefault``."""
    names = {"located", "found", "produced"}

    def name(node: ast.AST) -> str | None:
        return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)

    keys: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and name(target.value) in names and (
                    isinstance(target.slice, ast.Constant)
                ):
                    keys.add(str(target.slice.value))
                if name(target) in names and isinstance(node.value, ast.Dict):
                    keys |= {str(k.value) for k in node.value.keys if isinstance(k, ast.Constant)}
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "setdefault"
                and name(getattr(node.func, "value", None)) in names and node.args
                and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            keys.add(str(node.args[0].value))
    return keys


def test_the_probes_write_only_keys_of_the_table() -> None:
    #: the loop hands its producer input's rows to the replay, which moves them to the rows
    handed_over = {"input_rows"}
    written: dict[str, set[str]] = {}
    for path in (SRC / "probes").glob("*.py"):
        for key in _keys_written(path):
            written.setdefault(key, set()).add(path.name)
    assert {"op", "why", "from", "also", "replay"} <= set(written)  # the scan sees them
    stray = {k: v for k, v in written.items() if k not in KEYS and k not in handed_over}
    assert not stray, stray


def test_the_table_documents_every_key() -> None:
    doc = (SRC / "located.py").read_text(encoding="utf-8")
    missing = [k for k in KEYS if f"``{k}``" not in doc.split('"""')[1]]
    assert not missing, missing
