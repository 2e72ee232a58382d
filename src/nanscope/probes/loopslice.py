"""The training step as the user wrote it, cut out of their loop so that it can be replayed.

The decisive experiment reruns the last updates of a fit from a snapshot, with one thing changed
(:mod:`nanscope.probes.replay`). What an update computes is the user's code: the loop body that
calls the model, builds the loss, calls ``backward()`` and ``optimizer.step()``. This module reads
that code (the file and the line of the ``step()`` call, from the frame that made it) and keeps the
statements an update needs, in order, as one compiled block:

* the essential statements: ``backward()``, ``zero_grad()``, ``clip_grad_norm_`` /
  ``clip_grad_value_``, the ``step()`` call itself, a gradient changed by hand (``p.grad /=
  scale``), calls of the user's own functions (they may do any of those), and the ``with`` /
  ``if`` / ``for`` blocks around them;
* the assignments those read, transitively (``out = model(x)``, ``loss = crit(out, y)``);
* nothing after the ``step()`` call, and nothing the update does not need: prints, logging,
  metrics, ``scheduler.step()`` (the replay sets each update's recorded learning rate itself).

The names the kept block reads but does not make are of three kinds. The loop's own variables
(``for xb, yb in loader``), the parameters of a function that is the unit (``def train_step(x,
y)``), and the names a statement with a side effect binds (``xb, yb = next(it)``,
``X, Y = get_batch()``) change every update: they are *captured*, their values kept at each
update's check, and a kept statement that only rebinds them is skipped in the replay (the kept
value already went through it). Every other name is read from the frame when the replay runs:
the model, the optimizer, the loss module, data tensors made before the loop.

A loop that updates its parameters by hand (``with torch.no_grad(): w -= lr * w.grad``) has no
``step()`` call: its plan is read from the line of its ``backward()`` call instead, and its update
is the rest of the loop body: every in-place change of a tensor made under ``no_grad`` or through
``.data`` is essential there (:func:`plan_for` with ``by_hand``).

Nothing here is trusted blindly: the replay first reruns the window unchanged (the control), and
only when that reproduces the recorded losses and the failure is any experiment believed.
"""

from __future__ import annotations

import ast
import contextvars
import linecache
from dataclasses import dataclass, field
from types import CodeType

__all__ = ["Plan", "plan_for"]

#: calls whose statement is part of an update wherever it stands
_TRAINING_METHODS = ("backward", "zero_grad", "step")
_TRAINING_FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "backward")
#: calls that only report or store: a statement made of one is never replayed
_REPORTING = ("print", "log", "info", "debug", "warning", "write", "add_scalar", "add_scalars",
              "append", "extend", "save", "set_postfix", "set_description", "update", "flush",
              "item", "tolist", "numpy", "add_histogram", "log_metrics", "log_dict", "savefig",
              "plot", "close", "record", "put", "send")  # fmt: skip
#: calls that draw a new batch or random numbers: what they bind is captured, not recomputed
_DRAWING = ("next", "get_batch", "sample", "randint", "randperm", "choice", "shuffle",
            "permutation")  # fmt: skip


#: the statements of a hand-written update being planned (ids): essential wherever they stand
_HAND_UPDATES: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "nanscope_hand_updates", default=frozenset())


@dataclass
class Plan:
    """What :func:`plan_for` found.

    code: the kept statements, compiled (None when the step cannot be cut out: ``reason`` says
    why); captured: the names whose values are kept at every update; skipped: the kept
    statements' lines that only rebind captured names (left out of ``code``); lines: the lines of
    the statements in ``code``; optimizer: the name the ``step()`` call was made on."""

    file: str
    line: int
    unit: str = "loop"
    code: CodeType | None = None
    captured: tuple[str, ...] = ()
    lines: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    optimizer: str | None = None
    fed: tuple[str, ...] = ()
    free: tuple[str, ...] = ()
    accumulates: bool = False
    by_hand: bool = False
    #: the step clips its gradient itself (``clip_grad_norm_`` / ``clip_grad_value_``)
    clips: bool = False
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.code is not None


