"""L003 division-without-epsilon: division by a norm, standard deviation, sum or count with no
epsilon.

What it does
    Flags `x / d`, `x /= d`, `torch.div(x, d)`, `np.divide(x, d)` and `x.div(d)` where `d` is a
    norm (`x.norm()`, `np.linalg.norm`, `tf.norm`, `sqrt(sum(x ** 2))`), a product of norms (a
    hand-written cosine similarity), a standard deviation (`x.std()`, `np.std`, `sqrt(var)`), or a
    sum or count (`mask.sum()`, `np.count_nonzero`), with nothing keeping it away from zero. It
    follows values as L001 does, so `n = x.norm(dim=-1, keepdim=True)` then `x / n` is flagged,
    and so is `p.div_(neuron_norm(p))` with a helper returning a norm.

    What keeps a denominator away from 0: an epsilon that is a positive constant (`n + 1e-8`,
    `n + eps`, `n + self.eps`; `x.sum() + y` is still a sum), a clamp (`n.clamp(min=eps)`,
    `max(n, 1)`), `where(n == 0, 1, n)`, a boolean mask that looks at it (`t[v] / n[v]` with
    `v = n > 0`), a patch (`s[s == 0] = 1`), a test on the path (`if n > 0:`, an earlier
    `if n == 0: return` / `break` / `raise`, `assert n > 0`, `x / n if n else 0`), a later
    `r = where(n > 0, r, 1)` that replaces the result, a `try` catching `ZeroDivisionError`, or
    a value positive by construction (a length, a constant, a sum of exps or probabilities, a
    random draw, a mask joined with ones). In data loading, metrics and inference code
    (`__getitem__`, `evaluate`, `data/`, `metrics.py`, under `no_grad`) it asks for less: any
    test of the denominator anywhere in the function, NaN-aware code (`nanmean`, `isnan`,
    `errstate`) or weights made into a distribution (`w / w.sum()`) is enough. It also flags an
    epsilon set to zero where a library divides for you: `eps=0` (`epsilon=0`) given to an
    adaptive optimizer (`Adam`, `AdamW`, `RMSprop`, `Adagrad`, ...) or a normalisation layer,
    and `optax.cosine_similarity` / `cosine_distance`, whose `epsilon` defaults to 0. `--fix`
    adds an epsilon to a norm or a standard deviation that is divided by, removes `eps=0` and
    passes `epsilon=1e-12` to optax.

Why is this bad?
    A zero vector has norm 0, a constant feature or a batch of identical rows has standard
    deviation 0, and an all-padding batch has a mask sum of 0. Then `0 / 0` is NaN in the forward
    pass, and even a denominator that is only close to 0 makes the gradient huge. An adaptive
    optimizer divides by the root of its second moment, which is exactly 0 for a weight whose
    gradient has always been 0 (an unused input, a dead unit): with `eps=0` its first step is
    `0 / 0`. This is the `zero_division` cause.

Example
    ```python
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    x = (x - x.mean(0)) / x.std(0)
    loss = (loss * mask).sum() / mask.sum()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=0)
    ```

Use instead
    ```python
    cos = F.cosine_similarity(a, b, dim=-1, eps=1e-8)   # or F.normalize(x, dim=-1)
    x = (x - x.mean(0)) / (x.std(0) + 1e-8)
    loss = (loss * mask).sum() / mask.sum().clamp(min=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)   # the default eps=1e-8
    ```
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from nanscope.lint._types import Edit, Hit, Rule
from nanscope.lint.fixes import insert_after, plus_epsilon, remove_keyword
from nanscope.lint.inference import FileContext
from nanscope.lint.ranking import QUIET_PLACES, place_of
from nanscope.lint.scopes import Site, keyword, same_expr
from nanscope.lint.vocabulary import K

_DIV_FUNCS = frozenset({"div", "divide", "true_divide", "truediv", "realdiv", "div_"})
#: constructors that divide by a running root-mean-square or a deviation, guarded by their eps
_EPS_GUARDED = frozenset({
    "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "SparseAdam",
    "adam", "adamw", "rmsprop", "adagrad", "Nadam", "LayerNorm", "BatchNorm1d", "BatchNorm2d",
    "BatchNorm3d", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "RMSNorm",
    "LayerNormalization", "BatchNormalization",
})  # fmt: skip


#: (library, function) -> its epsilon keyword, for library functions that divide by a norm with
#: an epsilon of 0 unless given one
_ZERO_BY_DEFAULT = {
    ("optax", "cosine_similarity"): "epsilon",
    ("optax", "cosine_distance"): "epsilon",
}


class DivisionWithoutEpsilon(Rule):
    """Division by a norm, standard deviation, sum or count with no epsilon."""

    code = "L003"
    name = "division-without-epsilon"
    fix = "add an epsilon to the denominator (d + eps) or clamp it (d.clamp(min=eps))"
    node_types = (ast.BinOp, ast.AugAssign, ast.Call)

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        denominator: ast.expr | None = None
        numerator: ast.expr | None = None
        if isinstance(node, (ast.BinOp, ast.AugAssign)):
            if isinstance(node.op, ast.Div):
                denominator = node.right if isinstance(node, ast.BinOp) else node.value
                numerator = node.left if isinstance(node, ast.BinOp) else node.target
        elif isinstance(node, ast.Call):
            root, last, recv = ctx.func_parts(node)
            if last in _EPS_GUARDED:
                yield from _zero_eps(node, last, ctx.source)
                return
            default = _ZERO_BY_DEFAULT.get((root or "", last or ""))
            if default is not None:
                yield from _zero_default(node, last or "", default, ctx)
                return
            if last in _DIV_FUNCS:
                if recv is not None and node.args:
                    denominator = node.args[0]
                elif root in ("torch", "numpy", "tensorflow", "jax") and len(node.args) > 1:
                    denominator = node.args[1]
        if denominator is None:
            return
        k = ctx.kind(denominator, site.scope, site.comps)
        if k & K.SAFE or not k & K.ZERO or ctx.guards.looked_after(denominator, site):
            return
        if place_of(self.code, site, ctx) in QUIET_PLACES and (
            ctx.guards.bounded_somewhere(denominator, site)
            or _self_normalising(numerator, denominator, site, ctx)
        ):
            return  # data, metrics, inference: only a denominator nothing bounds
        # an operand of `/` needs parentheses; the right of `/=` and an argument do not
        operand = isinstance(node, ast.BinOp)
        if k & K.NORM:
            edit = plus_epsilon(denominator, ctx.source, "1e-12", operand=operand)
            yield Hit(
                node,
                "division by a norm with no epsilon: 0/0 = NaN for a zero vector",
                "divide by (norm + eps), or F.normalize(x, dim=-1) / F.cosine_similarity / "
                "tf.math.l2_normalize",
                (edit,) if edit is not None and ctx.source else (),
            )
        elif k & K.STD:
            edit = plus_epsilon(denominator, ctx.source, "1e-8", operand=operand)
            yield Hit(
                node,
                "division by a standard deviation with no epsilon: NaN for a constant input",
                "divide by (std + eps), or replace zero deviations first (s[s == 0] = 1)",
                (edit,) if edit is not None and ctx.source else (),
            )
        else:
            yield Hit(
                node,
                "division by a sum or count with no epsilon: 0/0 = NaN when it is empty",
                "divide by s.clamp(min=1) / max(s, 1) or (s + eps)",
            )


def _self_normalising(
    numerator: ast.expr | None, denominator: ast.expr, site: Site, ctx: FileContext
) -> bool:
    """``w / w.sum()``, ``p /= np.sum(p)``, ``x.max(axis) / x.sum(axis)``: a share of its own
    total, 0 only when everything is (then there is nothing to share)."""
    if numerator is None:
        return False
    summed = _summed(denominator, site, ctx)
    if summed is None:
        return False
    base = _bare(numerator, ctx)
    if isinstance(base, ast.Name):
        value, _ = ctx.value_of(base, site.scope)
        # `max_p = x.max(axis)`: the numerator is itself a reduction of the summed array
        if isinstance(value, ast.Call) and ctx.func_parts(value)[1] in _REDUCTIONS:
            base = _bare(_subject(value, ctx) or base, ctx)
    return same_expr(_bare(summed, ctx), base)


_REDUCTIONS = frozenset({"max", "amax", "min", "amin", "sum", "nansum", "mean"})


def _subject(call: ast.Call, ctx: FileContext) -> ast.expr | None:
    _root, _last, recv = ctx.func_parts(call)
    return recv if recv is not None else (call.args[0] if call.args else None)


def _summed(denominator: ast.expr, site: Site, ctx: FileContext) -> ast.expr | None:
    """``x`` when the denominator is ``x.sum(...)`` / ``np.sum(x)`` or a name bound to one."""
    if isinstance(denominator, ast.Name):
        denominator, _ = ctx.value_of(denominator, site.scope)
    if not isinstance(denominator, ast.Call):
        return None
    if ctx.func_parts(denominator)[1] not in ("sum", "nansum"):
        return None
    return _subject(denominator, ctx)


def _bare(expr: ast.expr, ctx: FileContext) -> ast.expr:
    """``x`` of ``x.float()``, ``x.type(dtype)``, ``x.to(device)``."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        if expr.func.attr not in ("float", "double", "type", "to", "type_as", "astype", "detach"):
            break
        expr = expr.func.value
    return expr


