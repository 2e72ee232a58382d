"""Whether the code looks after a value: the tests, guards and epsilons the lint rules accept.

A hazard (a division by a sum that can be 0, the log of a probability) is looked after when a
test on the path to it looks at the value (``if n > 0:``, ``where(d == 0, 1, d)``, ``assert
total``), when an epsilon keeps it away from 0 (``d + eps``), or when the code catches the
arithmetic error. :class:`Guards` answers from the walk's records alone
(:mod:`nanscope.lint.scopes`); what kind of value an expression holds is
:mod:`nanscope.lint.inference`'s job.
"""

from __future__ import annotations

import ast

from nanscope.lint.scopes import Records, Scope, Site, catches_arithmetic, ref_key
from nanscope.lint.vocabulary import EPS_NAME, MEAN_FUNCS, PASS_FUNCS, PASS_METHODS, SUM_FUNCS

__all__ = ["Guards"]

#: calls that show a function expects NaN or inf and deals with it
_NAN_AWARE = frozenset(
    {"errstate", "seterr", "nan_to_num", "isnan", "isfinite", "isinf", "nanmean", "nansum",
     "nanmedian", "nanmax", "nanmin", "nanstd", "fillna", "nan_to_num_"}
)  # fmt: skip
#: the calls whose result is derived from their operands' values (see Guards.value_keys)
_DERIVING = SUM_FUNCS | MEAN_FUNCS | frozenset(
    {"norm", "vector_norm", "std", "var", "sqrt", "abs", "long", "int", "bool", "any", "all",
     "max", "min", "amax", "amin", "numel", "len", "logical_and", "logical_or", "logical_not",
     "ne", "eq", "gt", "lt", "ge", "le", "nonzero", "where", "clamp", "clip", "round"}
)  # fmt: skip
#: calls that combine their arguments elementwise (each argument is what they work on)
_COMBINING = frozenset(
    {"logical_and", "logical_or", "logical_xor", "maximum", "minimum", "where", "cat", "concat",
     "concatenate", "stack", "hstack", "vstack"}
)  # fmt: skip
#: tests that say nothing about a value's size
_TYPE_TESTS = frozenset({"isinstance", "hasattr", "callable", "is_tensor", "is_floating_point"})
#: attributes and methods that describe a tensor's layout, not its values
_LAYOUT = frozenset({"shape", "ndim", "dim", "dtype", "device", "is_cuda", "requires_grad"})


