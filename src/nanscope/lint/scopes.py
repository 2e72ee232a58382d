"""The scope walker: one walk over a module's AST that records what the rules ask about.

The walk records, for every node a rule subscribed to, the :class:`Site` it was found at (its scope,
the loops and comprehensions around it, whether it runs under ``no_grad``). It also records the
imports, every simple assignment per scope (so a rule can follow ``p = torch.sigmoid(z)`` from a
later ``torch.log(p)``), ``self.attr`` assignments per class, function return values, and a few
file-wide facts (which identifiers occur, which loops clear gradients). :class:`Records` holds what
was recorded and answers lookups on it (what a name was last assigned, what a call's name is);
:class:`ScopeWalker` is the walk that fills it. What kind of value an expression holds is
:mod:`nanscope.lint.inference`'s job, on top of this.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from nanscope.lint.vocabulary import (
    DEFAULT_ROOTS,
    FRAMEWORKS,
    INPLACE_METHODS,
    INTERESTING_STRINGS,
    REBINDING_METHODS,
    SELECTIONS,
    ZERO_GRAD_ATTRS,
)

__all__ = [
    "MAX_DEPTH",
    "Entry",
    "NestingTooDeep",
    "Scope",
    "ScopeWalker",
    "Site",
    "catches_arithmetic",
    "inplace_root",
    "is_none",
    "is_number",
    "keyword",
    "qualified_name",
    "ref_key",
    "same_expr",
]


def is_number(node: ast.AST, value: float | None = None) -> bool:
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node, sign = node.operand, -1
    if not isinstance(node, ast.Constant):
        return False
    v = node.value
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (value is None or sign * v == value)
    )


def same_expr(a: ast.AST, b: ast.AST) -> bool:
    """Structural equality of two small expressions (names, attributes, subscripts)."""
    ta = type(a)
    if ta is not type(b):
        return False
    if ta is ast.Name:
        return a.id == b.id  # type: ignore[attr-defined,no-any-return]
    if ta is ast.Attribute:
        return a.attr == b.attr and same_expr(a.value, b.value)  # type: ignore[attr-defined]
    if ta is ast.Subscript:
        return same_expr(a.value, b.value) and ast.dump(a.slice) == ast.dump(b.slice)  # type: ignore[attr-defined]
    return ast.dump(a) == ast.dump(b)


def ref_key(expr: ast.AST) -> str | None:
    """A name for a storage location: ``buf``, ``self.v``, ``state["buf"]`` (``.data`` dropped)."""
    t = type(expr)
    if t is ast.Name:
        return expr.id  # type: ignore[attr-defined,no-any-return]
    if t is ast.Attribute:
        base = ref_key(expr.value)  # type: ignore[attr-defined]
        if base is None:
            return None
        attr: str = expr.attr  # type: ignore[attr-defined]
        return base if attr == "data" else f"{base}.{attr}"
    if t is ast.Subscript:
        key = expr.slice  # type: ignore[attr-defined]
        base = ref_key(expr.value)  # type: ignore[attr-defined]
        if base is None or not isinstance(key, ast.Constant):
            return None
        return f"{base}[{key.value!r}]"
    return None


def inplace_root(call: ast.Call) -> ast.expr | None:
    """The object an in-place update call (or a chain of them) modifies, else None."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in INPLACE_METHODS):
        return None
    recv = func.value
    while (
        isinstance(recv, ast.Call)
        and isinstance(recv.func, ast.Attribute)
        and recv.func.attr in INPLACE_METHODS
    ):
        recv = recv.func.value
    return recv


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


#: the deepest syntax tree walked (the rules recurse as deep as the tree)
MAX_DEPTH = 1000


class NestingTooDeep(Exception):
    """Raised by the walk for a syntax tree nested more than :data:`MAX_DEPTH` levels deep."""