def _zero_default(node: ast.Call, name: str, keyword_name: str, ctx: FileContext) -> Iterator[Hit]:
    """``optax.cosine_similarity(a, b)``: its ``epsilon`` defaults to 0."""
    given = keyword(node, keyword_name)
    if given is not None and not (
        isinstance(given, ast.Constant)
        and isinstance(given.value, (int, float))
        and not given.value
    ):
        return
    edits: tuple[Edit, ...] = ()
    if given is None and ctx.source and (node.args or node.keywords):
        last_arg = max(
            [*node.args, *(k.value for k in node.keywords)],
            key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0),
        )
        edits = (insert_after(last_arg, f", {keyword_name}=1e-12"),)
    yield Hit(
        node,
        f"{name} has {keyword_name}=0 by default: 0/0 = NaN for a zero vector",
        f"pass {keyword_name}=1e-12 (it clips the squared norms)",
        edits,
    )


def _zero_eps(node: ast.Call, name: str | None, source: str) -> Iterator[Hit]:
    for kw in node.keywords:
        value = kw.value
        zero = (
            kw.arg in ("eps", "epsilon")
            and isinstance(value, ast.Constant)
            and type(value.value) in (int, float)
            and value.value == 0
        )
        if zero:
            edit = remove_keyword(node, kw, source) if source else None
            yield Hit(
                node,
                f"{name} with {kw.arg}=0 divides 0 by 0 where a statistic is 0",
                f"keep the default {kw.arg} (1e-8 for optimizers, 1e-5 for norm layers)",
                (edit,) if edit is not None else (),
            )