def plan_for(file: str, function: str, line: int, model_line: int | None = None, *,
             by_hand: bool = False) -> Plan:  # fmt: skip
    """The plan of the update whose ``optimizer.step()`` call is at ``file:line`` in ``function``
    (``"<module>"`` for a script's top level). ``model_line``: the line in the same function that
    calls the model; the names it passes the model and reads nowhere else are not recomputed
    (the replay feeds the model the arguments it got: ``fed``). ``by_hand``: ``line`` is the
    ``backward()`` call of a loop that updates its parameters by hand; the update is the rest of
    the loop body. Never raises: a plan that cannot be made says why."""
    plan = Plan(file, line, by_hand=by_hand)
    try:
        source = "".join(linecache.getlines(file))
        if not source:
            plan.reason = f"the source of {file} cannot be read"
            return plan
        tree = ast.parse(source, filename=file)
        _make(plan, tree, function, model_line)
    except (SyntaxError, ValueError, RecursionError) as exc:
        plan.code = None
        plan.reason = f"the training step could not be read ({type(exc).__name__})"
    return plan


# ------------------------------------------------------------------------------ the unit


def _scope(tree: ast.Module, function: str, line: int) -> ast.AST | None:
    """The function named ``function`` that holds ``line`` (innermost), or the module."""
    if function == "<module>":
        return tree
    best: ast.AST | None = None
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (best is None or node.lineno >= getattr(best, "lineno", 0))):  # fmt: skip
            best = node
    return best


def _holds(node: ast.AST, line: int) -> bool:
    return getattr(node, "lineno", 0) <= line <= (getattr(node, "end_lineno", 0) or 0)


def _innermost_loop(body: list[ast.stmt], line: int) -> ast.For | ast.While | None:
    """The innermost ``for`` / ``while`` of this scope (not of a nested function) whose body
    holds ``line``."""
    found: ast.For | ast.While | None = None
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if not _holds(node, line):
            continue
        if isinstance(node, (ast.For, ast.While)) and any(_holds(s, line) for s in node.body):
            found = node
            stack = list(node.body)
            continue
        stack.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt))
    return found


def _make(plan: Plan, tree: ast.Module, function: str, model_line: int | None) -> None:
    scope = _scope(tree, function, plan.line)
    if scope is None:
        plan.reason = f"no function {function} around line {plan.line} of {plan.file}"
        return
    scope_body: list[ast.stmt] = getattr(scope, "body", [])
    loop = _innermost_loop(scope_body, plan.line)
    captured: list[str] = []
    if loop is not None:
        body = loop.body
        if isinstance(loop, ast.For):
            captured.extend(_names(loop.target))
        plan.unit = "loop"
    elif isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = scope.body
        args = scope.args
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs):
            captured.append(a.arg)
        for extra in (args.vararg, args.kwarg):
            if extra is not None:
                captured.append(extra.arg)
        plan.unit = "function"
    else:
        plan.reason = "the step() call is in no loop and no function: nothing repeats"
        return
    step_stmt = _statement_at(body, plan.line)
    if step_stmt is None:
        plan.reason = f"no statement at line {plan.line}"
        return
    top = next(s for s in body if _holds(s, plan.line))
    # a step under a condition in the loop (gradient accumulation over loop iterations): an
    # update is several iterations, each replayed as it ran (the condition holds at its last)
    plan.accumulates = isinstance(top, ast.If) and plan.unit == "loop"
    fed: set[str] = set()
    if plan.by_hand:
        # no step() call: the update is what the body changes in place after the backward
        updates = _hand_updates(body)
        if not updates:
            plan.reason = "no in-place update of a tensor was found after the backward() call"
            return
        last = max((s.end_lineno or s.lineno) for s in body)
        token = _HAND_UPDATES.set(frozenset(id(s) for s in updates))
        try:
            kept = _keep(list(body), last, set(captured), model_line, fed)
        finally:
            _HAND_UPDATES.reset(token)
    else:
        plan.optimizer = _step_receiver(step_stmt)
        upto = body[: body.index(top) + 1]
        kept = _keep(upto, plan.line, set(captured), model_line, fed)
    plan.fed = tuple(sorted(fed))
    if not kept or not any(_training_call(s) for s in ast.walk(ast.Module(body=kept,
                                                                          type_ignores=[]))
                           if isinstance(s, ast.stmt)):  # fmt: skip
        plan.reason = "no backward() or step() call was found in the training step"
        return
    # names bound by a statement that draws (next(it), get_batch()): captured, not recomputed
    for stmt in _walk_statements(kept):
        if isinstance(stmt, ast.Assign) and _draws(stmt.value):
            for target in stmt.targets:
                captured.extend(n for n in _names(target) if n not in captured)
    final: list[ast.stmt] = []
    _drop_rebinds(kept, set(captured), final, plan.skipped)
    plan.captured = tuple(dict.fromkeys(captured))
    bound = {n for stmt in _walk_statements(final) for n in _binds(stmt)}
    bound |= {n for stmt in _walk_statements(final) if isinstance(stmt, (ast.For, ast.AsyncFor))
              for n in _names(stmt.target)}  # fmt: skip
    reads = set().union(*(_reads(stmt) for stmt in final)) if final else set()
    plan.free = tuple(sorted(reads - bound - set(plan.captured)))
    # one pass of a loop around the step, so that its own ``continue`` / ``break`` still work
    once = ast.For(target=ast.Name(id="__nanscope_once__", ctx=ast.Store()),
                   iter=ast.Tuple(elts=[ast.Constant(0)], ctx=ast.Load()), body=final, orelse=[])
    module = ast.Module(body=[ast.copy_location(once, final[0])], type_ignores=[])
    ast.fix_missing_locations(module)
    plan.lines = sorted({s.lineno for s in _walk_statements(final)})
    plan.clips = any(_call_name(n) in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm")
                     for s in final for n in ast.walk(s))  # fmt: skip
    plan.code = compile(module, plan.file, "exec")


