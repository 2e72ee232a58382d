"""The training loop's own preprocessing, re-evaluated: a producer there after update 1.

The first-update op watch sees the loop's code only on update 1; the replay of a later update
reruns the model, not the loop. When the batch the model received at a later update holds
inf/NaN, this probe re-evaluates the loop's preprocessing lines of that iteration, the
statements of the loop body before the line that called the model, from the loop's own variables
(its frame is still on the stack: the check runs inside ``optimizer.step()``), under an op check:
the first op whose inputs were finite and whose output was not is the producer, at its own line.

Only what cannot change anything is re-evaluated: plain assignments to names whose right side is
made of names, constants, arithmetic, indexing and calls of torch / numpy functions or tensor
methods that are neither in-place (``_`` suffix) nor random (the RNG is forked anyway). Names a
re-evaluated line reads must hold the value they had when the iteration began: bound by an
earlier re-evaluated line, or never assigned in the loop body (the loop's own variable counts
when the body does not rebind it). Anything else (an augmented assignment, a user function, a
batch rebound from itself: ``xb = torch.log(xb)`` on a DataLoader's batch) stops it, and nothing
is claimed. The result is kept only when the re-evaluated batch is the one the model got (the
same shape and the same non-finite entries): a wrong line is worse than none.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import os
import sys
import warnings
from typing import Any

from nanscope.numerics import op_name
from nanscope.probes._measure import made_by, why_nonfinite, widened
from nanscope.probes._tensors import (
    all_finite,
    float_tensors,
    nonfinite_scalar,
    op_watch,
    summary,
)
from nanscope.probes.failure import TorchFailure
from nanscope.probes.rows import current_batch_rows

__all__ = ["replay_preprocess"]

#: modules whose functions may be re-evaluated (by the name the script imported them as)
_MODULES = ("torch", "np", "numpy", "F", "nn", "math")
#: functions and methods that draw random numbers or touch state: never re-evaluated
_IMPURE = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial",
           "poisson", "dropout", "manual_seed", "seed", "save", "load", "backward", "step",
           "zero_grad", "item", "tolist", "numpy", "print", "open", "exec", "eval",
           "register", "set_", "copy_", "uniform", "exponential", "geometric", "cauchy",
           "log_normal", "random")  # fmt: skip
#: the name the model call's argument is bound to while it is re-evaluated
_ARG = "__nanscope_model_argument__"
_BUILTINS = ("len", "range", "min", "max", "abs", "float", "int", "slice", "tuple", "list")


def replay_preprocess(failure: TorchFailure) -> dict[str, Any] | None:
    """The producer in the loop's preprocessing of the failing update, or ``None``.

    A ``located`` dict (:mod:`nanscope.located`) with one key besides, ``input_rows``: the
    extreme rows of the producer's input, which :func:`~nanscope.probes.locate.locate` moves to
    the diagnosis rows."""
    site = failure.extra.get("model_site")
    if not isinstance(site, dict) or not site.get("file") or not site.get("line"):
        return None
    frame = _loop_frame(str(site["file"]), str(site.get("function") or ""))
    if frame is None:
        return None
    try:
        return _Replay(failure, frame, str(site["file"]), int(site["line"])).run()
    finally:
        del frame


def _loop_frame(file: str, function: str) -> Any:
    real = os.path.realpath(file)
    frame: Any = sys._getframe(1)
    for _ in range(200):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == function and os.path.realpath(code.co_filename) == real:
            return frame
        frame = frame.f_back
    return None


def _loop_body(tree: ast.AST, line: int) -> tuple[list[ast.stmt], list[ast.stmt],
                                                   ast.stmt] | None:  # fmt: skip
    """The innermost loop body around ``line`` and its statements that come before that line
    (nested ``with`` / ``if`` blocks that hold the line are entered)."""
    loop: ast.For | ast.While | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While)) and node.body and (
            node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0)
        ) and (loop is None or node.lineno > loop.lineno):  # fmt: skip
            loop = node
    if loop is None:
        return None
    before: list[ast.stmt] = []
    body: list[ast.stmt] = loop.body
    while True:
        holder = None
        for stmt in body:
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                holder = stmt
                break
            before.append(stmt)
        if isinstance(holder, (ast.With, ast.If)) and holder.body and (
            holder.body[0].lineno <= line
        ):
            body = holder.body
            continue
        return (loop.body, before, holder) if holder is not None else None


def _flat(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a body, those inside its ``with`` / ``if`` / ``try`` blocks too."""
    out: list[ast.stmt] = []
    for stmt in body:
        inner = [b for f in ("body", "orelse", "finalbody") for b in getattr(stmt, f, [])
                 if isinstance(b, ast.stmt)]  # fmt: skip
        if isinstance(stmt, (ast.With, ast.If, ast.Try)) and inner:
            out.extend(_flat(inner))
        else:
            out.append(stmt)
    return out


