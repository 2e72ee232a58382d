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

from nanscope.lint.scopes import Scope, ScopeWalker, is_none, is_number, keyword, same_expr
from nanscope.lint.vocabulary import (
    CLAMPS,
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
    SUM_FUNCS,
    VALUE_TO_FN,
    K,
    name_kind,
)

__all__ = ["FileContext"]


class FileContext(ScopeWalker):
    """Everything known about one parsed module: the walk's records and the kinds of its values."""

    def __init__(self, tree: ast.Module, wanted: frozenset[type[ast.AST]]) -> None:
        self._memo: dict[int, int] = {}
        self._active: set[int] = set()
        self._summaries: dict[int, int] = {}
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
            return self.kind(e.value, scope, comps) & K.CARRY  # type: ignore[attr-defined]
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
        elif entry is None:
            cls = self.module.classes.get(e.id)
            if cls is not None:
                return K.MODEL
        if self.is_guarded(e.id, scope):
            k |= K.SAFE
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
        if attr in ("T", "mT", "data", "real", "H"):
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
        k &= K.PROBS | K.LINEAR | K.LOSS | K.SAFE | K.HALF
        self._summaries[key] = k
        return k

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
        if last in ("sigmoid", "expit", "logistic") and (fw or root is None):
            return K.PROB | K.SIGMOID
        if last in ("softmax", "softmin") and (fw or root is None):
            return K.PROB | K.SOFTMAX
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
            if last in ("exp", "expm1", "exp2"):
                return K.EXP
            if last in ("norm", "vector_norm", "matrix_norm"):
                return K.NORM
            if last in ("std", "reduce_std", "nanstd"):
                # NumPy feature standardisation (np.std, .std(axis=...)) is data preparation: a
                # constant column is reported by `nanscope scan`, not here
                if root == "numpy" or keyword(e, "axis") is not None:
                    return 0
                return K.STD
            if last in ("var", "reduce_variance", "nanvar"):
                return K.VAR
            if last in SUM_FUNCS or last in MEAN_FUNCS:
                inner = self.kind(subject, scope, comps)
                k = inner & (K.LOSS | K.HALF | K.GRAD)
                if inner & (K.SQUARE | K.SUMSQ):
                    k |= K.SUMSQ
                elif last in SUM_FUNCS:
                    k |= K.SUMEXP if inner & (K.EXP | K.SUMEXP) else K.SUM
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
            return self._ctor_kind(e, root, last, scope)
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
        if root in ("torch", "tensorflow", "keras"):
            return K.MODEL
        return 0

    def _kind_binop(self, e: ast.BinOp, scope: Scope, comps: tuple[ast.comprehension, ...]) -> int:
        op = type(e.op)
        if op is ast.Div and self.is_one(e.left, scope) and self.one_plus_exp(e.right, scope):
            return K.PROB | K.SIGMOID
        kl = self.kind(e.left, scope, comps)
        kr = self.kind(e.right, scope, comps)
        both = kl | kr
        if op is ast.Add:
            if kl & (K.SQUARE | K.SUMSQ) and kr & (K.SQUARE | K.SUMSQ):
                return K.SUMSQ | (both & (K.HALF | K.LOSS | K.GRAD))
            k = both & (K.ARITH | K.PROBS | K.SAFE | K.EXP | K.SUMEXP)
            if both & K.RISK:
                k |= K.SAFE
            return k
        if op is ast.Sub:
            if kr & K.MAX:
                return K.SAFE | (kl & (K.HALF | K.LOSS | K.GRAD))
            if self.is_one(e.left, scope):
                return kr & (K.PROBS | K.SAFE | K.ARITH)
            return both & (K.ARITH | (kl & K.SAFE))
        if op is ast.Mult:
            if same_expr(e.left, e.right):
                return K.SQUARE | (kl & (K.HALF | K.LOSS | K.GRAD))
            k = both & K.ARITH
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