class Guards:
    """The guards of one module's values, read from the records of its walk."""

    def __init__(self, records: Records) -> None:
        self.records = records

    def bounded_somewhere(self, expr: ast.AST, site: Site) -> bool:
        """The weaker test for code nothing trains on: any test anywhere in the enclosing
        functions looks at ``expr``'s value, or they treat NaN as an expected value
        (``np.errstate``, ``nanmean``, ``isnan``, ``nan_to_num``)."""
        keys = self.value_keys(expr, site.scope)
        s: Scope | None = site.scope
        while s is not None and s.kind != "module":
            if s.called & _NAN_AWARE:
                return True
            if keys and any(keys & self.tested_keys(t, s) for t in s.tests):
                return True
            s = s.parent
        return False


    def positive(self, expr: ast.expr | None, scope: Scope) -> bool:
        """A constant above zero: a literal, an epsilon by name (``eps``, ``self.eps``,
        ``args.epsilon``, ``smooth``), ``finfo(...).eps``, ``torch.tensor(1e-8)``, a name bound to
        one, or a parameter whose default is one."""
        for _ in range(6):
            if expr is None:
                return False
            if isinstance(expr, ast.Constant):
                v = expr.value
                return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            if isinstance(expr, ast.Attribute):
                return bool(EPS_NAME.match(expr.attr)) or expr.attr == "tiny"
            if isinstance(expr, ast.Name):
                if EPS_NAME.match(expr.id):
                    return True
                entry = self.records.lookup(expr.id, scope, (expr.lineno, expr.col_offset))
                if not isinstance(entry, tuple):
                    return False
                if entry[1] is not None:
                    expr, scope = entry[1], entry[2]
                    continue
                fscope = entry[2]
                expr, scope = fscope.defaults.get(expr.id), fscope.parent or self.records.module
                continue
            if isinstance(expr, ast.Call):
                last = self.records.func_parts(expr)[1]
                if last is not None and EPS_NAME.match(last):
                    return True  # K.epsilon()
                if last in ("float", "tensor", "as_tensor", "float32", "float64", "array") and (
                    len(expr.args) == 1
                ):
                    expr = expr.args[0]
                    continue
                return False
            if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div, ast.Pow)):
                if isinstance(expr.op, ast.Mult) and (
                    _eps_named(expr.left) or _eps_named(expr.right)
                ):
                    return True  # n * eps: an epsilon scaled by a count
                return self.positive(expr.left, scope) and (
                    isinstance(expr.op, ast.Pow) or self.positive(expr.right, scope)
                )
            return False
        return False

    def value_keys(self, expr: ast.AST, scope: Scope, follow: int = 2) -> set[str]:
        """The storage locations an expression reads (``n``, ``self.count``, ``mask``), and those
        the values of its names were derived from (``n = mask.sum()`` reads ``mask``; a model's
        output is not derived from its input this way). Indices, modules and ``self`` are left
        out."""
        keys: set[str] = set()
        refs: list[ast.expr] = []
        stack: list[ast.AST] = [expr]
        while stack:
            node = stack.pop()
            t = type(node)
            if t is ast.Call:
                # the value a call works on: its receiver or its first argument, not the options
                # (`target.ne(ignore_index).sum()` reads `target`, not `ignore_index`)
                assert isinstance(node, ast.Call)
                _root, last, recv = self.records.func_parts(node)
                if recv is not None:
                    stack.append(recv)
                if last in _COMBINING:
                    stack.extend(node.args)
                elif recv is None and node.args:
                    stack.append(node.args[0])
            elif t is ast.Name or t is ast.Attribute:
                key = ref_key(node)
                imported = key is not None and key.split(".", 1)[0] in self.records.imports
                if key is not None and key != "self" and not imported:
                    keys.add(key)
                    refs.append(node)  # type: ignore[arg-type]
                elif t is ast.Attribute:
                    stack.append(node.value)  # type: ignore[attr-defined]
            elif t is ast.Subscript:
                key = ref_key(node)
                if key is not None:
                    keys.add(key)
                stack.append(node.value)  # type: ignore[attr-defined]
            else:
                stack.extend(ast.iter_child_nodes(node))
        if follow:
            for ref in refs:
                value, vscope = self.records.value_of(ref, scope)
                if value is not ref and self._derived(value):
                    keys |= self.value_keys(value, vscope, follow - 1)
        return keys

    def _derived(self, value: ast.expr) -> bool:
        """Whether a value is computed from its operands' values (a reduction, a view, arithmetic,
        a comparison), so that a test of an operand says something about it."""
        if isinstance(value, ast.Call):
            last = self.records.func_parts(value)[1]
            return last is not None and (
                last in _DERIVING or last in PASS_METHODS or last in PASS_FUNCS
            )
        return isinstance(
            value,
            (ast.Name, ast.Attribute, ast.Subscript, ast.BinOp, ast.UnaryOp, ast.Compare,
             ast.BoolOp),
        )  # fmt: skip

    def tested_keys(self, test: ast.AST, scope: Scope) -> set[str]:
        """The values a test looks at: the operands of its comparisons and its truth tests
        (``n > 0``, ``not total``, ``mask.any()``), not a type, shape or ``is None`` check."""
        keys: set[str] = set()
        stack: list[ast.AST] = [test]
        while stack:
            t = stack.pop()
            if isinstance(t, ast.BoolOp):
                stack.extend(t.values)
            elif isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
                stack.append(t.operand)
            elif isinstance(t, ast.Compare):
                if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in t.ops):
                    continue  # `x is None`, `"key" in batch`: not a test of a size
                for operand in (t.left, *t.comparators):
                    if not self._layout(operand):
                        keys |= self.value_keys(operand, scope)
            elif isinstance(t, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
                if isinstance(t, ast.Call):
                    last = self.records.func_parts(t)[1]
                    if last in _TYPE_TESTS:
                        continue
                    method = self.records.func_parts(t)[2] is not None
                    if last in ("all", "any") and t.args and not method:
                        stack.extend(t.args)
                        continue
                if not self._layout(t):
                    keys |= self.value_keys(t, scope)
        return keys

    def _layout(self, expr: ast.AST) -> bool:
        """``x.shape[0]``, ``x.dim()``, ``len(x)``, ``x.dtype``: a test of layout, not of values."""
        while isinstance(expr, (ast.Subscript, ast.Call)):
            if isinstance(expr, ast.Call):
                func = expr.func
                if isinstance(func, ast.Name) and func.id == "len":
                    return True
                if isinstance(func, ast.Attribute) and func.attr in ("size", "dim", "numel"):
                    return True
                expr = func
            else:
                expr = expr.value
        return isinstance(expr, ast.Attribute) and expr.attr in _LAYOUT

    def tests_value(self, test: ast.AST, expr: ast.AST, scope: Scope) -> bool:
        """Whether ``test`` looks at the value of ``expr``."""
        keys = self.value_keys(expr, scope)
        return bool(keys and keys & self.tested_keys(test, scope))

    def looked_after(self, expr: ast.AST, site: Site) -> bool:
        """Whether a test on the path to ``site`` looks at ``expr``'s value (``if n > 0:``,
        ``if s == 0: return``, ``assert total``, ``x if n else 0``, ``where(n > 0, x / n, 0)``),
        or the code runs in a ``try`` that catches ``ZeroDivisionError``."""
        keys = self.value_keys(expr, site.scope)
        for guard in site.guards:
            if catches_arithmetic(guard):
                return True
            if keys and keys & self.tested_keys(guard, site.scope):
                return True
        return bool(keys) and self._selected_away(keys, site)

    def _selected_away(self, keys: set[str], site: Site) -> bool:
        """``r = a / n`` then ``r = where(n > 0, r, 1.0)``: the result is replaced wherever the
        value it was computed from is looked at, later in the same body."""
        if not site.sink or site.sink == "return":
            return False
        for call in site.scope.selections:
            cond = call.args[0]
            if not keys & self.tested_keys(cond, site.scope):
                continue
            for branch in call.args[1:3]:
                if any(isinstance(n, ast.Name) and n.id == site.sink for n in ast.walk(branch)):
                    return True
        return False


def _eps_named(expr: ast.expr) -> bool:
    name = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", None)
    return isinstance(name, str) and bool(EPS_NAME.match(name))