class Scope:
    """A module, class or function body: its simple assignments and what it defines."""

    __slots__ = (
        "assigns",
        "attrs",
        "bases",
        "called",
        "classes",
        "cls",
        "defaults",
        "functions",
        "guarded",
        "inplace",
        "kind",
        "name",
        "node",
        "params",
        "parent",
        "returns",
        "selections",
        "tests",
    )

    def __init__(self, kind: str, name: str, parent: Scope | None, node: ast.AST | None) -> None:
        self.kind = kind
        self.name = name
        self.parent = parent
        self.node = node
        #: for a method: the class scope it belongs to (``self.x`` lookups)
        self.cls: Scope | None = None
        #: name -> [(end position, value or None, scope the value is evaluated in)]
        self.assigns: dict[str, list[tuple[tuple[int, int], ast.expr | None, Scope]]] = {}
        #: for a class: ``self.attr`` -> the same kind of entries
        self.attrs: dict[str, list[tuple[tuple[int, int], ast.expr | None, Scope]]] = {}
        #: names assigned through a subscript (``s[s == 0] = 1``): treated as guarded
        self.guarded: set[str] = set()
        #: ``ref_key`` of a receiver -> the in-place update calls made on it, in source order
        #: (``buf.mul_(m).add_(g)`` records both calls under ``"buf"``)
        self.inplace: dict[str, list[ast.Call]] = {}
        self.functions: dict[str, Scope] = {}
        self.classes: dict[str, Scope] = {}
        self.returns: list[ast.expr] = []
        #: for a function: its parameter names in order (``self`` included) and their defaults
        self.params: list[str] = []
        self.defaults: dict[str, ast.expr] = {}
        #: every test made in this body (``if``, ``while``, ``assert``, conditional expressions,
        #: comprehension filters, ``where`` conditions) and every comparison, wherever it stands
        self.tests: list[ast.expr] = []
        #: the last names of the functions called in this body
        self.called: set[str] = set()
        #: the ``where(cond, a, b)`` calls of this body
        self.selections: list[ast.Call] = []
        #: for a class: the last names of its bases (``Module``, ``Dataset``, ``_Loss``)
        self.bases: list[str] = []


class Site(NamedTuple):
    """Where a node was found.

    ``guards`` are the tests known to hold (or to have failed) on the path to the node: the
    enclosing ``if`` / ``while`` / conditional-expression tests, a ``where(cond, ...)`` condition
    around a branch, the earlier operands of an ``and`` / ``or``, a comprehension's ``if``, an
    earlier ``assert``, an earlier ``if ...: return/raise/break/continue`` or ``if ...: x = ...``
    of the same block, and ``try`` bodies whose handler catches an arithmetic error (recorded as
    the handler's type). Which way a test went is not kept: a test of a value is taken as that
    value being looked after.
    """

    scope: Scope
    loops: tuple[ast.AST, ...]
    comps: tuple[ast.comprehension, ...]
    no_grad: bool
    guards: tuple[ast.expr, ...] = ()
    #: the name the enclosing statement assigns (``loss = ...`` gives ``loss``), ``return`` for a
    #: return statement, else empty
    sink: str = ""


Entry = tuple[tuple[int, int], "ast.expr | None", Scope]


