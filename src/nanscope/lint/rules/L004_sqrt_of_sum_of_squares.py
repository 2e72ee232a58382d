"""L004 sqrt-of-sum-of-squares: square root of a sum of squares with no epsilon, in differentiated
code.

What it does
    In a file that imports torch, TensorFlow, JAX or Keras, flags `torch.sqrt(s)`, `tf.sqrt(s)`,
    `s.sqrt()`, `s.rsqrt()` and `s ** 0.5` where `s` is a sum or mean of squares
    (`(x ** 2).sum(-1)`, `torch.sum(d * d)`, `tf.reduce_sum(tf.square(x))`, `dx ** 2 + dy ** 2`)
    or a single square (`sqrt((x - y) ** 2)`, which is `|x - y|`) with no epsilon added. Code
    with no backward pass is not flagged: under `torch.no_grad()`, NumPy code, data loading,
    metrics and inference code, and grids built from constants (`torch.arange`). A test on the
    path (`where(s > 0, s, 1).sqrt()`) is a guard. `--fix` adds the epsilon under the root.

Why is this bad?
    The derivative of `sqrt(s)` is `1 / (2 sqrt(s))`, infinite at `s = 0`. A zero vector (two
    identical embeddings, a padded row) makes the forward value a harmless 0 but the backward pass
    `0 * inf = NaN`, and the NaN reaches every weight in one step. This is the `zero_division`
    cause, seen only in the gradient.

Example
    ```python
    dist = torch.sqrt(((a - b) ** 2).sum(-1))
    rms = x.pow(2).mean(-1).sqrt()
    ```

Use instead
    ```python
    dist = torch.sqrt(((a - b) ** 2).sum(-1) + 1e-12)
    dist = torch.linalg.vector_norm(a - b, dim=-1)   # defines the gradient at 0 as 0
    rms = (x.pow(2).mean(-1) + 1e-6).sqrt()
    ```
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from nanscope.lint._types import Hit, Rule
from nanscope.lint.fixes import plus_epsilon
from nanscope.lint.inference import FileContext
from nanscope.lint.ranking import QUIET_PLACES, place_of
from nanscope.lint.scopes import Site, is_number
from nanscope.lint.vocabulary import K

_AUTOGRAD = ("torch", "tensorflow", "jax", "keras")


def _differentiates(ctx: FileContext) -> bool:
    """Whether the file imports an autograd framework (else nothing it computes has a
    gradient)."""
    return any(v.split(".", 1)[0] in _AUTOGRAD for v in ctx.imports.values())


class SqrtOfSumOfSquares(Rule):
    """Square root of a sum of squares with no epsilon, in differentiated code."""

    code = "L004"
    name = "sqrt-of-sum-of-squares"
    fix = "add an epsilon inside the sqrt (sqrt(s + 1e-12)) or use torch.linalg.vector_norm"
    node_types = (ast.Call, ast.BinOp)

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        if site.no_grad or not _differentiates(ctx):
            return
        arg: ast.expr | None = None
        operand = True  # the receiver of .sqrt() or the base of ** 0.5
        if isinstance(node, ast.Call):
            root, last, recv = ctx.func_parts(node)
            if last not in ("sqrt", "rsqrt"):
                return
            if recv is not None:
                if node.args:
                    return
                arg = recv
            elif root in _AUTOGRAD and node.args:
                arg, operand = node.args[0], False
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and is_number(
            node.right, 0.5
        ):
            arg = node.left
        if arg is None:
            return
        k = ctx.kind(arg, site.scope, site.comps)
        if not k & (K.SUMSQ | K.SQUARE) or k & (K.SAFE | K.CONST):
            return  # built from constants (an arange grid): no gradient
        if ctx.guards.looked_after(arg, site):
            return
        if place_of(self.code, site, ctx) in QUIET_PLACES:
            return  # data, metrics, inference: no backward pass
        edit = plus_epsilon(arg, ctx.source, "1e-12", operand=operand) if ctx.source else None
        if k & K.SUMSQ:
            message = "sqrt of a sum of squares: its gradient is infinite for a zero vector"
        else:
            message = "sqrt of a square is |x|, and its gradient is 0/0 = NaN at x == 0"
        yield Hit(node, message, edits=(edit,) if edit is not None else ())