def _statement_at(body: list[ast.stmt], line: int) -> ast.stmt | None:
    for stmt in _walk_statements(body):
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno) and not _compound(stmt):
            return stmt
    return None


def _compound(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.With, ast.AsyncWith, ast.If, ast.For, ast.AsyncFor, ast.While,
                             ast.Try))  # fmt: skip


def _walk_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        for name in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(stmt, name, None)
            if isinstance(inner, list):
                out.extend(_walk_statements([s for s in inner if isinstance(s, ast.stmt)]))
            if name == "handlers" and isinstance(inner, list):
                for handler in inner:
                    out.extend(_walk_statements(handler.body))
    return out


def _step_receiver(stmt: ast.stmt) -> str | None:
    for node in ast.walk(stmt):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "step"):  # fmt: skip
            if node.args and isinstance(node.args[0], ast.Name):
                return node.args[0].id  # scaler.step(opt)
            return _dotted(node.func.value)
    return None


# ------------------------------------------------------------------------------ what to keep


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
    return None


def _essential(stmt: ast.stmt) -> bool:
    """A statement an update needs whatever it binds: a training call, a bare call of the
    user's own function (it may run the backward itself), or a hand-written update's in-place
    change (while such a loop is planned)."""
    if id(stmt) in _HAND_UPDATES.get():
        return True
    return _training_call(stmt)


def _training_call(stmt: ast.stmt) -> bool:
    if _compound(stmt):
        return False
    if _writes_grad(stmt):
        return True
    for node in ast.walk(stmt):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _TRAINING_METHODS:
            if func.attr == "step" and not _is_optimizer_step(func):
                continue
            return True
        if isinstance(func, ast.Attribute) and func.attr in _TRAINING_FUNCTIONS:
            return True
        if isinstance(func, ast.Name) and func.id in _TRAINING_FUNCTIONS:
            return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Name) and func.id not in _REPORTING and func.id not in (
            "len", "range", "sleep", "assert_"
        ):
            return True  # the user's own function: it may do the backward and the step
    return False


def _writes_grad(stmt: ast.stmt) -> bool:
    """``p.grad /= scale``, ``p.grad = g``, ``p.grad.div_(s)``: the gradient the step applies,
    changed by hand (a static loss scale undone, a gradient masked)."""
    if isinstance(stmt, ast.Assign):
        targets: list[ast.expr] = list(stmt.targets)
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        in_place = isinstance(func, ast.Attribute) and func.attr.endswith("_") \
            and not func.attr.startswith("_")  # fmt: skip
        targets = [func.value] if in_place and isinstance(func, ast.Attribute) else []
    else:
        return False
    return any(isinstance(n, ast.Attribute) and n.attr == "grad"
               for t in targets for n in ast.walk(t))  # fmt: skip


