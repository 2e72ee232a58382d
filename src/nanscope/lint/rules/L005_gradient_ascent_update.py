"""L005 gradient-ascent-update: a hand-written update that adds the gradient to the weights
(gradient ascent).

What it does
    Flags updates that move the weights *along* the gradient: `w += lr * g`,
    `w = w + lr * grad`, `w -= -lr * g`, `p.data.add_(lr * p.grad)`,
    `p.add_(p.grad, alpha=lr)`, `w.assign_add(lr * g)` (TensorFlow). A factor counts as the
    gradient when it is `.grad`, a variable assigned from one, or is named like one (`g`, `grad`,
    `dw`, `grad_w`...); as the step size when it is a number or named like one (`lr`, `eta`,
    `learning_rate`, `group["lr"]`). `w -= lr * g`, `w = w - lr * g` and
    `p.add_(p.grad, alpha=-lr)` are the descent forms and are not flagged.

    Momentum and velocity buffers are followed to the gradient they accumulate, with its sign:
    `v = mu * v + g`, `v += g`, `buf.mul_(m).add_(p.grad)`, `m.lerp_(g, 1 - b)`,
    `m.assign(b * m + g)` hold `+g`, so `w += lr * v`, `p.add_(buf, alpha=lr)`,
    `p.data.add_(lr * buf)` and `p.addcdiv_(exp_avg, denom, value=step_size)` are ascent, while
    `w -= lr * v`, `p.add_(buf, alpha=-lr)` and `p.sub_(lr * buf)` are descent. A buffer that
    already holds the step size is the step: `v = mu * v + lr * g; w += v` is ascent,
    `v = mu * v - lr * g; w += v` and `v = mu * v + lr * g; w -= v` are descent. The buffers
    themselves and running sums are never the weights being checked. A step proportional to the
    weights themselves (`p.add_(p, alpha=-lr * wd)`, `w += -wd * w`) is weight decay, whatever
    its sign.

Why is this bad?
    Gradient descent subtracts the gradient. Adding it climbs the loss: the loss rises smoothly and
    steadily from the very first update, with no oscillation, until it overflows. This is the
    `update_sign_error` cause, one of the most common bugs in hand-written fitting code and easy to
    mistake for a learning rate that is too large.

Example
    ```python
    grad = X.T @ (X @ w - y) / len(y)
    w += lr * grad

    for p in model.parameters():
        p.data.add_(lr * p.grad)

    buf.mul_(momentum).add_(p.grad)    # a custom momentum optimizer
    p.add_(buf, alpha=group["lr"])
    ```

Use instead
    ```python
    w -= lr * grad

    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)     # or p -= lr * p.grad under torch.no_grad()

    buf.mul_(momentum).add_(p.grad)
    p.add_(buf, alpha=-group["lr"])
    ```
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from nanscope.lint._types import Hit, Rule
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Scope, Site, keyword, ref_key, same_expr
from nanscope.lint.vocabulary import K, name_kind

_LR = re.compile(
    r"^(lr|eta|alpha|learning_?rate|step_?size|lr_\w+|\w+_lr|learning_rate_\w+)$", re.I
)
#: targets that accumulate rather than hold weights (momentum buffers, running sums, gradients)
_NOT_WEIGHTS = re.compile(
    r"^(v|vel\w*|m|mom\w*|buf\w*|cache\w*|acc\w*|sum\w*|total\w*|running\w*|ema\w*|avg\w*|"
    r"mean\w*|s|r|h|state\w*|update\w*|delta\w*|step\w*|exp_avg\w*|m_\w+|v_\w+|sq\w*|"
    r"loss\w*|cost\w*|score\w*|reward\w*|ret\w*|value\w*|q\w*|count\w*|n)$",
    re.I,
)
#: a first-moment estimate is a gradient for the purpose of the sign (hand-written Adam)
_MOMENT = re.compile(r"^(m|m_?hat|m_?t|mt|exp_avg|m_corr\w*|first_moment\w*)$", re.I)
_ADD_METHODS = frozenset({"add_", "assign_add"})
_SUB_METHODS = frozenset({"sub_", "assign_sub"})
_SCALED_METHODS = frozenset({"addcdiv_", "addcmul_"})


def _base_name(expr: ast.AST) -> str | None:
    while True:
        if (isinstance(expr, ast.Attribute) and expr.attr == "data") or isinstance(
            expr, ast.Subscript
        ):
            expr = expr.value
        else:
            break
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _factors(expr: ast.expr, sign: int = 1) -> tuple[int, list[ast.expr]]:
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return _factors(expr.operand, -sign)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.MatMult)):
        s1, f1 = _factors(expr.left)
        s2, f2 = _factors(expr.right)
        return sign * s1 * s2, f1 + f2
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        s1, f1 = _factors(expr.left)
        s2, _ = _factors(expr.right)
        return sign * s1 * s2, f1
    value = expr.value if isinstance(expr, ast.Constant) else None
    if isinstance(value, (int, float)) and value < 0:
        return -sign, [ast.Constant(value=-value)]
    return sign, [expr]


def _decays(increment: ast.expr, target: ast.AST) -> bool:
    """``p.add_(p, alpha=-wd)``, ``w += -wd * w``: a step proportional to the weights themselves
    is weight decay, whatever its sign, not a step along the gradient."""
    key = ref_key(target)
    if key is None:
        return False
    return any(ref_key(f) == key for f in _factors(increment)[1])


def _scaled_product(call: ast.Call) -> ast.expr | None:
    """``x.addcdiv_(t1, t2, value=v)`` adds ``v * t1 / t2``, ``x.addcmul_(t1, t2, value=v)``
    adds ``v * t1 * t2``: the product whose sign is the step's (a divisor is a positive
    ``sqrt(v) + eps``). None for ``addcmul_(g, g)``, a square with no direction."""
    func = call.func
    assert isinstance(func, ast.Attribute)
    if len(call.args) < 2:
        return None
    t1, t2 = call.args[0], call.args[1]
    product: ast.expr = t1
    if func.attr == "addcmul_":
        if same_expr(t1, t2):
            return None
        product = ast.BinOp(left=t1, op=ast.Mult(), right=t2)
    value = keyword(call, "value")
    if value is None and len(call.args) > 2:
        value = call.args[2]
    if value is not None:
        product = ast.BinOp(left=product, op=ast.Mult(), right=value)
    return product


def _mentions(expr: ast.AST, key: str) -> bool:
    return any(
        isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)) and ref_key(n) == key
        for n in ast.walk(expr)
    )


def _rebind_terms(value: ast.expr, key: str) -> list[tuple[int, ast.expr]]:
    """``v = mu * v + g`` -> [(+1, g)]; ``v = mu * v - g`` -> [(-1, g)]; else []."""
    if not isinstance(value, ast.BinOp) or not isinstance(value.op, (ast.Add, ast.Sub)):
        return []
    left, right = _mentions(value.left, key), _mentions(value.right, key)
    if left and not right:
        return [(-1 if isinstance(value.op, ast.Sub) else 1, value.right)]
    if right and not left and isinstance(value.op, ast.Add):
        return [(1, value.left)]
    return []


def _inplace_terms(call: ast.Call, key: str) -> list[tuple[int, ast.expr]]:
    """What an in-place update on buffer ``key`` adds to it, with the sign it is added with."""
    func = call.func
    assert isinstance(func, ast.Attribute)
    method = func.attr
    if method in ("add_", "sub_", "assign_add", "assign_sub") and call.args:
        term: ast.expr = call.args[0]
        for kw in call.keywords:
            if kw.arg in ("alpha", "value"):
                term = ast.BinOp(left=term, op=ast.Mult(), right=kw.value)
        return [(-1 if method in _SUB_METHODS else 1, term)]
    if method in ("lerp_", "copy_") and call.args:
        return [(1, call.args[0])]
    if method in _SCALED_METHODS:
        product = _scaled_product(call)
        return [(1, product)] if product is not None else []
    if method == "assign" and call.args:
        return _rebind_terms(call.args[0], key)
    return []  # mul_ / div_ rescale


class GradientAscentUpdate(Rule):
    """A hand-written update that adds the gradient to the weights (gradient ascent)."""

    code = "L005"
    name = "gradient-ascent-update"
    fix = "subtract the step: w -= lr * g (w = w - lr * g, p.add_(p.grad, alpha=-lr))"
    node_types = (ast.AugAssign, ast.Assign, ast.Call)

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        target: ast.AST | None = None
        sign = 0
        if isinstance(node, ast.AugAssign):
            target = node.target
            if _decays(node.value, target):
                return
            if isinstance(node.op, ast.Add):
                sign = self._sign(node.value, site, ctx)
            elif isinstance(node.op, ast.Sub):
                sign = -self._sign(node.value, site, ctx)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            sign = self._assign_sign(target, node.value, site, ctx)
        elif isinstance(node, ast.Call):
            _root, last, recv = ctx.func_parts(node)
            if recv is None:
                return
            target = recv
            if last in _ADD_METHODS or last in _SUB_METHODS:
                parts: list[ast.expr] = list(node.args)
                for kw in node.keywords:
                    if kw.arg in ("alpha", "value"):
                        parts.append(kw.value)
                if not parts:
                    return
                product: ast.expr = parts[0]
                for extra in parts[1:]:
                    product = ast.BinOp(left=product, op=ast.Mult(), right=extra)
                if _decays(product, recv):
                    return
                sign = self._sign(product, site, ctx)
                if last in _SUB_METHODS:
                    sign = -sign
            elif last in _SCALED_METHODS:
                scaled = _scaled_product(node)
                if scaled is None:
                    return
                sign = self._sign(scaled, site, ctx)
            elif last == "assign" and node.args:
                sign = self._assign_sign(recv, node.args[0], site, ctx)
        if sign <= 0 or target is None:
            return
        name = _base_name(target)
        if name is None or _NOT_WEIGHTS.match(name) or self._is_gradient(target, site, ctx):
            return
        yield Hit(
            node,
            "update adds lr * gradient to the weights: gradient ascent",
        )

    def _is_gradient(self, target: ast.AST, site: Site, ctx: FileContext) -> bool:
        """Whether the updated object holds a gradient (``g += ...``, ``p.grad.add_(...)``).

        A weight's own earlier updates (``w -= lr * g``) do not make it a gradient: for a plain
        name the value looked at is the last assignment that does not mention the name itself.
        """
        base = target
        while (isinstance(base, ast.Attribute) and base.attr == "data") or isinstance(
            base, ast.Subscript
        ):
            base = base.value
        if not isinstance(base, ast.Name):
            return bool(ctx.kind(target, site.scope) & K.GRAD)
        if name_kind(base.id) & K.GRAD:
            return True
        pos = (base.lineno, base.col_offset)
        scope: Scope | None = site.scope
        while scope is not None:
            if scope.kind == "class" and scope is not site.scope:
                scope = scope.parent
                continue
            entries = scope.assigns.get(base.id)
            if entries:
                if scope is site.scope:
                    entries = [e for e in entries if e[0] <= pos]
                for _end, value, vscope in reversed(entries):
                    if value is None:
                        return False
                    if not _mentions(value, base.id):
                        return bool(ctx.kind(value, vscope) & K.GRAD)
                return False
            scope = scope.parent
        return False

    def _assign_sign(self, target: ast.AST, value: ast.expr, site: Site, ctx: FileContext) -> int:
        if not isinstance(value, ast.BinOp):
            return 0
        if isinstance(value.op, ast.Add):
            if same_expr(value.left, target):
                return self._sign(value.right, site, ctx)
            if same_expr(value.right, target):
                return self._sign(value.left, site, ctx)
        elif isinstance(value.op, ast.Sub) and same_expr(value.left, target):
            return -self._sign(value.right, site, ctx)
        return 0

    def _sign(self, inc: ast.expr, site: Site, ctx: FileContext) -> int:
        """+1 when ``inc`` is a positive lr * gradient, -1 when negative, 0 when not a step."""
        sign, has_lr, has_grad = self._analyse(inc, site, ctx, 0)
        return sign if has_lr and has_grad else 0

    def _analyse(
        self, inc: ast.expr, site: Site, ctx: FileContext, depth: int
    ) -> tuple[int, bool, bool]:
        """``(sign, has a step size, has a gradient)`` of an increment."""
        if isinstance(inc, ast.Name):
            acc = self._accumulated(inc, site, ctx, depth)
            if acc is not None:
                return acc[0], acc[1], True
            value, _ = ctx.value_of(inc, site.scope, site.comps)
            if value is not inc:
                got = self._analyse_factors(value, site, ctx, depth)
                if got[2]:  # `step = lr * g`; else `g = view_as_real(g)` is still a gradient
                    return got
        return self._analyse_factors(inc, site, ctx, depth)

    def _analyse_factors(
        self, inc: ast.expr, site: Site, ctx: FileContext, depth: int
    ) -> tuple[int, bool, bool]:
        sign, factors = _factors(inc)
        has_lr = has_grad = inner_lr = False
        for f in factors:
            if self._is_lr(f, site, ctx):
                has_lr = True
                continue
            if has_grad:
                continue
            acc = self._accumulated(f, site, ctx, depth)
            if acc is not None:
                has_grad = True
                sign *= acc[0]
                inner_lr = acc[1]
            elif ctx.kind(f, site.scope, site.comps) & K.GRAD or _MOMENT.match(_base_name(f) or ""):
                has_grad = True
                value, _ = ctx.value_of(f, site.scope, site.comps)
                if value is not f:
                    s, inner = _factors(value)
                    sign *= s
                    inner_lr = any(self._is_lr(x, site, ctx) for x in inner)
        if inner_lr:
            # the gradient or buffer already holds the step size; scaled by one again, it is more
            # likely a value from another branch (`if ...: g = -lr * g` / `else: ...`) than a step
            if has_lr:
                return 0, False, False
            has_lr = True
        return sign, has_lr, has_grad

    def _accumulated(
        self, f: ast.expr, site: Site, ctx: FileContext, depth: int
    ) -> tuple[int, bool] | None:
        """A momentum / velocity buffer accumulated from the gradient: ``(sign, holds lr)``.

        The sign is the one the gradient enters the buffer with: ``v = mu * v + g``,
        ``v += g``, ``buf.mul_(m).add_(g)``, ``buf.add_(g, alpha=1 - d)``,
        ``m.lerp_(g, 1 - b)``, ``v.assign(mu * v + g)`` are +1; ``v = mu * v - lr * g`` and
        ``buf.mul_(m).add_(g, alpha=-lr)`` are -1 (and hold the step size). Following simple
        aliases (``d_p = buf``). None when ``f`` is not such a buffer or the updates disagree.
        """
        if depth > 2:
            return None
        scope, comps = site.scope, site.comps
        for _ in range(8):
            key = ref_key(f)
            if key is None:
                return None
            terms: list[tuple[int, ast.expr]] = []
            for call in ctx.inplace_updates(key, scope):
                terms.extend(_inplace_terms(call, key))
            if not terms and isinstance(f, ast.Name):
                entry = ctx.lookup(f.id, scope, (f.lineno, f.col_offset), comps)
                if not isinstance(entry, tuple) or entry[1] is None:
                    return None
                value = entry[1]
                if ref_key(value) is not None:  # an alias: follow it
                    f, scope, comps = value, entry[2], ()
                    site = Site(scope, site.loops, (), site.no_grad)
                    continue
                terms = _rebind_terms(value, key)
            if not terms:
                return None
            signs: set[int] = set()
            lrs: set[bool] = set()
            for outer, term in terms:
                s, has_lr, has_grad = self._analyse(term, site, ctx, depth + 1)
                if has_grad:
                    signs.add(outer * s)
                    lrs.add(has_lr)
            if len(signs) != 1:
                return None
            return signs.pop(), all(lrs)
        return None

    def _is_lr(self, f: ast.expr, site: Site, ctx: FileContext) -> bool:
        if isinstance(f, ast.Constant):
            value = f.value
            return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1
        if isinstance(f, ast.Name):
            return bool(_LR.match(f.id))
        if isinstance(f, ast.Attribute):
            return bool(_LR.match(f.attr))
        if isinstance(f, ast.Subscript):
            key = f.slice
            return (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and bool(_LR.match(key.value))
            )
        return False
