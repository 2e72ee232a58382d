"""What a call returns, as the lint's :class:`~nanscope.lint.vocabulary.K` flags.

:class:`CallKinds` is the part of :meth:`nanscope.lint.inference.FileContext.kind` that reads
calls: a framework's functions (``sigmoid`` gives a probability, ``clamp`` a safe value, ``sum``
of squares a sum of squares), its constructors (a ``Linear`` layer, a ``BCELoss``, an optimizer),
this module's own functions and classes (what they return, summarised once), and the functions
another file of the run defines (:class:`~nanscope.lint.project.Project`).
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from nanscope.lint.scopes import Scope, is_none, is_number, keyword
from nanscope.lint.vocabulary import (
    CLAMPS,
    COLLECTIVES,
    CONSTRUCTORS,
    FN_TO_VALUE,
    FRAMEWORKS,
    KERAS_LOSSES,
    LINEAR_FUNCS,
    LINEAR_LAYERS,
    LOSS_FUNCS,
    MEAN_FUNCS,
    MSE_NAMES,
    OPTIMIZERS,
    PASS_FUNCS,
    PASS_METHODS,
    RANDOM_DRAWS,
    SELECTIONS,
    SUM_FUNCS,
    VALUE_TO_FN,
    K,
)

if TYPE_CHECKING:
    from nanscope.lint.inference import FileContext

__all__ = ["CallKinds", "sqrt_kind"]


class CallKinds:
    """The kinds of one module's calls; ``ctx`` gives the kinds of their arguments."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._summaries: dict[int, int] = {}

    def _callee_kind(self, func: ast.expr, scope: Scope) -> int:
        """What calling ``func`` yields, as value flags."""
        fk = self.ctx.kind(func, scope)
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
            k |= self.ctx.kind(value, fscope)
        k &= K.PROBS | K.LINEAR | K.LOSS | K.SAFE | K.HALF | K.NORM | K.STD | K.VAR | K.EXP
        self._summaries[key] = k
        return k

    def callee_of(self, name: str) -> int:
        """What calling this module's top-level class or function ``name`` yields."""
        cls = self.ctx.module.classes.get(name)
        if cls is not None:
            return self._class_callee(cls)
        fscope = self.ctx.module.functions.get(name)
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

    def kind(self, e: ast.Call, scope: Scope, comps: tuple[ast.comprehension, ...]) -> int:
        """The :class:`K` flags of what the call ``e`` returns."""
        root, last, recv = self.ctx.func_parts(e)
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
            return self.ctx.kind(arg0, scope, comps) & K.CARRY
        if last == "predict_proba":
            return K.PROB
        if last in ("log_softmax", "logsigmoid", "log_sigmoid", "log_softmin"):
            return 0
        if fw:
            k = self._framework_kind(e, last, recv, scope, comps)
            if k is not None:
                return k
        if root is None and recv is None:
            return self._local_kind(e, last, scope)
        if recv is not None and isinstance(recv, ast.Name) and recv.id == "self" and scope.cls:
            fscope = scope.cls.functions.get(last)
            if fscope is not None:
                return self._summary(fscope)
            return self._callee_kind(e.func, scope)
        if root is not None and last[:1].isupper():
            k = self._ctor_kind(e, root, last, scope)
            if not k and root not in FRAMEWORKS and self.ctx.project is not None:
                qual = self.ctx.qualname(e.func)
                if qual is not None:
                    return self.ctx.project.callee_kind(qual, self.ctx.path)
            return k
        if recv is not None:
            return self._callee_kind(e.func, scope)
        return 0

    def _framework_kind(
        self,
        e: ast.Call,
        last: str,
        recv: ast.expr | None,
        scope: Scope,
        comps: tuple[ast.comprehension, ...],
    ) -> int | None:
        """A framework's function or a method: what the known names return; None for a name this
        table does not know (a constructor, a model's own method)."""
        arg0 = e.args[0] if e.args else None
        subject = recv if recv is not None else arg0
        if last in CLAMPS:
            inner = self.ctx.kind(subject, scope, comps) if last != "where" else 0
            return K.SAFE | (inner & (K.PROBS | K.ARITH))
        if recv is not None and last in PASS_METHODS:
            k = self.ctx.kind(recv, scope, comps) & (K.CARRY | K.MODEL | K.OPTIM | K.CONST)
            k |= self._callee_bits(recv, scope) if k & K.MODEL else 0
            if last == "half" or (last in ("to", "type") and _mentions_half(e)):
                k |= K.HALF
            elif last in ("float", "double", "bfloat16") or (
                last in ("to", "type") and _mentions_float(e)
            ):
                k &= ~K.HALF
            return k
        if recv is None and last in PASS_FUNCS:
            return self.ctx.kind(arg0, scope, comps) & K.CARRY
        if last in LINEAR_FUNCS:
            return K.LINEAR
        if last in ("exp", "expm1", "exp2", "exp_"):
            return K.EXP
        if recv is not None and last in ("add", "add_") and e.args:
            # x.add(eps): the method form of x + eps
            inner = self.ctx.kind(recv, scope, comps)
            if self.ctx.guards.positive(e.args[0], scope):
                return K.SAFE | (inner & (K.PROBS | K.ARITH))
            return inner & (K.ARITH | K.PROBS | K.ZERO | K.SAFE)
        if last in ("norm", "vector_norm", "matrix_norm"):
            if self.ctx.kind(subject, scope, comps) & K.NONZERO:
                return 0  # the norm of a random draw is not 0
            return K.NORM
        if last in ("std", "reduce_std", "nanstd"):
            # the spread of a random draw is not 0
            return 0 if self.ctx.kind(subject, scope, comps) & K.NONZERO else K.STD
        if last in RANDOM_DRAWS:
            return K.NONZERO
        if last in CONSTRUCTORS:
            return K.CONST
        if last in ("cat", "concat", "concatenate", "stack", "hstack", "vstack") and arg0:
            return self._joined_kind(arg0, scope, comps)
        if last in ("var", "reduce_variance", "nanvar"):
            return K.VAR
        if last in SUM_FUNCS or last in MEAN_FUNCS:
            inner = self.ctx.kind(subject, scope, comps)
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
            return sqrt_kind(self.ctx.kind(subject, scope, comps))
        if last in ("max", "amax", "reduce_max", "logsumexp", "reduce_logsumexp", "nanmax"):
            return K.MAX
        if last in LOSS_FUNCS:
            return K.LOSS | (K.SUMSQ if last in MSE_NAMES else 0)
        return None

    def _local_kind(self, e: ast.Call, last: str, scope: Scope) -> int:
        """A bare name's call (``f(x)``, ``Model()``): a builtin, this module's function or class,
        another file's (through the project), or a callable value."""
        arg0 = e.args[0] if e.args else None
        if last in ("max", "min") and len(e.args) >= 2:
            return K.SAFE
        if last == "sum" and arg0 is not None:
            summed = arg0.elt if isinstance(arg0, ast.GeneratorExp) else arg0
            return K.SUMSQ if self.ctx.kind(summed, scope) & K.SQUARE else 0
        fscope = scope.functions.get(last) or self.ctx.module.functions.get(last)
        if fscope is not None:
            return self._summary(fscope)
        cls = self.ctx.module.classes.get(last)
        if cls is not None:
            return self._class_callee(cls)
        if last in self.ctx.imports and self.ctx.project is not None:
            return self.ctx.project.callee_kind(self.ctx.imports[last], self.ctx.path)
        if last not in self.ctx.imports:
            k = self._callee_kind(e.func, scope)
            if re.match(r"^(criterion|loss_?fn|loss_?func|compute_loss|\w+_loss)$", last):
                k |= K.LOSS
            return k
        return 0

    def _callee_bits(self, recv: ast.expr, scope: Scope) -> int:
        return self.ctx.kind(recv, scope) & (
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
                return K.MODEL | (self.ctx.kind(layers[-1], scope) & ~K.MODEL & ~K.CONST)
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

    def _joined_kind(
        self, parts: ast.expr, scope: Scope, comps: tuple[ast.comprehension, ...]
    ) -> int:
        """``cat([mask, ones(...)])``: a join with a part of ones is nonzero by construction."""
        value, vscope = self.ctx.value_of(parts, scope, comps)
        if not isinstance(value, (ast.List, ast.Tuple)):
            return 0
        k = 0
        for elt in value.elts:
            if isinstance(elt, ast.Call) and self.ctx.func_parts(elt)[1] in ("ones", "ones_like"):
                k |= K.NONZERO
            else:
                k |= self.ctx.kind(elt, vscope) & K.CARRY & ~K.NONZERO
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
            k = self.ctx.kind(branch, scope, comps)
            looked_at = self.ctx.guards.tests_value(cond, branch, scope)
            if k & K.RISK and not k & K.SAFE and not looked_at:
                safe = False
            out |= k
        out &= K.CARRY & ~K.SAFE
        return out | K.SAFE if safe and out & K.RISK else out


def sqrt_kind(inner: int) -> int:
    """The flags of the square root of a value of kind ``inner``: a safe value stays safe, a sum
    of squares becomes a norm, a variance a standard deviation; 0 for anything else."""
    if inner & K.SAFE:
        return K.SAFE
    if inner & K.SUMSQ:
        return K.NORM
    if inner & K.VAR:
        return K.STD
    return 0


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