class Records:
    """What one walk over a module records, and the lookups on it: the module's scopes (their
    assignments, functions and classes), its imports, identifiers and calls, its loops and what
    clears gradients in them. :class:`ScopeWalker` fills it."""

    def __init__(self, tree: ast.Module) -> None:
        self.imports: dict[str, str] = {}
        self.idents: set[str] = set()
        self.strings: set[str] = set()
        self.sites: list[tuple[ast.AST, Site]] = []
        self.zero_loops: set[int] = set()
        self.zero_funcs: set[str] = set()
        self.loop_calls: dict[int, set[str]] = {}
        #: id of a loop -> the loop node
        self.loop_nodes: dict[int, ast.AST] = {}
        self.module = Scope("module", "<module>", None, tree)
        #: the last name of every called function -> the calls, with the site they are made at
        self.calls: dict[str, list[tuple[ast.Call, Site]]] = {}
        self._parts: dict[int, tuple[str | None, str | None, ast.expr | None]] = {}

    # ------------------------------------------------------------------ file-wide facts
    # (recorded from the node alone, whatever scope it stands in)

    def _v_import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.imports[alias.asname] = alias.name
            else:
                root = alias.name.split(".")[0]
                self.imports[root] = root
            self.idents.add(alias.name.rsplit(".", 1)[-1])

    def _v_importfrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        for alias in node.names:
            self.imports[alias.asname or alias.name] = f"{mod}.{alias.name}" if mod else alias.name
            self.idents.add(alias.name)

    def _v_name(self, node: ast.Name) -> None:
        self.idents.add(node.id)

    def _v_constant(self, node: ast.Constant) -> None:
        if type(node.value) is str and node.value in INTERESTING_STRINGS:
            self.strings.add(node.value)

    # ------------------------------------------------------------------ names

    def qualname(self, expr: ast.AST) -> str | None:
        """The dotted name an expression refers to when it is rooted at an import, else None."""
        if isinstance(expr, ast.Name):
            full = self.imports.get(expr.id)
            if full is None and expr.id not in self.module.assigns:
                full = DEFAULT_ROOTS.get(expr.id)
            return full
        if isinstance(expr, ast.Attribute):
            base = self.qualname(expr.value)
            return f"{base}.{expr.attr}" if base else None
        return None

    def func_parts(self, call: ast.Call) -> tuple[str | None, str | None, ast.expr | None]:
        """``(root, last, receiver)`` of a call.

        ``root`` is the top-level package (``torch``, ``numpy``...) when the function comes from an
        import, ``last`` its final name, ``receiver`` the object for a method call.
        """
        key = id(call)
        got = self._parts.get(key)
        if got is None:
            got = self._parts[key] = self._func_parts(call)
        return got

    def _func_parts(self, call: ast.Call) -> tuple[str | None, str | None, ast.expr | None]:
        func = call.func
        if isinstance(func, ast.Attribute):
            base = self.qualname(func.value)
            if base is not None:
                return base.split(".", 1)[0], func.attr, None
            return None, func.attr, func.value
        if isinstance(func, ast.Name):
            full = self.imports.get(func.id)
            if full is not None:
                return full.split(".", 1)[0], full.rsplit(".", 1)[-1], None
            return None, func.id, None
        return None, None, None

    def loop_nodes_calling(self, name: str) -> list[tuple[ast.AST, set[str]]]:
        """The loops that call the function or method ``name``, with what each calls."""
        return [
            (self.loop_nodes[key], called)
            for key, called in self.loop_calls.items()
            if name in called and key in self.loop_nodes
        ]

    def is_framework_call(self, call: ast.Call, names: frozenset[str] | set[str]) -> bool:
        """A call of ``names`` from a framework (``torch.log``) or as a method (``p.log()``)."""
        root, last, recv = self.func_parts(call)
        if last not in names:
            return False
        return recv is not None or root in FRAMEWORKS

    def lookup(
        self,
        name: str,
        scope: Scope,
        pos: tuple[int, int],
        comps: tuple[ast.comprehension, ...] = (),
    ) -> Entry | ast.comprehension | None:
        for comp in reversed(comps):
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(comp.target)):
                return comp
        for s in _visible_scopes(scope):
            entries = s.assigns.get(name)
            if entries:
                if s is scope:
                    before = [e for e in entries if e[0] <= pos]
                    return before[-1] if before else None
                return entries[-1]
        return None

    def inplace_updates(self, key: str, scope: Scope) -> list[ast.Call]:
        """The in-place update calls on ``key`` in the nearest scope (outwards) that has any."""
        for s in _visible_scopes(scope):
            calls = s.inplace.get(key)
            if calls:
                return calls
        return []

    def is_guarded(self, name: str, scope: Scope) -> bool:
        s: Scope | None = scope
        while s is not None:
            if name in s.guarded:
                return True
            s = s.parent
        return False

    def self_attr(self, attr: str, scope: Scope) -> Entry | None:
        if scope.cls is None:
            return None
        entries = scope.cls.attrs.get(attr)
        return entries[-1] if entries else None

    def value_of(
        self, expr: ast.expr, scope: Scope, comps: tuple[ast.comprehension, ...] = ()
    ) -> tuple[ast.expr, Scope]:
        """Follow simple aliases: the expression a name (or ``self.attr``) was last assigned."""
        seen = 0
        while seen < 8:
            seen += 1
            entry: Entry | ast.comprehension | None = None
            if isinstance(expr, ast.Name):
                entry = self.lookup(expr.id, scope, (expr.lineno, expr.col_offset), comps)
            elif (
                isinstance(expr, ast.Attribute)
                and isinstance(expr.value, ast.Name)
                and expr.value.id == "self"
            ):
                entry = self.self_attr(expr.attr, scope)
            if not isinstance(entry, tuple) or entry[1] is None:
                return expr, scope
            expr, scope, comps = entry[1], entry[2], ()
        return expr, scope