def _stored(nodes: list[ast.stmt]) -> set[str]:
    out: set[str] = set()
    for stmt in nodes:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                out.add(node.id)
    return out


def _targets(stmt: ast.stmt) -> list[str] | None:
    """The names a plain assignment binds (``a = ...``, ``a, b = ...``), else ``None``."""
    if not isinstance(stmt, ast.Assign):
        return None
    names: list[str] = []
    for target in stmt.targets:
        elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        for e in elts:
            if not isinstance(e, ast.Name):
                return None  # x[i] = ..., obj.attr = ...: writes into an object
            names.append(e.id)
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _pure(expr: ast.expr) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom,
                             ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return False  # fmt: skip
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else (
                func.id if isinstance(func, ast.Name) else None)
            if name is None or name.endswith("_") or any(name.startswith(b) for b in _IMPURE):
                return False
            if isinstance(func, ast.Name):
                if func.id not in _BUILTINS:
                    return False  # a user function: it may do anything
            elif _root(func) is None:
                continue  # a method of a computed value: (x - m).clamp(...)
            elif isinstance(func, ast.Attribute) and _root(func) not in _MODULES and not (
                isinstance(func.value, (ast.Name, ast.Subscript))
            ):
                return False  # obj.attr.method(): checked at run time only for obj.method()
    return True


