"""Type inference for the lint rules: what kind of value an expression holds.

:meth:`FileContext.kind` is a tiny abstract interpreter on top of the scope walker
(:mod:`nanscope.lint.scopes`): it maps an expression to the :class:`~nanscope.lint.vocabulary.K`
bit flags saying what kind of value it is (a probability, an unbounded linear output, a norm, a
loss, something clamped...), following assignments, calls and returns. Rules are built on these
flags, not on spellings. What a call returns is read by :class:`~nanscope.lint.calls.CallKinds`,
whether a test or an epsilon looks after a value by :class:`~nanscope.lint.guards.Guards`; both
hang off the context (``ctx.call_kinds``, ``ctx.guards``).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from nanscope.lint.calls import CallKinds, sqrt_kind
from nanscope.lint.guards import Guards
from nanscope.lint.scopes import (
    Scope,
    ScopeWalker,
    Site,
    is_number,
    keyword,
    same_expr,
)
from nanscope.lint.vocabulary import (
    LOGIT_NAME,
    PROB_NAME,
    K,
    name_kind,
)

if TYPE_CHECKING:
    from nanscope.lint.project import Project

__all__ = ["FileContext"]

#: what a parameter takes from the arguments its function is called with
_PARAM_BITS = (
    K.PROBS | K.SAFE | K.LINEAR | K.NORM | K.STD | K.SUM | K.EXP | K.SUMEXP | K.VAR | K.MAX
    | K.SUMSQ | K.SQUARE | K.MODEL | K.OPTIM | K.FN_PROB | K.FN_SIGMOID | K.FN_SOFTMAX
    | K.FN_LINEAR | K.FN_LOSS | K.FN_BCE | K.FN_BCE_TF | K.FN_MSE
)  # fmt: skip


class FileContext(ScopeWalker):
    """Everything known about one parsed module: the walk's records and the kinds of its values."""

    def __init__(
        self,
        tree: ast.Module,
        wanted: frozenset[type[ast.AST]],
        project: Project | None = None,
        path: str = "<string>",
    ) -> None:
        self._memo: dict[int, int] = {}
        self._active: set[int] = set()
        self._params: dict[tuple[int, str], int] = {}
        self._loads: dict[str, int] | None = None
        self.project = project
        self.path = path
        #: whether a test or an epsilon looks after a value (the rules ask it too)
        self.guards = Guards(self)
        #: what a call returns
        self.call_kinds = CallKinds(self)
        #: the source text, when the engine has it (the safe fixes quote it)
        self.source = ""
        super().__init__(tree, wanted)

    # ------------------------------------------------------------------ kinds

    def kind(
        self, expr: ast.AST | None, scope: Scope, comps: tuple[ast.comprehension, ...] = ()
    ) -> int:
        """The :class:`K` flags of an expression evaluated in ``scope``."""
        if expr is None:
            return 0
        key = id(expr)
        got = self._memo.get(key)
        if got is not None:
            return got
        if key in self._active or len(self._active) > 40:
            return 0
        self._active.add(key)
        try:
            result = self._kind(expr, scope, comps)
        finally:
            self._active.discard(key)
        self._memo[key] = result
        return result

    def _kind(self, e: ast.AST, scope: Scope, comps: tuple[ast.comprehension, ...]) -> int:
        t = type(e)
        if t is ast.Name:
            return self._kind_name(e, scope, comps)  # type: ignore[arg-type]
        if t is ast.Attribute:
            return self._kind_attr(e, scope)  # type: ignore[arg-type]
        if t is ast.Call:
            return self.call_kinds.kind(e, scope, comps)  # type: ignore[arg-type]
        if t is ast.BinOp:
            return self._kind_binop(e, scope, comps)  # type: ignore[arg-type]
        if t is ast.UnaryOp:
            if isinstance(e.op, (ast.USub, ast.UAdd)):  # type: ignore[attr-defined]
                inner = self.kind(e.operand, scope, comps)  # type: ignore[attr-defined]
                return inner & (K.ARITH | K.SAFE | K.CONST | K.MAX)
            return 0
        if t is ast.Subscript:
            assert isinstance(e, ast.Subscript)
            k = self.kind(e.value, scope, comps) & K.CARRY
            # n[n > 0], n[valid] with valid = n != 0: a boolean mask that looks at n
            if (
                k & K.RISK
                and not isinstance(e.slice, ast.Constant)
                and self.guards.value_keys(e.value, scope) & self.guards.tested_keys(e.slice, scope)
            ):
                k |= K.SAFE
            return k
        if t is ast.Constant:
            return K.CONST
        if t is ast.IfExp:
            return self.kind(e.body, scope, comps) | self.kind(e.orelse, scope, comps)  # type: ignore[attr-defined]
        if t is ast.NamedExpr:
            return self.kind(e.value, scope, comps)  # type: ignore[attr-defined]
        if t is ast.Starred:
            return self.kind(e.value, scope, comps)  # type: ignore[attr-defined]
        return 0

    def _kind_name(self, e: ast.Name, scope: Scope, comps: tuple[ast.comprehension, ...]) -> int:
        entry = self.lookup(e.id, scope, (e.lineno, e.col_offset), comps)
        k = 0
        if isinstance(entry, tuple) and entry[1] is not None:
            k = self.kind(entry[1], entry[2])
        elif isinstance(entry, tuple) and entry[2].kind == "function":
            k = self.param_kind(entry[2], e.id)
            if not k and e.id == "y_pred" and "y_true" in entry[2].params:
                k = K.PROB  # a Keras loss(y_true, y_pred): the model's predicted probability
        elif entry is None:
            cls = self.module.classes.get(e.id)
            if cls is not None:
                return K.MODEL
        if self.is_guarded(e.id, scope):
            # written through a subscript (`s[s == 0] = 1`, `X[:, 3] = 4.2`): patched, and no
            # longer a plain random draw
            k = (k | K.SAFE) & ~K.NONZERO
        k |= name_kind(e.id)
        if not k & (K.SAFE | K.LINEAR | K.EXP | K.CONST | K.MODEL | K.PROB | K.OPTIM):
            if PROB_NAME.match(e.id):
                k |= K.PROB
            elif LOGIT_NAME.match(e.id):
                k |= K.LINEAR
        return k

    def _kind_attr(self, e: ast.Attribute, scope: Scope) -> int:
        attr = e.attr
        if attr == "grad":
            return K.GRAD
        if attr in ("T", "mT", "data", "real", "H", "values"):
            return self.kind(e.value, scope) & (K.CARRY | K.MODEL)
        k = 0
        if isinstance(e.value, ast.Name) and e.value.id == "self":
            entry = self.self_attr(attr, scope)
            if entry is not None and entry[1] is not None:
                k = self.kind(entry[1], entry[2])
        k |= name_kind(attr)
        if not k and LOGIT_NAME.match(attr):
            k = K.LINEAR
        return k

    def loads(self, ref: ast.expr) -> int:
        """How many times the file reads a name (``criterion``) or an attribute of that name
        (``self.criterion``)."""
        if self._loads is None:
            counts: dict[str, int] = {}
            for node in ast.walk(self.module.node):  # type: ignore[arg-type]
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    counts[node.id] = counts.get(node.id, 0) + 1
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    counts["." + node.attr] = counts.get("." + node.attr, 0) + 1
            self._loads = counts
        if isinstance(ref, ast.Name):
            return self._loads.get(ref.id, 0)
        if isinstance(ref, ast.Attribute):
            return self._loads.get("." + ref.attr, 0)
        return 0

    def _kind_binop(self, e: ast.BinOp, scope: Scope, comps: tuple[ast.comprehension, ...]) -> int:
        op = type(e.op)
        if op is ast.Div and self.is_one(e.left, scope) and self.one_plus_exp(e.right, scope):
            return K.PROB | K.SIGMOID
        kl = self.kind(e.left, scope, comps)
        kr = self.kind(e.right, scope, comps)
        # built from constants on both sides (arange grids, literals): still no gradient
        const = K.CONST if kl & K.CONST and kr & K.CONST else 0
        return self._binop(e, op, kl, kr, scope) | const

    def _binop(self, e: ast.BinOp, op: type, kl: int, kr: int, scope: Scope) -> int:
        both = kl | kr
        if op is ast.Add:
            if kl & (K.SQUARE | K.SUMSQ) and kr & (K.SQUARE | K.SUMSQ):
                return K.SUMSQ | (both & (K.HALF | K.LOSS | K.GRAD))
            k = both & (K.ARITH | K.PROBS | K.SAFE | K.EXP | K.SUMEXP)
            if both & K.RISK:
                # `d + eps` is away from 0 only when eps is a positive constant: `x.sum() + y`
                # is still a sum that can be 0
                if self.guards.positive(e.left, scope) or self.guards.positive(e.right, scope):
                    k |= K.SAFE
                else:
                    k |= both & (K.RISK & ~K.SQUARE)
            return k
        if op is ast.Sub:
            if kr & K.MAX:
                return K.SAFE | (kl & (K.HALF | K.LOSS | K.GRAD))
            if self.is_one(e.left, scope):
                return kr & (K.PROBS | K.SAFE | K.ARITH)
            # a union `a.sum() + b.sum() - inter` is still a sum that can be 0
            return both & (K.ARITH | (kl & (K.SAFE | K.SUM)))
        if op is ast.Mult:
            if same_expr(e.left, e.right):
                return K.SQUARE | (kl & (K.HALF | K.LOSS | K.GRAD))
            k = both & K.ARITH
            if kl & K.PROBS and kr & K.PROBS:
                k |= K.PROB  # a product of probabilities is one (and can be 0)
            risky = ((0 if kl & K.SAFE else kl) | (0 if kr & K.SAFE else kr)) & K.ZERO
            return k | risky
        if op is ast.Div:
            if kl & K.EXP and kr & K.SUMEXP:
                return K.PROB | K.SOFTMAX
            return kl & (K.ARITH | K.ZERO)
        if op is ast.MatMult:
            return K.LINEAR | (both & K.HALF)
        if op is ast.Pow:
            if is_number(e.right, 2):
                return K.SQUARE | (kl & (K.HALF | K.LOSS | K.GRAD))
            if is_number(e.right, 0.5) and (root := sqrt_kind(kl)):
                return root
            return kl & (K.HALF | K.LOSS)
        return 0

    def is_one(self, expr: ast.expr, scope: Scope) -> bool:
        """A literal, ``np.float32(1.0)`` / ``torch.tensor(1.0)``, or a name bound to one."""
        if isinstance(expr, ast.Name):
            expr, _ = self.value_of(expr, scope)
        if is_number(expr):
            return True
        return (
            isinstance(expr, ast.Call)
            and len(expr.args) == 1
            and is_number(expr.args[0])
            and self.func_parts(expr)[1]
            in ("float32", "float64", "float16", "float", "tensor", "array", "asarray")
        )

    def one_plus_exp(self, expr: ast.AST, scope: Scope | None = None) -> ast.Call | None:
        """The exp call in ``1 + exp(...)`` (either order), else None."""
        if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add)):
            return None
        for a, b in ((expr.left, expr.right), (expr.right, expr.left)):
            if (
                self.is_one(a, scope or self.module)
                and isinstance(b, ast.Call)
                and self.is_framework_call(b, frozenset({"exp"}))
            ):
                return b
        return None


    # ------------------------------------------------------------------ values in and out of calls

    def param_kind(self, fscope: Scope, name: str) -> int:
        """What a parameter holds, from the arguments the function is called with in this file.

        A method's callers are ``self.name(...)`` calls in the methods of its class, a function's
        the calls of its name. When one caller passes a hazard (an unclamped probability, a norm)
        the parameter holds it on that path; it is safe only when every caller passes a safe
        value. With no caller, a default value (``eps=1e-8``) is what it holds.
        """
        key = (id(fscope), name)
        got = self._params.get(key)
        if got is not None:
            return got
        self._params[key] = 0
        kinds = [
            self.kind(arg, site.scope, site.comps)
            | (K.SAFE if self.guards.looked_after(arg, site) else 0)
            for arg, site in self._arguments(fscope, name)
        ]
        if not kinds:
            default = fscope.defaults.get(name)
            result = self.kind(default, fscope.parent or self.module) if default else 0
        else:
            risky = [k for k in kinds if not k & K.SAFE]
            if risky:
                result = 0
                for k in risky:
                    result |= k
            else:
                result = K.SAFE
                for k in kinds:
                    result |= k
            result &= _PARAM_BITS
        self._params[key] = result
        return result

    def _arguments(self, fscope: Scope, name: str) -> list[tuple[ast.expr, Site]]:
        if name not in fscope.params and name not in fscope.defaults:
            return []
        index = fscope.params.index(name) if name in fscope.params else None
        method = (
            fscope.parent is not None
            and fscope.parent.kind == "class"
            and bool(fscope.params)
            and fscope.params[0] in ("self", "cls")
        )
        if method and index is not None:
            index -= 1
        found: list[tuple[ast.expr, Site]] = []
        for call, site in self.calls.get(fscope.name, ()):
            cscope = site.scope
            func = call.func
            if method:
                if not (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id in ("self", "cls")
                    and cscope.cls is fscope.parent
                ):
                    continue
            elif not (isinstance(func, ast.Name) and _encloses(fscope.parent, cscope)):
                continue
            arg = keyword(call, name)
            if arg is None and index is not None and 0 <= index < len(call.args):
                if any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
                    continue
                arg = call.args[index]
            if arg is not None:
                found.append((arg, site))
        return found

def _encloses(outer: Scope | None, inner: Scope) -> bool:
    s: Scope | None = inner
    while s is not None:
        if s is outer:
            return True
        s = s.parent
    return False