class ScopeWalker(Records):
    """The walk over a parsed module that fills the :class:`Records`; it runs in ``__init__``."""

    def __init__(self, tree: ast.Module, wanted: frozenset[type[ast.AST]]) -> None:
        super().__init__(tree)
        self._wanted = wanted
        self._scope = self.module
        self._loops: tuple[ast.AST, ...] = ()
        self._comps: tuple[ast.comprehension, ...] = ()
        self._no_grad = False
        self._func_names: tuple[str, ...] = ()
        self._guards: tuple[ast.expr, ...] = ()
        self._sink = ""
        self._site = Site(self.module, (), (), False)
        self._level = 0
        self._walk(tree)

    # ------------------------------------------------------------------ the walk

    def _set(self) -> None:
        self._site = Site(
            self._scope, self._loops, self._comps, self._no_grad, self._guards, self._sink
        )

    def _test(self, test: ast.expr) -> tuple[ast.expr, ...]:
        self._scope.tests.append(test)
        return (*self._guards, test)

    def _block(self, stmts: list[ast.stmt]) -> None:
        """Walk a statement list; the guards its early exits add end with it."""
        saved = self._guards
        for stmt in stmts:
            self._walk(stmt)
        if self._guards is not saved:
            self._guards = saved
            self._set()

    def _guarded(self, tests: tuple[ast.expr, ...], node: ast.AST) -> None:
        """Walk ``node`` with ``tests`` added to the guards."""
        saved = self._guards
        self._guards = saved + tests
        self._set()
        self._walk(node)
        self._guards = saved
        self._set()

    def _walk(self, node: ast.AST) -> None:
        self._level += 1
        if self._level > MAX_DEPTH:
            raise NestingTooDeep(f"the syntax tree is nested more than {MAX_DEPTH} levels deep")
        t = type(node)
        if t in self._wanted:
            self.sites.append((node, self._site))
        handler: Callable[[ScopeWalker, ast.AST], None] | None = _HANDLERS.get(t)
        if handler is not None:
            handler(self, node)
        else:
            for child in ast.iter_child_nodes(node):
                self._walk(child)
        self._level -= 1

    def _children(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self._walk(child)

    def _bind(self, target: ast.AST, value: ast.expr | None, end: tuple[int, int]) -> None:
        scope = self._scope
        t = type(target)
        if t is ast.Name:
            scope.assigns.setdefault(target.id, []).append((end, value, scope))  # type: ignore[attr-defined]
        elif t in (ast.Tuple, ast.List):
            elts = target.elts  # type: ignore[attr-defined]
            vals = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            for i, elt in enumerate(elts):
                self._bind(
                    elt, vals[i] if vals is not None and len(vals) == len(elts) else None, end
                )
        elif t is ast.Starred:
            self._bind(target.value, None, end)  # type: ignore[attr-defined]
        elif t is ast.Attribute:
            base = target.value  # type: ignore[attr-defined]
            if isinstance(base, ast.Name) and base.id == "self" and scope.cls is not None:
                scope.cls.attrs.setdefault(target.attr, []).append((end, value, scope))  # type: ignore[attr-defined]
            if target.attr == "grad":  # type: ignore[attr-defined]
                self._mark_zero()
        elif t is ast.Subscript:
            base = target.value  # type: ignore[attr-defined]
            if isinstance(base, ast.Name):
                scope.guarded.add(base.id)

    def _mark_zero(self) -> None:
        for loop in self._loops:
            self.zero_loops.add(id(loop))
        self.zero_funcs.update(self._func_names)

    def _v_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        outer = self._scope
        no_grad = self._no_grad
        if not isinstance(node, ast.Lambda):
            for dec in node.decorator_list:
                self._walk(dec)
                if _is_no_grad(dec):
                    no_grad = True
            if node.returns is not None:
                self._walk(node.returns)
        args = node.args
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self._walk(default)
        name = getattr(node, "name", "<lambda>")
        scope = Scope("function", name, outer, node)
        if outer.kind == "class":
            scope.cls = outer
        elif outer.kind == "function" and outer.cls is not None:
            scope.cls = outer.cls
        if not isinstance(node, ast.Lambda):
            outer.functions[name] = scope
        pos = (node.lineno, node.col_offset)
        positional = [*args.posonlyargs, *args.args]
        for arg in [*positional, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                scope.assigns.setdefault(arg.arg, []).append((pos, None, scope))
        scope.params = [a.arg for a in positional]
        for arg, default in zip(positional[len(positional) - len(args.defaults) :], args.defaults):
            scope.defaults[arg.arg] = default
        for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults):
            if kw_default is not None:
                scope.defaults[arg.arg] = kw_default
        saved = (self._scope, self._loops, self._comps, self._no_grad, self._func_names)
        saved_guards = self._guards
        self._scope, self._loops, self._comps, self._guards = scope, (), (), ()
        self._no_grad = no_grad
        # a method is known by its class too: two classes' `_step` are different helpers
        self._func_names = (*self._func_names, qualified_name(scope))
        self._set()
        if isinstance(node, ast.Lambda):
            scope.returns.append(node.body)
            self._walk(node.body)
        else:
            self._block(node.body)
        self._scope, self._loops, self._comps, self._no_grad, self._func_names = saved
        self._guards = saved_guards
        self._set()

    def _v_class(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self._walk(expr)
        outer = self._scope
        scope = Scope("class", node.name, outer, node)
        scope.bases = [
            b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases
        ]
        outer.classes[node.name] = scope
        saved = self._scope, self._loops, self._guards
        self._scope, self._loops, self._guards = scope, (), ()
        self._set()
        self._block(node.body)
        self._scope, self._loops, self._guards = saved
        self._set()

    def _v_loop(self, node: ast.For | ast.AsyncFor | ast.While) -> None:
        if isinstance(node, ast.While):
            self._walk(node.test)
        else:
            self._walk(node.iter)
            self._bind(node.target, None, (node.lineno, node.col_offset))
            self._walk(node.target)
        saved, saved_guards = self._loops, self._guards
        self._loops = (*saved, node)
        if isinstance(node, ast.While) and not _is_constant_true(node.test):
            self._guards = self._test(node.test)
        self._set()
        self._block(node.body)
        self._loops, self._guards = saved, saved_guards
        self._set()
        self._block(node.orelse)

    def _v_with(self, node: ast.With | ast.AsyncWith) -> None:
        no_grad = False
        for item in node.items:
            self._walk(item.context_expr)
            if _is_no_grad(item.context_expr):
                no_grad = True
            if item.optional_vars is not None:
                self._bind(item.optional_vars, None, (node.lineno, node.col_offset))
        saved = self._no_grad
        self._no_grad = saved or no_grad
        self._set()
        self._block(node.body)
        self._no_grad = saved
        self._set()

    def _v_if(self, node: ast.If) -> None:
        self._walk(node.test)
        saved = self._guards
        self._guards = self._test(node.test)
        self._set()
        self._block(node.body)
        self._block(node.orelse)
        self._guards = saved
        # `if not ok: return` / `if s == 0: s = 1`: what follows in the block is looked after
        if (
            _terminates(node.body)
            or (node.orelse and _terminates(node.orelse))
            or _patches(node.body, node.test)
        ):
            self._guards = (*saved, node.test)
        self._set()

    def _v_compare(self, node: ast.Compare) -> None:
        self._scope.tests.append(node)
        self._children(node)

    def _v_assert(self, node: ast.Assert) -> None:
        self._children(node)
        self._guards = self._test(node.test)
        self._set()

    def _v_ifexp(self, node: ast.IfExp) -> None:
        self._walk(node.test)
        self._scope.tests.append(node.test)
        self._guarded((node.test,), node.body)
        self._guarded((node.test,), node.orelse)

    def _v_boolop(self, node: ast.BoolOp) -> None:
        before: tuple[ast.expr, ...] = ()
        self._scope.tests.extend(node.values[:-1])
        for value in node.values:
            if before:
                self._guarded(before, value)
            else:
                self._walk(value)
            before = (*before, value)

    def _v_try(self, node: ast.Try) -> None:
        caught = tuple(
            h.type for h in node.handlers if h.type is not None and catches_arithmetic(h.type)
        )
        saved = self._guards
        self._guards = saved + caught
        self._set()
        self._block(node.body)
        self._guards = saved
        self._set()
        for handler in node.handlers:
            if handler.type is not None:
                self._walk(handler.type)
            if handler.name:
                self._bind(ast.Name(id=handler.name), None, (handler.lineno, handler.col_offset))
            self._block(handler.body)
        self._block(node.orelse)
        self._block(node.finalbody)

    def _sunk(self, name: str, node: ast.AST) -> None:
        """Walk ``node`` knowing the statement stores its value in ``name``."""
        saved = self._sink
        self._sink = name
        self._set()
        self._walk(node)
        self._sink = saved
        self._set()

    def _v_assign(self, node: ast.Assign) -> None:
        self._sunk(_target_name(node.targets[0]), node.value)
        end = (node.end_lineno or node.lineno, node.end_col_offset or 0)
        value = node.value if len(node.targets) == 1 else None
        for target in node.targets:
            self._bind(target, value, end)
            self._walk(target)

    def _v_annassign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._sunk(_target_name(node.target), node.value)
            self._bind(node.target, node.value, (node.end_lineno or node.lineno, 0))
        self._walk(node.target)

    def _v_augassign(self, node: ast.AugAssign) -> None:
        self._sunk(_target_name(node.target), node.value)
        self._walk(node.target)
        target = node.target
        if isinstance(target, (ast.Name, ast.Attribute)):
            if isinstance(target, ast.Name):
                left: ast.expr = ast.Name(id=target.id, ctx=ast.Load())
            else:
                left = ast.Attribute(value=target.value, attr=target.attr, ctx=ast.Load())
            ast.copy_location(left, node)
            left.end_lineno, left.end_col_offset = node.lineno, node.col_offset
            synthetic = ast.BinOp(left=left, op=node.op, right=node.value)
            ast.copy_location(synthetic, node)
            self._bind(
                target, synthetic, (node.end_lineno or node.lineno, node.end_col_offset or 0)
            )
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            self._scope.guarded.add(target.value.id)

    def _v_namedexpr(self, node: ast.NamedExpr) -> None:
        self._walk(node.value)
        self._bind(
            node.target, node.value, (node.end_lineno or node.lineno, node.end_col_offset or 0)
        )

    def _v_return(self, node: ast.Return) -> None:
        if node.value is not None:
            self._scope.returns.append(node.value)
            self._sunk("return", node.value)

    def _v_comp(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        gens = node.generators
        if gens:
            self._walk(gens[0].iter)
        saved, saved_guards = self._comps, self._guards
        for i, gen in enumerate(gens):
            if i:
                self._walk(gen.iter)
            self._comps = (*self._comps, gen)
            self._set()
            self._walk(gen.target)
            for cond in gen.ifs:
                self._walk(cond)
                self._guards = self._test(cond)
                self._set()
        if isinstance(node, ast.DictComp):
            self._walk(node.key)
            self._walk(node.value)
        else:
            self._walk(node.elt)
        self._comps, self._guards = saved, saved_guards
        self._set()

    def _v_attribute(self, node: ast.Attribute) -> None:
        self.idents.add(node.attr)
        self._walk(node.value)

    def _v_keyword(self, node: ast.keyword) -> None:
        if node.arg:
            self.idents.add(node.arg)
        self._walk(node.value)

    def _v_call(self, node: ast.Call) -> None:
        func = node.func
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if last is not None:
            self.calls.setdefault(last, []).append((node, self._site))
            self._scope.called.add(last)
        if self._loops:
            name = None
            if isinstance(func, ast.Name):
                name = func.id
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                cls = self._scope.cls
                if func.value.id == "self" and cls is not None:
                    name = f"{cls.name}.{func.attr}"
            if name is not None:
                for loop in self._loops:
                    self.loop_calls.setdefault(id(loop), set()).add(name)
                    self.loop_nodes[id(loop)] = loop
        if isinstance(func, ast.Attribute):
            attr = func.attr
            if attr in INPLACE_METHODS:
                root = inplace_root(node)
                key = ref_key(root) if root is not None else None
                if key is not None:
                    self._scope.inplace.setdefault(key, []).append(node)
            if attr in ZERO_GRAD_ATTRS or (
                attr in ("zero_", "fill_", "detach_") and _mentions_grad(func.value)
            ):
                self._mark_zero()
            if attr in REBINDING_METHODS and isinstance(func.value, (ast.Name, ast.Attribute)):
                # `x.sigmoid_()` / `x.clamp_(min=eps)`: from here on `x` holds what the call made
                self._children(node)
                end = (node.end_lineno or node.lineno, node.end_col_offset or 0)
                self._bind(func.value, node, end)
                return
        if last in SELECTIONS and len(node.args) >= 2 and self.func_parts(node)[0] in FRAMEWORKS:
            # where(cond, a, b): each branch is evaluated knowing the condition
            self._walk(func)
            self._walk(node.args[0])
            self._scope.tests.append(node.args[0])
            self._scope.selections.append(node)
            for arg in node.args[1:]:
                self._guarded((node.args[0],), arg)
            for kw in node.keywords:
                self._walk(kw)
            return
        self._children(node)

    def _v_delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "grad":
                self._mark_zero()
        self._children(node)


def _visible_scopes(scope: Scope) -> Iterator[Scope]:
    """``scope`` and the scopes around it whose names it sees, innermost first (a class body's
    names are not seen from its methods)."""
    s: Scope | None = scope
    while s is not None:
        if s.kind != "class" or s is scope:
            yield s
        s = s.parent


def qualified_name(scope: Scope) -> str:
    """``Trainer._step`` for a method, ``train`` for a function."""
    parent = scope.parent
    if parent is not None and parent.kind == "class":
        return f"{parent.name}.{scope.name}"
    return scope.name


def is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_no_grad(expr: ast.AST) -> bool:
    target = expr.func if isinstance(expr, ast.Call) else expr
    return isinstance(target, (ast.Attribute, ast.Name)) and (
        getattr(target, "attr", None) or getattr(target, "id", None)
    ) in ("no_grad", "inference_mode")


def _target_name(target: ast.expr) -> str:
    """``loss`` for ``loss = ...``, ``self.loss = ...``, ``losses["ce"] = ...``."""
    while isinstance(target, ast.Subscript):
        target = target.value
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, (ast.Tuple, ast.List)) and target.elts:
        return _target_name(target.elts[0])
    return ""


def _is_constant_true(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and bool(expr.value)


_EXITS = (ast.Return, ast.Raise, ast.Break, ast.Continue)


def _terminates(stmts: list[ast.stmt]) -> bool:
    """Whether a block always leaves (its last statement returns, raises, breaks or continues,
    or calls ``sys.exit`` / ``exit``)."""
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, _EXITS):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        func = last.value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in ("exit", "_exit", "abort")
    if isinstance(last, ast.If):
        return _terminates(last.body) and bool(last.orelse) and _terminates(last.orelse)
    return False


def _patches(body: list[ast.stmt], test: ast.expr) -> bool:
    """``if s == 0: s = 1``: the block reassigns a name its test looks at."""
    tested = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    for stmt in body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
            targets = [stmt.target]
        for target in targets:
            if isinstance(target, ast.Name) and target.id in tested:
                return True
    return False


_ARITHMETIC_ERRORS = frozenset({"ZeroDivisionError", "ArithmeticError", "FloatingPointError"})


def catches_arithmetic(handler_type: ast.expr) -> bool:
    """An ``except`` clause's type (a name, or a tuple of them) that catches division by zero;
    the walk records such a type as a guard of its ``try`` body."""
    names = handler_type.elts if isinstance(handler_type, ast.Tuple) else [handler_type]
    for name in names:
        ident = name.attr if isinstance(name, ast.Attribute) else getattr(name, "id", "")
        if ident in _ARITHMETIC_ERRORS:
            return True
    return False


def _mentions_grad(expr: ast.AST) -> bool:
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if isinstance(expr, ast.Attribute) and expr.attr == "grad":
            return True
        expr = expr.value
    return False


_HANDLERS: dict[type[ast.AST], Any] = {
    ast.FunctionDef: ScopeWalker._v_function,
    ast.AsyncFunctionDef: ScopeWalker._v_function,
    ast.Lambda: ScopeWalker._v_function,
    ast.ClassDef: ScopeWalker._v_class,
    ast.For: ScopeWalker._v_loop,
    ast.AsyncFor: ScopeWalker._v_loop,
    ast.While: ScopeWalker._v_loop,
    ast.With: ScopeWalker._v_with,
    ast.AsyncWith: ScopeWalker._v_with,
    ast.Assign: ScopeWalker._v_assign,
    ast.AnnAssign: ScopeWalker._v_annassign,
    ast.AugAssign: ScopeWalker._v_augassign,
    ast.NamedExpr: ScopeWalker._v_namedexpr,
    ast.Return: ScopeWalker._v_return,
    ast.ListComp: ScopeWalker._v_comp,
    ast.SetComp: ScopeWalker._v_comp,
    ast.GeneratorExp: ScopeWalker._v_comp,
    ast.DictComp: ScopeWalker._v_comp,
    ast.Import: Records._v_import,
    ast.ImportFrom: Records._v_importfrom,
    ast.Name: Records._v_name,
    ast.Attribute: ScopeWalker._v_attribute,
    ast.keyword: ScopeWalker._v_keyword,
    ast.Constant: Records._v_constant,
    ast.Call: ScopeWalker._v_call,
    ast.Delete: ScopeWalker._v_delete,
    ast.If: ScopeWalker._v_if,
    ast.Compare: ScopeWalker._v_compare,
    ast.Assert: ScopeWalker._v_assert,
    ast.IfExp: ScopeWalker._v_ifexp,
    ast.BoolOp: ScopeWalker._v_boolop,
    ast.Try: ScopeWalker._v_try,
}
