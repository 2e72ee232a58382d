"""L009 exp-of-linear-output: `exp` of an unbounded linear output,
with no clamp and no max subtracted.

What it does
    Flags `torch.exp(self.fc(x))`, `np.exp(X @ w)`, `tf.exp(tf.matmul(x, W) + b)`, `z.exp()`,
    the in-place `z.exp_()` and friends where the argument is the output of a matrix product or a
    linear layer (followed through assignments, sign changes and scalings) that was not clamped
    and had no maximum subtracted (also a maximum passed through a collective:
    `m = all_reduce(z.amax(-1), op=MAX)`; `z - m`). The numerically stable sigmoid
    `1 / (1 + exp(-z))`, the branches of a `where(...)` and an exp a test looks after are not
    flagged.

Why is this bad?
    `exp` overflows to inf once its input passes about 88.7 in float32 (about 11 in float16), and a
    linear output reaches that as soon as the weights or the features are large. Then
    `inf / inf` (a hand-written softmax) or `inf - inf` gives NaN. This is the `fp16_overflow` /
    `step_size_too_large` path to a NaN that starts with a finite but large activation.

Example
    ```python
    rate = torch.exp(self.fc(x))                 # Poisson rate
    e = np.exp(X @ W); p = e / e.sum(1, keepdims=True)
    ```

Use instead
    ```python
    log_rate = self.fc(x)
    loss = F.poisson_nll_loss(log_rate, y, log_input=True)   # stay in log space
    rate = torch.exp(self.fc(x).clamp(max=20))               # or clamp before exp
    z = X @ W; z = z - z.max(1, keepdims=True); e = np.exp(z)  # or scipy.special.softmax
    ```
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from nanscope.lint._types import Hit, Rule
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Site
from nanscope.lint.vocabulary import K

_EXP = frozenset({"exp", "exp2", "exp_"})
_FRAMEWORKS = ("torch", "numpy", "tensorflow", "jax", "keras", "cupy", "math")


class ExpOfLinearOutput(Rule):
    """`exp` of an unbounded linear output, with no clamp and no max subtracted."""

    code = "L009"
    name = "exp-of-linear-output"
    fix = (
        "clamp the input (z.clamp(max=20)), subtract the max, or stay in log space "
        "(log_softmax, logsumexp)"
    )
    node_types = (ast.BinOp, ast.Call)

    def __init__(self) -> None:
        self._skip: set[int] = set()

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        if isinstance(node, ast.BinOp):
            # 1 / (1 + exp(-z)): exp overflows to inf there, and 1 / inf == 0 is the right limit
            if isinstance(node.op, ast.Div) and ctx.is_one(node.left, site.scope):
                call = ctx.one_plus_exp(node.right, site.scope)
                if call is not None:
                    self._skip.add(id(call))
            return
        assert isinstance(node, ast.Call)
        root, last, recv = ctx.func_parts(node)
        if last == "where" and root in _FRAMEWORKS:
            for branch in node.args[1:]:
                for sub in ast.walk(branch):
                    self._skip.add(id(sub))
            return
        if last not in _EXP or id(node) in self._skip:
            return
        if recv is not None:
            if node.args:
                return
            arg: ast.expr | None = recv
        elif root in _FRAMEWORKS:
            arg = node.args[0] if node.args else None
        else:
            return
        if arg is None:
            return
        k = ctx.kind(arg, site.scope, site.comps)
        if k & K.LINEAR and not k & K.SAFE and not ctx.guards.looked_after(arg, site):
            yield Hit(
                node,
                "exp of a linear output: inf past ~88 (float32), ~11 (float16)",
            )