def _hand_updates(body: list[ast.stmt], under_no_grad: bool = False) -> list[ast.stmt]:
    """The statements of ``body`` that change a tensor in place the way a hand-written update
    does: under ``torch.no_grad()`` an augmented assignment (``w -= lr * w.grad``) or an in-place
    method (``p.sub_(...)``, ``p.copy_(...)``); anywhere, a write through ``.data``
    (``p.data.add_(...)``, ``w.data = ...``)."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            no_grad = under_no_grad or any(
                "no_grad" in (_dotted(i.context_expr.func if isinstance(i.context_expr, ast.Call)
                                      else i.context_expr) or "") for i in stmt.items)
            out.extend(_hand_updates(stmt.body, no_grad))
            continue
        if _compound(stmt):
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, name, None)
                if isinstance(inner, list):
                    out.extend(_hand_updates([s for s in inner if isinstance(s, ast.stmt)],
                                             under_no_grad))  # fmt: skip
            continue
        if _updates_in_place(stmt, under_no_grad):
            out.append(stmt)
    return out


def _updates_in_place(stmt: ast.stmt, under_no_grad: bool) -> bool:
    if isinstance(stmt, ast.AugAssign):
        return under_no_grad or _through_data(stmt.target)
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Attribute) and t.attr == "data" for t in stmt.targets)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and func.attr.endswith("_") \
                and not func.attr.startswith("_"):  # fmt: skip
            return under_no_grad or _through_data(func.value)
    return False


def _through_data(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "data" for n in ast.walk(node))


def _is_optimizer_step(func: ast.Attribute) -> bool:
    """``opt.step()`` or ``scaler.step(opt)``, not ``scheduler.step()`` / ``pbar.step()``."""
    name = (_dotted(func.value) or "").lower()
    return not any(word in name for word in ("sched", "lr_", "pbar", "bar", "progress", "timer",
                                              "writer", "profiler", "swa"))  # fmt: skip


def _draws(value: ast.expr) -> bool:
    for node in ast.walk(value):
        name = _call_name(node)
        if name is not None and (name in _DRAWING or name.startswith("get_batch")):
            return True
    return False


def _reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx,
                                                                                     ast.Load)}


def _binds(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.Assign):
        return {n for t in stmt.targets for n in _names(t)}
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        return set(_names(stmt.target))
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {stmt.name}  # a closure for LBFGS
    return set()


def _reporting(stmt: ast.stmt) -> bool:
    """An expression statement that only reports or stores (a print, ``losses.append``)."""
    if not isinstance(stmt, ast.Expr):
        return False
    name = _call_name(stmt.value)
    return name is None or name in _REPORTING or name.startswith(("log", "print", "save"))


def _keep(body: list[ast.stmt], step_line: int, captured: set[str],
          model_line: int | None = None, fed: set[str] | None = None,
          needed: set[str] | None = None) -> list[ast.stmt]:
    """The statements of ``body`` an update needs, up to the step() call (see the module doc);
    names only the model call at ``model_line`` reads are added to ``fed``, not needed.
    ``needed``: the names the statements after this body read (a block's body is kept for
    what follows the block too)."""
    needed = set(needed or ())
    kept: list[ast.stmt] = []
    fed = set() if fed is None else fed
    for stmt in reversed(body):
        if stmt.lineno > step_line:
            continue
        inner = _inner(stmt, step_line, captured, needed, model_line, fed)
        if inner is not None:
            kept.append(inner)
            needed |= _reads(_header(inner))
            for s in _walk_statements(_children(inner)):
                if not _compound(s):
                    needed |= _needs(s, model_line, fed)
                else:
                    needed |= _reads(_header(s))
            continue
        if _compound(stmt):
            continue
        if _essential(stmt):
            kept.append(stmt)
            needed |= _needs(stmt, model_line, fed)
            continue
        if _reporting(stmt):
            continue
        binds = _binds(stmt)
        if binds & needed:
            kept.append(stmt)
            if isinstance(stmt, ast.Assign):
                needed -= binds
            needed |= _needs(stmt, model_line, fed)
    kept.reverse()
    return kept


def _needs(stmt: ast.stmt, model_line: int | None, fed: set[str]) -> set[str]:
    """The names ``stmt`` reads, less those it only passes the model (at ``model_line``): the
    replay feeds the model what it got, so they are noted in ``fed`` instead."""
    reads = _reads(stmt)
    if model_line is None or not stmt.lineno <= model_line <= (stmt.end_lineno or stmt.lineno):
        return reads
    args: list[str] = []
    for node in ast.walk(stmt):
        if not (isinstance(node, ast.Call) and node.lineno == model_line):
            continue
        values = [*node.args, *(k.value for k in node.keywords)]
        # the model's call is a leaf (``crit(model(x), y)``: model(x), not crit) made on a name
        # or an attribute of one (``self.net``)
        if _dotted(node.func) is None or any(isinstance(n, ast.Call) for v in values
                                              for n in ast.walk(v)):  # fmt: skip
            continue
        args.extend(v.id for v in values if isinstance(v, ast.Name))
    counts: dict[str, int] = {}
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            counts[node.id] = counts.get(node.id, 0) + 1
    only = {a for a in args if counts.get(a) == args.count(a)}
    fed |= only
    return reads - only


def _header(stmt: ast.stmt) -> ast.AST:
    """What a compound statement evaluates itself (its test, its items, its iterable)."""
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return ast.Tuple(elts=[i.context_expr for i in stmt.items], ctx=ast.Load())
    if isinstance(stmt, (ast.If, ast.While)):
        return stmt.test
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return stmt.iter
    return ast.Tuple(elts=[], ctx=ast.Load())


def _children(stmt: ast.stmt) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for name in ("body", "orelse", "finalbody"):
        inner = getattr(stmt, name, None)
        if isinstance(inner, list):
            out.extend(s for s in inner if isinstance(s, ast.stmt))
    return out


def _inner(stmt: ast.stmt, step_line: int, captured: set[str], needed: set[str],
           model_line: int | None = None, fed: set[str] | None = None) -> ast.stmt | None:
    """A compound statement with its body cut down to what an update needs, or None when
    nothing in it is needed."""
    if not _compound(stmt) or isinstance(stmt, ast.While):
        return None
    if isinstance(stmt, ast.Try):
        body = _keep(stmt.body, step_line, captured, model_line, fed, needed)
        if not body:
            return None
        return ast.copy_location(ast.Try(body=body, handlers=stmt.handlers, orelse=[],
                                         finalbody=[]), stmt)  # fmt: skip
    body = _keep(getattr(stmt, "body", []), step_line, captured, model_line, fed, needed)
    loop_binds = _names(stmt.target) if isinstance(stmt, (ast.For, ast.AsyncFor)) else []
    useful = any(_essential(s) for s in _walk_statements(body)) or any(
        _binds(s) & needed for s in _walk_statements(body))
    if not body or not useful:
        return None
    if isinstance(stmt, (ast.With, ast.AsyncWith)) and not _computing(stmt):
        # a context that reports, times, catches or opens something (a progress bar, a
        # profiler, a test's pytest.raises): its body is the update, the context is not
        return ast.copy_location(ast.If(test=ast.Constant(True), body=body, orelse=[]), stmt)
    new = ast.copy_location(type(stmt)(**{f: getattr(stmt, f) for f in stmt._fields}), stmt)
    new.body = body  # type: ignore[attr-defined]
    if isinstance(stmt, ast.If):
        new.orelse = _keep(stmt.orelse, step_line, captured, model_line, fed,  # type: ignore[attr-defined]
                           needed)
    elif hasattr(new, "orelse"):
        new.orelse = []  # type: ignore[attr-defined]
    del loop_binds
    return new


#: contexts that change what the update computes: they are entered again in the replay
_COMPUTING = ("autocast", "no_grad", "enable_grad", "set_grad_enabled", "inference_mode",
              "ctx", "amp", "sdpa_kernel", "detect_anomaly", "nullcontext")  # fmt: skip


def _computing(stmt: ast.With | ast.AsyncWith) -> bool:
    """Every item of the ``with`` is a numerics context (autocast, no_grad, nanoGPT's ``ctx``)."""
    for item in stmt.items:
        expr = item.context_expr
        name = _dotted(expr.func if isinstance(expr, ast.Call) else expr) or ""
        if not any(word in name.lower() for word in _COMPUTING):
            return False
    return True


def _drop_rebinds(body: list[ast.stmt], captured: set[str], out: list[ast.stmt],
                  skipped: list[int]) -> None:  # fmt: skip
    """Copy ``body`` into ``out`` without the plain assignments that only bind captured names
    (their kept values already went through them) or that draw a new batch."""
    for stmt in body:
        if isinstance(stmt, ast.Assign) and (_binds(stmt) <= captured or _draws(stmt.value)):
            skipped.append(stmt.lineno)
            continue
        if _compound(stmt):
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, name, None)
                if isinstance(inner, list) and inner:
                    new_inner: list[ast.stmt] = []
                    _drop_rebinds(inner, captured, new_inner, skipped)
                    setattr(stmt, name, new_inner or [ast.Pass()])
        out.append(stmt)