class _Replay:
    def __init__(self, failure: TorchFailure, frame: Any, file: str, line: int) -> None:
        import torch

        self.torch = torch
        self.f = failure
        self.frame = frame
        self.file = file
        self.line = line
        self.first: dict[str, Any] | None = None
        self.stmt: ast.stmt | None = None

    def run(self) -> dict[str, Any] | None:
        torch = self.torch
        target = self._model_input()
        if target is None or bool(torch.isfinite(target).all()):
            return None  # the model got a finite batch: not the loop's story
        lines = linecache.getlines(self.file)
        if not lines:
            return None
        tree = ast.parse("".join(lines), filename=self.file)
        found = _loop_body(tree, self.line)
        if not found or not found[1]:
            return None
        body, before, holder = found
        # how many statements of the whole loop body bind each name: a name bound once, by a
        # line before, still holds that line's value of this iteration; one bound by no line
        # (the loop's variable, a tensor made before the loop) holds the iteration's value too
        stores: dict[str, int] = {}
        for stmt in _flat(body):
            for name in _stored([stmt]):
                stores[name] = stores.get(name, 0) + 1
        plan: list[ast.Assign] = []
        bound: set[str] = set()  # bound by a re-evaluated line
        kept: set[str] = set()  # bound once, by an earlier line that is not re-evaluated
        for stmt in before:
            names = _targets(stmt)
            reads = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                     and isinstance(n.ctx, ast.Load)}  # fmt: skip
            trusted = all(r in bound or r in kept or not stores.get(r) for r in reads)
            if names is not None and isinstance(stmt, ast.Assign) and _pure(stmt.value) and (
                trusted
            ):
                plan.append(stmt)
                bound.update(names)
                continue
            for name in _stored([stmt]):
                bound.discard(name)
                if stores.get(name) == 1:
                    kept.add(name)
                else:
                    kept.discard(name)
        call = self._model_argument(holder, bound, kept, stores)
        if not plan and call is None:
            return None
        ns = self._evaluate(plan, call)
        if self.first is None or ns is None:
            return None
        if not any(self._same(v, target) for v in ns.values()):
            return None  # the re-evaluated lines did not make the batch the model got
        return self._located(target)

    def _model_input(self) -> Any:
        tensors = float_tensors(self.f.args) or float_tensors(self.f.kwargs)
        return tensors[0].detach() if tensors else None

    def _same(self, value: Any, target: Any) -> bool:
        torch = self.torch
        if not isinstance(value, torch.Tensor) or value.shape != target.shape:
            return False
        with torch.no_grad():
            v, t = value.detach().to(target.device), target
            if not bool((torch.isfinite(v) == torch.isfinite(t)).all()):
                return False
            if not bool((torch.isnan(v) == torch.isnan(t)).all()):
                return False
            fin = torch.isfinite(t)
            return bool(torch.allclose(v[fin].double(), t[fin].double(), rtol=1e-4, atol=1e-6))

    def _model_argument(self, holder: ast.stmt, bound: set[str], kept: set[str],
                        stores: dict[str, int]) -> ast.Assign | None:  # fmt: skip
        """``model(<expr>, ...)`` on the line that called the model: its first argument, as an
        assignment to re-evaluate last (the batch may be made right there: ``model(x / 100)``)."""
        model = self.f.model
        for node in ast.walk(holder):
            if not isinstance(node, ast.Call) or not node.args or node.lineno != self.line:
                continue
            if self._lookup(node.func) is not model or model is None:
                continue
            arg = node.args[0]
            reads = {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)
                     and isinstance(n.ctx, ast.Load)}  # fmt: skip
            if isinstance(arg, ast.Starred) or not _pure(arg) or not all(
                r in bound or r in kept or not stores.get(r) for r in reads
            ):
                return None
            stmt = ast.Assign(targets=[ast.Name(id=_ARG, ctx=ast.Store())], value=arg)
            ast.copy_location(stmt, holder)
            stmt.lineno = holder.lineno
            return ast.fix_missing_locations(stmt)
        return None

    def _lookup(self, func: ast.expr) -> Any:
        """The object a call's function names (``model``, ``self.model``), without calling."""
        parts: list[str] = []
        node = func
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        scope = self.frame.f_locals
        value = scope[node.id] if node.id in scope else self.frame.f_globals.get(node.id)
        for attr in reversed(parts):
            value = getattr(value, attr, None)
        return value

    def _evaluate(self, plan: list[ast.Assign], call: ast.Assign | None) -> dict[str, Any] | None:
        torch = self.torch
        glb = dict(self.frame.f_globals)
        ns: dict[str, Any] = dict(self.frame.f_locals)
        made: dict[str, Any] = {}

        with contextlib.ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            stack.enter_context(torch.random.fork_rng(devices=[]))
            stack.enter_context(torch.no_grad())
            stack.enter_context(op_watch(self._note))
            for stmt in plan + ([call] if call is not None else []):
                if not self._receivers_ok(stmt, glb, ns):
                    return None  # a method of an object that is no tensor: it may do anything
                self.stmt = stmt
                code = compile(ast.Module(body=[stmt], type_ignores=[]), self.file, "exec")
                try:
                    exec(code, glb, ns)  # a pure assignment of the user's loop
                except Exception:
                    return None
                for name in _targets(stmt) or []:
                    made[name] = ns.get(name)
        return made

    def _receivers_ok(self, stmt: ast.stmt, glb: dict[str, Any], ns: dict[str, Any]) -> bool:
        import numpy as np

        torch = self.torch
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            root = _root(node.func)
            if root is None or root in _MODULES:
                continue
            value = ns.get(root, glb.get(root))
            if isinstance(node.func.value, ast.Subscript):
                continue  # x[i].method(): indexing a tensor or an array gives one
            if not isinstance(value, (torch.Tensor, np.ndarray)):
                return False
        return True

    def _note(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        if self.first is not None:
            return
        outs = float_tensors(out)
        if not outs or all_finite(outs):
            return
        ins = float_tensors(args) + float_tensors(kwargs)
        if not ins or not all_finite(ins) or nonfinite_scalar(args, kwargs):
            return
        self.first = {"func": func, "args": args, "kwargs": kwargs, "stmt": self.stmt,
                      "ins": [summary(t) for t in ins[:4]], "tensor": ins[0].detach(),
                      "out": summary(outs[0])}  # fmt: skip

    def _located(self, target: Any) -> dict[str, Any]:
        first = self.first
        assert first is not None
        stmt = first["stmt"]
        op = op_name(first["func"])
        out = first["out"]
        why = why_nonfinite(op, first["ins"], out["dtype"])
        source: dict[str, Any] = {"file": os.path.abspath(self.file), "line": stmt.lineno,
                                  "function": self.frame.f_code.co_name}  # fmt: skip
        code = linecache.getline(self.file, stmt.lineno).strip()
        if code:
            source["code"] = code
        located: dict[str, Any] = {
            "phase": "preprocess", "op": op, "module": None, "source": source,
            "dtype": out["dtype"], "output": "nan" if out.get("nan") else "inf",
            "input_values": first["ins"], **made_by(why, first["ins"]), "observed": True,
            "step": self.f.step,
            "how": "the training loop's preprocessing lines of the failing update, re-evaluated "
                   "from the loop's variables (the result matched the batch the model got)",
        }  # fmt: skip
        if why.get("kind") == "past_range" or out["dtype"] in ("float16", "bfloat16"):
            located.update(widened(first["func"], first["args"], first["kwargs"], out["dtype"]))
        located["input_rows"] = self._extreme_rows(first["tensor"], target)
        return located

    def _extreme_rows(self, tensor: Any, target: Any) -> list[dict[str, Any]]:
        """Finite but extreme rows of the producer's input (robust z-score), one per batch row."""
        import numpy as np

        from nanscope.capture.arrays import robust_rows

        if tensor.dim() < 1 or tensor.shape[0] != target.shape[0] or tensor.shape[0] < 3:
            return []
        index: Any = None
        with contextlib.suppress(Exception):
            # the loader's own tensor is the producer's input (the model got a transformed batch)
            index = current_batch_rows((tensor,), {})
            if index is not None and not np.asarray(index).size:
                index = None
        if index is None:
            index = self.f.batch_index
        try:
            if index is not None:
                index = np.asarray(index.detach().cpu() if hasattr(index, "detach")
                                   else index).reshape(-1)  # fmt: skip
            array = tensor.float().cpu().numpy()
            _, rows = robust_rows(array, "inputs", index)
        except Exception:
            return []
        for row in rows:
            row["step"] = self.f.step
        return list(rows)
