"""One walk over a module's AST that builds everything the rules ask about.

The walk records, for every node a rule subscribed to, the :class:`Site` it was found at (its scope,
the loops and comprehensions around it, whether it runs under ``no_grad``). It also records the
imports, every simple assignment per scope (so a rule can follow ``p = torch.sigmoid(z)`` from a
later ``torch.log(p)``), ``self.attr`` assignments per class, function return values, and a few
file-wide facts (which identifiers occur, which loops clear gradients).

:meth:`FileContext.kind` is a tiny abstract interpreter: it maps an expression to a set of bit
flags saying what kind of value it is (a probability, an unbounded linear output, a norm, a loss,
something clamped...). Rules are built on these flags, not on spellings.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["INPLACE_METHODS", "FileContext", "K", "Scope", "Site", "inplace_root", "ref_key"]


class K:
    """Bit flags describing what a value is."""

    PROB = 1 << 0  # a probability in [0, 1] that can reach exactly 0 or 1
    SIGMOID = 1 << 1  # ... produced by a sigmoid
    SOFTMAX = 1 << 2  # ... produced by a softmax
    SAFE = 1 << 3  # clamped, clipped, or offset by an epsilon
    LINEAR = 1 << 4  # an unbounded linear output (matmul, Linear layer)
    EXP = 1 << 5  # the result of exp (positive)
    NORM = 1 << 6  # a norm (zero for a zero vector)
    STD = 1 << 7  # a standard deviation (zero for a constant input)
    SUM = 1 << 8  # a sum or count (zero for an empty mask)
    SUMEXP = 1 << 9  # a sum of exps (positive)
    SQUARE = 1 << 10  # an elementwise square
    SUMSQ = 1 << 11  # a sum or mean of squares
    HALF = 1 << 12  # float16
    LOSS = 1 << 13  # a loss value
    GRAD = 1 << 14  # a gradient
    MODEL = 1 << 15  # a module / layer object
    VAR = 1 << 16  # a variance
    CONST = 1 << 17  # a literal
    OPTIM = 1 << 18  # an optimizer object
    MAX = 1 << 19  # a max (subtracting it bounds exp)
    # what calling a callable value yields
    FN_PROB = 1 << 20
    FN_SIGMOID = 1 << 21
    FN_SOFTMAX = 1 << 22
    FN_LINEAR = 1 << 23
    FN_LOSS = 1 << 24
    FN_BCE = 1 << 25  # torch BCELoss: prediction is argument 0
    FN_BCE_TF = 1 << 26  # keras BinaryCrossentropy: prediction is argument 1
    FN_MSE = 1 << 27

    RISK = PROB | NORM | STD | SUM | SUMSQ | SQUARE | VAR
    ZERO = NORM | STD | SUM
    ARITH = LINEAR | HALF | LOSS | GRAD
    PROBS = PROB | SIGMOID | SOFTMAX
    CARRY = PROBS | SAFE | LINEAR | HALF | LOSS | GRAD | NORM | STD | SUM | EXP | SUMEXP | VAR


FRAMEWORKS = frozenset({"torch", "numpy", "tensorflow", "keras", "jax", "math", "scipy", "cupy"})
DEFAULT_ROOTS = {
    "np": "numpy",
    "numpy": "numpy",
    "torch": "torch",
    "tf": "tensorflow",
    "tensorflow": "tensorflow",
    "F": "torch.nn.functional",
    "nn": "torch.nn",
    "jnp": "jax.numpy",
    "jax": "jax",
    "math": "math",
    "keras": "keras",
}

_PROB_NAME = re.compile(
    r"^(p|probs?|proba|probas|probabilit(y|ies)|p_?hat|\w+_probs?|\w+_proba|probs?_\w+)$"
)
_LOSS_NAME = re.compile(r"^(loss|losses|cost|nll|objective|\w+_loss|loss_\w+)$", re.I)
_GRAD_NAME = re.compile(
    r"^(g|grad|grads|gradient|gradients|g_?[wbWB]\d*|g_?theta|\w+_grads?|grads?_\w+|d[wb]|dw\d*|db\d*|dtheta|d_\w+|"
    r"dl_?d\w+|dloss\w*)$",
    re.I,
)
_LOGIT_NAME = re.compile(r"^(logits?|\w+_logits?|logits?_\w+)$")

_SUM_FUNCS = frozenset({"sum", "reduce_sum", "nansum", "count_nonzero"})
_MEAN_FUNCS = frozenset({"mean", "reduce_mean", "nanmean", "average"})
_CLAMPS = frozenset(
    {
        "clamp",
        "clip",
        "clamp_",
        "clip_",
        "clamp_min",
        "clamp_max",
        "clip_by_value",
        "maximum",
        "minimum",
        "fmax",
        "fmin",
        "where",
        "nan_to_num",
        "relu",
        "softplus",
    }
)
_PASS_METHODS = frozenset(
    {
        "detach",
        "squeeze",
        "unsqueeze",
        "view",
        "reshape",
        "flatten",
        "contiguous",
        "clone",
        "cpu",
        "cuda",
        "numpy",
        "t",
        "transpose",
        "permute",
        "gather",
        "index_select",
        "narrow",
        "expand",
        "expand_as",
        "view_as",
        "reshape_as",
        "type_as",
        "to",
        "float",
        "double",
        "half",
        "bfloat16",
        "train",
        "eval",
        "requires_grad_",
        "copy",
        "astype",
        "ravel",
        "squeeze_",
        "unsqueeze_",
        "select",
        "take",
        "take_along_dim",
        "diagonal",
        "masked_select",
        "type",
    }
)
_PASS_FUNCS = frozenset(
    {
        "gather",
        "take_along_axis",
        "take_along_dim",
        "squeeze",
        "reshape",
        "transpose",
        "take",
        "index_select",
        "asarray",
        "array",
        "tensor",
        "as_tensor",
        "convert_to_tensor",
        "stop_gradient",
    }
)
_LINEAR_FUNCS = frozenset(
    {
        "matmul",
        "mm",
        "bmm",
        "dot",
        "einsum",
        "linear",
        "tensordot",
        "inner",
        "addmm",
        "baddbmm",
        "mv",
        "vdot",
    }
)
_LOSS_FUNCS = frozenset(
    {
        "cross_entropy",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "kl_div",
        "poisson_nll_loss",
        "gaussian_nll_loss",
        "cosine_embedding_loss",
        "margin_ranking_loss",
        "ctc_loss",
        "softmax_cross_entropy_with_logits",
        "sigmoid_cross_entropy_with_logits",
        "sparse_softmax_cross_entropy_with_logits",
        "sparse_categorical_crossentropy",
        "categorical_crossentropy",
        "binary_crossentropy",
        "mean_squared_error",
        "log_loss",
        "hinge_loss",
        "softmax_cross_entropy",
        "sigmoid_cross_entropy",
    }
)
_MSE_NAMES = frozenset({"mse_loss", "mean_squared_error", "MSELoss", "MeanSquaredError"})
_LINEAR_LAYERS = frozenset(
    {
        "Linear",
        "LazyLinear",
        "Bilinear",
        "Conv1d",
        "Conv2d",
        "Conv3d",
        "ConvTranspose1d",
        "ConvTranspose2d",
        "ConvTranspose3d",
        "Dense",
        "Conv1D",
        "Conv2D",
        "Conv3D",
        "EinsumDense",
    }
)
_KERAS_LOSSES = frozenset(
    {
        "BinaryCrossentropy",
        "CategoricalCrossentropy",
        "SparseCategoricalCrossentropy",
        "MeanSquaredError",
        "MeanAbsoluteError",
        "Huber",
        "KLDivergence",
        "BinaryFocalCrossentropy",
        "LogCosh",
        "Poisson",
    }
)
_OPTIMIZERS = frozenset(
    {
        "SGD",
        "Adam",
        "AdamW",
        "RMSprop",
        "Adagrad",
        "Adadelta",
        "Adamax",
        "NAdam",
        "Nadam",
        "RAdam",
        "LBFGS",
        "Lion",
        "Adafactor",
        "SparseAdam",
        "ASGD",
        "Rprop",
        "Ftrl",
    }
)
#: methods that update their receiver in place (torch, TensorFlow variables)
INPLACE_METHODS = frozenset(
    {
        "add_",
        "sub_",
        "mul_",
        "div_",
        "lerp_",
        "copy_",
        "addcmul_",
        "addcdiv_",
        "assign",
        "assign_add",
        "assign_sub",
    }
)
_ZERO_GRAD_ATTRS = frozenset({"zero_grad", "clear_grad", "clear_gradients"})
_INTERESTING_STRINGS = frozenset({"mixed_float16", "float16", "16-mixed", "fp16"})

_FN_TO_VALUE = (
    (K.FN_PROB, K.PROB),
    (K.FN_SIGMOID, K.SIGMOID),
    (K.FN_SOFTMAX, K.SOFTMAX),
    (K.FN_LINEAR, K.LINEAR),
    (K.FN_LOSS, K.LOSS),
    (K.FN_BCE, K.LOSS),
    (K.FN_BCE_TF, K.LOSS),
    (K.FN_MSE, K.LOSS | K.SUMSQ),
)
_VALUE_TO_FN = (
    (K.PROB, K.FN_PROB),
    (K.SIGMOID, K.FN_SIGMOID),
    (K.SOFTMAX, K.FN_SOFTMAX),
    (K.LINEAR, K.FN_LINEAR),
    (K.LOSS, K.FN_LOSS),
)


def name_kind(name: str) -> int:
    """What a variable's name alone suggests (used when its value cannot be followed)."""
    k = 0
    if _LOSS_NAME.match(name):
        k |= K.LOSS
    if _GRAD_NAME.match(name):
        k |= K.GRAD
    return k


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


