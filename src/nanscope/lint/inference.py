"""Type inference for the lint rules: what kind of value an expression holds.

:meth:`FileContext.kind` is a tiny abstract interpreter on top of the scope walker
(:mod:`nanscope.lint.scopes`): it maps an expression to the :class:`~nanscope.lint.vocabulary.K`
bit flags saying what kind of value it is (a probability, an unbounded linear output, a norm, a
loss, something clamped...), following assignments, calls and returns. Rules are built on these
flags, not on spellings.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from nanscope.lint.scopes import (
    Scope,
    ScopeWalker,
    Site,
    is_none,
    is_number,
    keyword,
    ref_key,
    same_expr,
)
from nanscope.lint.vocabulary import (
    CLAMPS,
    COLLECTIVES,
    CONSTRUCTORS,
    EPS_NAME,
    FN_TO_VALUE,
    FRAMEWORKS,
    KERAS_LOSSES,
    LINEAR_FUNCS,
    LINEAR_LAYERS,
    LOGIT_NAME,
    LOSS_FUNCS,
    MEAN_FUNCS,
    MSE_NAMES,
    OPTIMIZERS,
    PASS_FUNCS,
    PASS_METHODS,
    PROB_NAME,
    RANDOM_DRAWS,
    SELECTIONS,
    SUM_FUNCS,
    VALUE_TO_FN,
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
#: calls that show a function expects NaN or inf and deals with it
_NAN_AWARE = frozenset(
    {"errstate", "seterr", "nan_to_num", "isnan", "isfinite", "isinf", "nanmean", "nansum",
     "nanmedian", "nanmax", "nanmin", "nanstd", "fillna", "nan_to_num_"}
)  # fmt: skip
#: the calls whose result is derived from their operands' values (see FileContext.value_keys)
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
        self._summaries: dict[int, int] = {}
        self._params: dict[tuple[int, str], int] = {}
        self._loads: dict[str, int] | None = None
        self.project = project
        self.path = path
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
            return self._kind_call(e, scope, comps)  # type: ignore[arg-type]
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
                and self.value_keys(e.value, scope) & self.tested_keys(e.slice, scope)
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

    def _callee_kind(self, func: ast.expr, scope: Scope) -> int:
        """What calling ``func`` yields, as value flags."""
        fk = self.kind(func, scope)
        k = 0
        for fn_bit, val_bit in FN_TO_VALUE:
            if fk & fn_bit:
                k |= val_bit
        if fk & K.MODEL and fk & K.HALF:
            k |= K.HALF
        return k

    def _summary(self, fscope: Scope) -> int:
        """Value flags of what a local function (or a class's forward) returns."""
        key = id(fscope)
        got = self._summaries.get(key)
        if got is not None:
            return got
        self._summaries[key] = 0
        k = 0
        for value in fscope.returns:
            k |= self.kind(value, fscope)
        k &= K.PROBS | K.LINEAR | K.LOSS | K.SAFE | K.HALF | K.NORM | K.STD | K.VAR | K.EXP
        self._summaries[key] = k
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

    def callee_of(self, name: str) -> int:
        """What calling this module's top-level class or function ``name`` yields."""
        cls = self.module.classes.get(name)
        if cls is not None:
            return self._class_callee(cls)
        fscope = self.module.functions.get(name)
        return self._summary(fscope) if fscope is not None else 0

    def _class_callee(self, cls: Scope) -> int:
        for meth in ("forward", "call", "__call__"):
            fscope = cls.functions.get(meth)
            if fscope is not None:
                k = self._summary(fscope)
                out = K.MODEL
                for val_bit, fn_bit in VALUE_TO_FN:
                    if k & val_bit and not (val_bit & K.PROBS and k & K.SAFE):
                        out |= fn_bit
                return out
        return K.MODEL

    def _kind_call(self, e: ast.Call, scope: Scope, comps: tuple[ast.comprehension, ...]) -> int:
        root, last, recv = self.func_parts(e)
        fw = root in FRAMEWORKS or recv is not None
        arg0 = e.args[0] if e.args else None
        if last is None:
            return self._callee_kind(e.func, scope)
        # a probability
        if last in ("sigmoid", "sigmoid_", "expit", "logistic") and (fw or root is None):
            return K.PROB | K.SIGMOID
        if last in ("softmax", "softmin", "softmax_") and (fw or root is None):
            return K.PROB | K.SOFTMAX
        if last in SELECTIONS and root in FRAMEWORKS and len(e.args) >= 3:
            return self._selection_kind(e, scope, comps)
        if last in COLLECTIVES and arg0 is not None:
            # dist.all_reduce(m, op=MAX) / funcol.all_reduce(m, ...): the same kind of value
            return self.kind(arg0, scope, comps) & K.CARRY
        if last == "predict_proba":
            return K.PROB
        if last in ("log_softmax", "logsigmoid", "log_sigmoid", "log_softmin"):
            return 0
        subject = recv if recv is not None else arg0
        if fw:
            if last in CLAMPS:
                inner = self.kind(subject, scope, comps) if last != "where" else 0
                return K.SAFE | (inner & (K.PROBS | K.ARITH))
            if recv is not None and last in PASS_METHODS:
                k = self.kind(recv, scope, comps) & (K.CARRY | K.MODEL | K.OPTIM | K.CONST)
                k |= self._callee_bits(recv, scope) if k & K.MODEL else 0
                if last == "half" or (last in ("to", "type") and _mentions_half(e)):
                    k |= K.HALF
                elif last in ("float", "double", "bfloat16") or (
                    last in ("to", "type") and _mentions_float(e)
                ):
                    k &= ~K.HALF
                return k
            if recv is None and last in PASS_FUNCS:
                return self.kind(arg0, scope, comps) & K.CARRY
            if last in LINEAR_FUNCS:
                return K.LINEAR
            if last in ("exp", "expm1", "exp2", "exp_"):
                return K.EXP
            if recv is not None and last in ("add", "add_") and e.args:
                # x.add(eps): the method form of x + eps
                inner = self.kind(recv, scope, comps)
                if self.positive(e.args[0], scope):
                    return K.SAFE | (inner & (K.PROBS | K.ARITH))
                return inner & (K.ARITH | K.PROBS | K.ZERO | K.SAFE)
            if last in ("norm", "vector_norm", "matrix_norm"):
                if self.kind(subject, scope, comps) & K.NONZERO:
                    return 0  # the norm of a random draw is not 0
                return K.NORM
            if last in ("std", "reduce_std", "nanstd"):
                # the spread of a random draw is not 0
                return 0 if self.kind(subject, scope, comps) & K.NONZERO else K.STD
            if last in RANDOM_DRAWS:
                return K.NONZERO
            if last in CONSTRUCTORS:
                return K.CONST
            if last in ("cat", "concat", "concatenate", "stack", "hstack", "vstack") and arg0:
                return self._joined_kind(arg0, scope, comps)
            if last in ("var", "reduce_variance", "nanvar"):
                return K.VAR
            if last in SUM_FUNCS or last in MEAN_FUNCS:
                inner = self.kind(subject, scope, comps)
                # a sum of clamped values keeps the clamp's floor
                k = inner & (K.LOSS | K.HALF | K.GRAD | K.CONST | K.SAFE)
                if inner & (K.SQUARE | K.SUMSQ):
                    k |= K.SUMSQ
                elif last in SUM_FUNCS:
                    # a sum of exps, of probabilities, of a mask with a row of ones: positive
                    positive = K.EXP | K.SUMEXP | K.PROBS | K.NONZERO
                    k |= K.SUMEXP if inner & positive and not inner & K.SAFE else K.SUM
                return k
            if last in ("square",):
                return K.SQUARE
            if last == "pow":
                exponent = (
                    e.args[0]
                    if recv is not None and e.args
                    else (e.args[1] if len(e.args) > 1 else None)
                )
                if exponent is not None and is_number(exponent, 2):
                    return K.SQUARE
                return 0
            if last == "sqrt":
                inner = self.kind(subject, scope, comps)
                if inner & K.SAFE:
                    return K.SAFE
                if inner & K.SUMSQ:
                    return K.NORM
                if inner & K.VAR:
                    return K.STD
                return 0
            if last in ("max", "amax", "reduce_max", "logsumexp", "reduce_logsumexp", "nanmax"):
                return K.MAX
            if last in LOSS_FUNCS:
                return K.LOSS | (K.SUMSQ if last in MSE_NAMES else 0)
        if root is None and recv is None:
            if last in ("max", "min") and len(e.args) >= 2:
                return K.SAFE
            if last == "sum" and arg0 is not None:
                summed = arg0.elt if isinstance(arg0, ast.GeneratorExp) else arg0
                return K.SUMSQ if self.kind(summed, scope) & K.SQUARE else 0
            fscope = scope.functions.get(last) or self.module.functions.get(last)
            if fscope is not None:
                return self._summary(fscope)
            cls = self.module.classes.get(last)
            if cls is not None:
                return self._class_callee(cls)
            if last in self.imports and self.project is not None:
                return self.project.callee_kind(self.imports[last], self.path)
            if last not in self.imports:
                k = self._callee_kind(e.func, scope)
                if re.match(r"^(criterion|loss_?fn|loss_?func|compute_loss|\w+_loss)$", last):
                    k |= K.LOSS
                return k
        if recv is not None and isinstance(recv, ast.Name) and recv.id == "self" and scope.cls:
            fscope = scope.cls.functions.get(last)
            if fscope is not None:
                return self._summary(fscope)
            return self._callee_kind(e.func, scope)
        if root is not None and last[:1].isupper():
            k = self._ctor_kind(e, root, last, scope)
            if not k and root not in FRAMEWORKS and self.project is not None:
                qual = self.qualname(e.func)
                if qual is not None:
                    return self.project.callee_kind(qual, self.path)
            return k
        if recv is not None:
            return self._callee_kind(e.func, scope)
        return 0

    def _callee_bits(self, recv: ast.expr, scope: Scope) -> int:
        return self.kind(recv, scope) & (
            K.FN_PROB
            | K.FN_SIGMOID
            | K.FN_SOFTMAX
            | K.FN_LINEAR
            | K.FN_LOSS
            | K.FN_BCE
            | K.FN_BCE_TF
            | K.FN_MSE
        )

    def _ctor_kind(self, e: ast.Call, root: str, last: str, scope: Scope) -> int:
        if last == "Sigmoid":
            return K.MODEL | K.FN_PROB | K.FN_SIGMOID
        if last in ("Softmax", "Softmax2d", "Softmin"):
            return K.MODEL | K.FN_PROB | K.FN_SOFTMAX
        if last in LINEAR_LAYERS or last == "Activation":
            act = keyword(e, "activation")
            if act is None and last in ("Dense", "Activation") and len(e.args) > (last == "Dense"):
                act = e.args[1 if last == "Dense" else 0]
            if isinstance(act, ast.Constant) and isinstance(act.value, str):
                if act.value == "sigmoid":
                    return K.MODEL | K.FN_PROB | K.FN_SIGMOID
                if act.value == "softmax":
                    return K.MODEL | K.FN_PROB | K.FN_SOFTMAX
                return K.MODEL | (K.FN_LINEAR if act.value == "linear" else 0)
            if act is None or is_none(act):
                return K.MODEL | (K.FN_LINEAR if last != "Activation" else 0)
            return K.MODEL
        if last == "Sequential":
            layers: list[ast.expr] = list(e.args)
            if len(layers) == 1 and isinstance(layers[0], (ast.List, ast.Tuple)):
                layers = list(layers[0].elts)
            if layers:
                return K.MODEL | (self.kind(layers[-1], scope) & ~K.MODEL & ~K.CONST)
            return K.MODEL
        if last == "BCELoss":
            return K.FN_BCE | K.FN_LOSS
        if last == "BinaryCrossentropy":
            logits = keyword(e, "from_logits")
            if logits is not None and not (isinstance(logits, ast.Constant) and not logits.value):
                return K.FN_LOSS
            return K.FN_BCE_TF | K.FN_LOSS
        if last in MSE_NAMES:
            return K.FN_MSE | K.FN_LOSS
        if last.endswith("Loss") or last in KERAS_LOSSES:
            return K.FN_LOSS
        if last in OPTIMIZERS:
            return K.OPTIM
        if root in ("torch", "tensorflow", "keras") and not last.endswith(
            ("Tensor", "Size", "Generator", "Stream", "Event", "device", "dtype")
        ):
            return K.MODEL
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
                if self.positive(e.left, scope) or self.positive(e.right, scope):
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
            if is_number(e.right, 0.5):
                if kl & K.SAFE:
                    return K.SAFE
                if kl & K.SUMSQ:
                    return K.NORM
                if kl & K.VAR:
                    return K.STD
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
            | (K.SAFE if self.looked_after(arg, site) else 0)
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

    def _joined_kind(
        self, parts: ast.expr, scope: Scope, comps: tuple[ast.comprehension, ...]
    ) -> int:
        """``cat([mask, ones(...)])``: a join with a part of ones is nonzero by construction."""
        value, vscope = self.value_of(parts, scope, comps)
        if not isinstance(value, (ast.List, ast.Tuple)):
            return 0
        k = 0
        for elt in value.elts:
            if isinstance(elt, ast.Call) and self.func_parts(elt)[1] in ("ones", "ones_like"):
                k |= K.NONZERO
            else:
                k |= self.kind(elt, vscope) & K.CARRY & ~K.NONZERO
        return k

    def _selection_kind(
        self, e: ast.Call, scope: Scope, comps: tuple[ast.comprehension, ...]
    ) -> int:
        """``where(cond, a, b)`` is a value of either branch: a selection, not a clamp. It keeps a
        branch away from a hazard only when its condition looks at that branch
        (``where(d == 0, 1, d)``, ``where(p > 0, p, eps)``)."""
        cond = e.args[0]
        out = 0
        safe = True
        for branch in e.args[1:3]:
            k = self.kind(branch, scope, comps)
            if k & K.RISK and not k & K.SAFE and not self.tests_value(cond, branch, scope):
                safe = False
            out |= k
        out &= K.CARRY & ~K.SAFE
        return out | K.SAFE if safe and out & K.RISK else out

    # ------------------------------------------------------------------ guards

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
                entry = self.lookup(expr.id, scope, (expr.lineno, expr.col_offset))
                if not isinstance(entry, tuple):
                    return False
                if entry[1] is not None:
                    expr, scope = entry[1], entry[2]
                    continue
                expr, scope = entry[2].defaults.get(expr.id), entry[2].parent or self.module
                continue
            if isinstance(expr, ast.Call):
                last = self.func_parts(expr)[1]
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
                _root, last, recv = self.func_parts(node)
                if recv is not None:
                    stack.append(recv)
                if last in _COMBINING:
                    stack.extend(node.args)
                elif recv is None and node.args:
                    stack.append(node.args[0])
            elif t is ast.Name or t is ast.Attribute:
                key = ref_key(node)
                if key is not None and key != "self" and key.split(".", 1)[0] not in self.imports:
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
                value, vscope = self.value_of(ref, scope)
                if value is not ref and self._derived(value):
                    keys |= self.value_keys(value, vscope, follow - 1)
        return keys

    def _derived(self, value: ast.expr) -> bool:
        """Whether a value is computed from its operands' values (a reduction, a view, arithmetic,
        a comparison), so that a test of an operand says something about it."""
        if isinstance(value, ast.Call):
            last = self.func_parts(value)[1]
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
                    last = self.func_parts(t)[1]
                    if last in _TYPE_TESTS:
                        continue
                    if last in ("all", "any") and t.args and self.func_parts(t)[2] is None:
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
            if _arithmetic_error(guard):
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


def _encloses(outer: Scope | None, inner: Scope) -> bool:
    s: Scope | None = inner
    while s is not None:
        if s is outer:
            return True
        s = s.parent
    return False


_ARITHMETIC_ERRORS = frozenset({"ZeroDivisionError", "ArithmeticError", "FloatingPointError"})


def _arithmetic_error(guard: ast.expr) -> bool:
    """A guard that is an ``except`` clause's type catching division by zero."""
    names = guard.elts if isinstance(guard, ast.Tuple) else [guard]
    return any(
        (n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")) in _ARITHMETIC_ERRORS
        for n in names
    )


def _dtype_names(call: ast.Call) -> set[str]:
    out: set[str] = set()
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        if isinstance(arg, ast.Attribute):
            out.add(arg.attr)
        elif isinstance(arg, ast.Name):
            out.add(arg.id)
        elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.add(arg.value)
    return out


def _mentions_half(call: ast.Call) -> bool:
    return bool(_dtype_names(call) & {"float16", "half"})


def _mentions_float(call: ast.Call) -> bool:
    return bool(_dtype_names(call) & {"float32", "float", "float64", "double", "bfloat16"})
