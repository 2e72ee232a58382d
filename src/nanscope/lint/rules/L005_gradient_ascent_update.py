from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from nanscope.lint._analysis import FileContext, K, Site, same_expr
from nanscope.lint._types import Hit, Rule

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


class GradientAscentUpdate(Rule):
    """A hand-written update that adds the gradient to the weights (gradient ascent).

    ## What it does
    Flags updates that move the weights *along* the gradient: `w += lr * g`,
    `w = w + lr * grad`, `w -= -lr * g`, `p.data.add_(lr * p.grad)`,
    `p.add_(p.grad, alpha=lr)`, `w.assign_add(lr * g)` (TensorFlow). A factor counts as the
    gradient when it is `.grad`, a variable assigned from one, or is named like one (`g`, `grad`,
    `dw`, `grad_w`...); as the step size when it is a number or named like one (`lr`, `eta`,
    `learning_rate`, `group["lr"]`). `w -= lr * g`, `w = w - lr * g` and
    `p.add_(p.grad, alpha=-lr)` are the descent forms and are not flagged, nor are momentum
    buffers and running sums (`v = mu * v + lr * g; w -= v`).

    ## Why is this bad?
    Gradient descent subtracts the gradient. Adding it climbs the loss: the loss rises smoothly and
    steadily from the very first update, with no oscillation, until it overflows. This is the
    `update_sign_error` cause, one of the most common bugs in hand-written fitting code and easy to
    mistake for a learning rate that is too large.

    ## Example
    ```python
    grad = X.T @ (X @ w - y) / len(y)
    w += lr * grad

    for p in model.parameters():
        p.data.add_(lr * p.grad)
    ```

    ## Use instead
    ```python
    w -= lr * grad

    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)     # or p -= lr * p.grad under torch.no_grad()
    ```
    """

    code = "L005"
    name = "gradient-ascent-update"
    fix = "subtract the step: w -= lr * g (w = w - lr * g, p.add_(p.grad, alpha=-lr))"
    node_types = (ast.AugAssign, ast.Assign, ast.Call)

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        target: ast.AST | None = None
        sign = 0
        if isinstance(node, ast.AugAssign):
            target = node.target
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
                sign = self._sign(product, site, ctx)
                if last in _SUB_METHODS:
                    sign = -sign
            elif last == "assign" and node.args:
                sign = self._assign_sign(recv, node.args[0], site, ctx)
        if sign <= 0 or target is None:
            return
        name = _base_name(target)
        if name is None or _NOT_WEIGHTS.match(name) or ctx.kind(target, site.scope) & K.GRAD:
            return
        yield Hit(
            node,
            "update adds lr * gradient to the weights: gradient ascent, the loss "
            "will rise from the first update",
        )

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
        if isinstance(inc, ast.Name):
            inc, _ = ctx.value_of(inc, site.scope, site.comps)
        sign, factors = _factors(inc)
        has_lr = has_grad = False
        for f in factors:
            if self._is_lr(f, site, ctx):
                has_lr = True
            elif not has_grad and (
                ctx.kind(f, site.scope, site.comps) & K.GRAD or _MOMENT.match(_base_name(f) or "")
            ):
                has_grad = True
                value, _ = ctx.value_of(f, site.scope, site.comps)
                if value is not f:
                    s, _ = _factors(value)
                    sign *= s
        return sign if has_lr and has_grad else 0

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