class Scope:
    """A module, class or function body: its simple assignments and what it defines."""

    __slots__ = (
        "assigns",
        "attrs",
        "classes",
        "cls",
        "functions",
        "guarded",
        "inplace",
        "kind",
        "name",
        "node",
        "parent",
        "returns",
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


class Site(NamedTuple):
    """Where a node was found."""

    scope: Scope
    loops: tuple[ast.AST, ...]
    comps: tuple[ast.comprehension, ...]
    no_grad: bool


_Entry = tuple[tuple[int, int], "ast.expr | None", Scope]


class FileContext:
    """Everything known about one parsed module; built by one walk in ``__init__``."""

    def __init__(self, tree: ast.Module, wanted: frozenset[type[ast.AST]]) -> None:
        self.imports: dict[str, str] = {}
        self.idents: set[str] = set()
        self.strings: set[str] = set()
        self.sites: list[tuple[ast.AST, Site]] = []
        self.zero_loops: set[int] = set()
        self.zero_funcs: set[str] = set()
        self.loop_calls: dict[int, set[str]] = {}
        self.module = Scope("module", "<module>", None, tree)
        self._wanted = wanted
        self._scope = self.module
        self._loops: tuple[ast.AST, ...] = ()
        self._comps: tuple[ast.comprehension, ...] = ()
        self._no_grad = False
        self._func_names: tuple[str, ...] = ()
        self._site = Site(self.module, (), (), False)
        self._memo: dict[int, int] = {}
        self._active: set[int] = set()
        self._summaries: dict[int, int] = {}
        self._parts: dict[int, tuple[str | None, str | None, ast.expr | None]] = {}
        self._walk(tree)

    # ------------------------------------------------------------------ the walk

    def _set(self) -> None:
        self._site = Site(self._scope, self._loops, self._comps, self._no_grad)

    def _walk(self, node: ast.AST) -> None:
        t = type(node)
        if t in self._wanted:
            self.sites.append((node, self._site))
        handler: Callable[[FileContext, ast.AST], None] | None = _HANDLERS.get(t)
        if handler is not None:
            handler(self, node)
            return
        for child in ast.iter_child_nodes(node):
            self._walk(child)

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
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                scope.assigns.setdefault(arg.arg, []).append((pos, None, scope))
        saved = (self._scope, self._loops, self._comps, self._no_grad, self._func_names)
        self._scope, self._loops, self._comps = scope, (), ()
        self._no_grad = no_grad
        self._func_names = (*self._func_names, name)
        self._set()
        if isinstance(node, ast.Lambda):
            scope.returns.append(node.body)
            self._walk(node.body)
        else:
            for stmt in node.body:
                self._walk(stmt)
        self._scope, self._loops, self._comps, self._no_grad, self._func_names = saved
        self._set()

    def _v_class(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self._walk(expr)
        outer = self._scope
        scope = Scope("class", node.name, outer, node)
        outer.classes[node.name] = scope
        saved = self._scope, self._loops
        self._scope, self._loops = scope, ()
        self._set()
        for stmt in node.body:
            self._walk(stmt)
        self._scope, self._loops = saved
        self._set()

    def _v_loop(self, node: ast.For | ast.AsyncFor | ast.While) -> None:
        if isinstance(node, ast.While):
            self._walk(node.test)
        else:
            self._walk(node.iter)
            self._bind(node.target, None, (node.lineno, node.col_offset))
            self._walk(node.target)
        saved = self._loops
        self._loops = (*saved, node)
        self._set()
        for stmt in node.body:
            self._walk(stmt)
        self._loops = saved
        self._set()
        for stmt in node.orelse:
            self._walk(stmt)

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
        for stmt in node.body:
            self._walk(stmt)
        self._no_grad = saved
        self._set()

    def _v_assign(self, node: ast.Assign) -> None:
        self._walk(node.value)
        end = (node.end_lineno or node.lineno, node.end_col_offset or 0)
        value = node.value if len(node.targets) == 1 else None
        for target in node.targets:
            self._bind(target, value, end)
            self._walk(target)

    def _v_annassign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._walk(node.value)
            self._bind(node.target, node.value, (node.end_lineno or node.lineno, 0))
        self._walk(node.target)

    def _v_augassign(self, node: ast.AugAssign) -> None:
        self._walk(node.value)
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
            self._walk(node.value)

    def _v_comp(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        gens = node.generators
        if gens:
            self._walk(gens[0].iter)
        saved = self._comps
        for i, gen in enumerate(gens):
            if i:
                self._walk(gen.iter)
            self._comps = (*self._comps, gen)
            self._set()
            self._walk(gen.target)
            for cond in gen.ifs:
                self._walk(cond)
        if isinstance(node, ast.DictComp):
            self._walk(node.key)
            self._walk(node.value)
        else:
            self._walk(node.elt)
        self._comps = saved
        self._set()

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

    def _v_attribute(self, node: ast.Attribute) -> None:
        self.idents.add(node.attr)
        self._walk(node.value)

    def _v_keyword(self, node: ast.keyword) -> None:
        if node.arg:
            self.idents.add(node.arg)
        self._walk(node.value)

    def _v_constant(self, node: ast.Constant) -> None:
        if type(node.value) is str and node.value in _INTERESTING_STRINGS:
            self.strings.add(node.value)

    def _v_call(self, node: ast.Call) -> None:
        func = node.func
        if self._loops:
            name = None
            if isinstance(func, ast.Name):
                name = func.id
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                name = func.attr if func.value.id == "self" else None
            if name is not None:
                for loop in self._loops:
                    self.loop_calls.setdefault(id(loop), set()).add(name)
        if isinstance(func, ast.Attribute):
            attr = func.attr
            if attr in INPLACE_METHODS:
                root = inplace_root(node)
                key = ref_key(root) if root is not None else None
                if key is not None:
                    self._scope.inplace.setdefault(key, []).append(node)
            if attr in _ZERO_GRAD_ATTRS or (
                attr in ("zero_", "fill_", "detach_") and _mentions_grad(func.value)
            ):
                self._mark_zero()
        self._children(node)

    def _v_delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "grad":
                self._mark_zero()
        self._children(node)

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
    ) -> _Entry | ast.comprehension | None:
        for comp in reversed(comps):
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(comp.target)):
                return comp
        s: Scope | None = scope
        while s is not None:
            if s.kind == "class" and s is not scope:
                s = s.parent
                continue
            entries = s.assigns.get(name)
            if entries:
                if s is scope:
                    before = [e for e in entries if e[0] <= pos]
                    return before[-1] if before else None
                return entries[-1]
            s = s.parent
        return None

    def inplace_updates(self, key: str, scope: Scope) -> list[ast.Call]:
        """The in-place update calls on ``key`` in the nearest scope (outwards) that has any."""
        s: Scope | None = scope
        while s is not None:
            if s.kind == "class" and s is not scope:
                s = s.parent
                continue
            calls = s.inplace.get(key)
            if calls:
                return calls
            s = s.parent
        return []

    def is_guarded(self, name: str, scope: Scope) -> bool:
        s: Scope | None = scope
        while s is not None:
            if name in s.guarded:
                return True
            s = s.parent
        return False

    def self_attr(self, attr: str, scope: Scope) -> _Entry | None:
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
            entry: _Entry | ast.comprehension | None = None
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
            if _PROB_NAME.match(e.id):
                k |= K.PROB
            elif _LOGIT_NAME.match(e.id):
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
        if not k and _LOGIT_NAME.match(attr):
            k = K.LINEAR
        return k

    def _callee_kind(self, func: ast.expr, scope: Scope) -> int:
        """What calling ``func`` yields, as value flags."""
        fk = self.kind(func, scope)
        k = 0
        for fn_bit, val_bit in _FN_TO_VALUE:
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
                for val_bit, fn_bit in _VALUE_TO_FN:
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
            if last in _CLAMPS:
                inner = self.kind(subject, scope, comps) if last != "where" else 0
                return K.SAFE | (inner & (K.PROBS | K.ARITH))
            if recv is not None and last in _PASS_METHODS:
                k = self.kind(recv, scope, comps) & (K.CARRY | K.MODEL | K.OPTIM | K.CONST)
                k |= self._callee_bits(recv, scope) if k & K.MODEL else 0
                if last == "half" or (last in ("to", "type") and _mentions_half(e)):
                    k |= K.HALF
                elif last in ("float", "double", "bfloat16") or (
                    last in ("to", "type") and _mentions_float(e)
                ):
                    k &= ~K.HALF
                return k
            if recv is None and last in _PASS_FUNCS:
                return self.kind(arg0, scope, comps) & K.CARRY
            if last in _LINEAR_FUNCS:
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
            if last in _SUM_FUNCS or last in _MEAN_FUNCS:
                inner = self.kind(subject, scope, comps)
                k = inner & (K.LOSS | K.HALF | K.GRAD)
                if inner & (K.SQUARE | K.SUMSQ):
                    k |= K.SUMSQ
                elif last in _SUM_FUNCS:
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
            if last in _LOSS_FUNCS:
                return K.LOSS | (K.SUMSQ if last in _MSE_NAMES else 0)
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
        if last in _LINEAR_LAYERS or last == "Activation":
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
        if last in _MSE_NAMES:
            return K.FN_MSE | K.FN_LOSS
        if last.endswith("Loss") or last in _KERAS_LOSSES:
            return K.FN_LOSS
        if last in _OPTIMIZERS:
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


def is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_no_grad(expr: ast.AST) -> bool:
    target = expr.func if isinstance(expr, ast.Call) else expr
    return isinstance(target, (ast.Attribute, ast.Name)) and (
        getattr(target, "attr", None) or getattr(target, "id", None)
    ) in ("no_grad", "inference_mode")


def _mentions_grad(expr: ast.AST) -> bool:
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if isinstance(expr, ast.Attribute) and expr.attr == "grad":
            return True
        expr = expr.value
    return False


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


_HANDLERS: dict[type[ast.AST], Any] = {
    ast.FunctionDef: FileContext._v_function,
    ast.AsyncFunctionDef: FileContext._v_function,
    ast.Lambda: FileContext._v_function,
    ast.ClassDef: FileContext._v_class,
    ast.For: FileContext._v_loop,
    ast.AsyncFor: FileContext._v_loop,
    ast.While: FileContext._v_loop,
    ast.With: FileContext._v_with,
    ast.AsyncWith: FileContext._v_with,
    ast.Assign: FileContext._v_assign,
    ast.AnnAssign: FileContext._v_annassign,
    ast.AugAssign: FileContext._v_augassign,
    ast.NamedExpr: FileContext._v_namedexpr,
    ast.Return: FileContext._v_return,
    ast.ListComp: FileContext._v_comp,
    ast.SetComp: FileContext._v_comp,
    ast.GeneratorExp: FileContext._v_comp,
    ast.DictComp: FileContext._v_comp,
    ast.Import: FileContext._v_import,
    ast.ImportFrom: FileContext._v_importfrom,
    ast.Name: FileContext._v_name,
    ast.Attribute: FileContext._v_attribute,
    ast.keyword: FileContext._v_keyword,
    ast.Constant: FileContext._v_constant,
    ast.Call: FileContext._v_call,
    ast.Delete: FileContext._v_delete,
}
