"""L010 step-without-zero-grad: `optimizer.step()` in a loop that never clears the gradients.

What it does
    In a file that calls `.backward()`, flags `optimizer.step()` inside a `for` / `while` loop when
    nothing in that loop clears the gradients: no `optimizer.zero_grad()`, `model.zero_grad()`,
    `p.grad = None`, `p.grad.zero_()`, and no call to a function of the same file that does one of
    these. A `zero_grad()` before the loop does not count: it runs once. A `step()` in a helper
    (`def optimizer_step(self)`) is flagged when every loop of the file that calls the helper
    leaves the gradients uncleared.

Why is this bad?
    PyTorch *adds* each `backward()` into `.grad`. Without clearing, the gradient used at update `t`
    is the sum of all gradients so far, so the effective step grows with every update: the fit
    behaves like one whose learning rate keeps increasing, and diverges (`step_size_too_large`).
    Gradient accumulation is fine, as long as the loop clears the gradients after its step.

Example
    ```python
    optimizer.zero_grad()
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from nanscope.lint._types import CallRule, Hit
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Site, qualified_name
from nanscope.lint.vocabulary import K

_OPTIMIZER_NAME = re.compile(
    r"^(opt|optim|optimi[sz]er\w*|\w+_opt|opt_\w+|\w+_optimi[sz]er\w*|"
    r"optimi[sz]ers?)$",
    re.I,
)


class StepWithoutZeroGrad(CallRule):
    """`optimizer.step()` in a loop that never clears the gradients."""

    code = "L010"
    name = "step-without-zero-grad"
    fix = "call optimizer.zero_grad() in the loop, before backward() (or after step())"

    def check_call(self, node: ast.Call, site: Site, ctx: FileContext) -> Iterator[Hit]:
        if node.args or node.keywords or "backward" not in ctx.idents:
            return
        _root, last, recv = ctx.func_parts(node)
        if last != "step" or recv is None:
            return
        name = recv.attr if isinstance(recv, ast.Attribute) else getattr(recv, "id", "")
        if not (_OPTIMIZER_NAME.match(name) or ctx.kind(recv, site.scope) & K.OPTIM):
            return
        loops = list(site.loops)
        if not loops:
            # step() in a helper (`def train_step(...)`): the loops of the file that call it
            helper = qualified_name(site.scope) if site.scope.kind == "function" else None
            if helper is None or helper in ctx.zero_funcs:
                return
            loops = [loop for loop, called in ctx.loop_nodes_calling(helper)]
            if not loops:
                return
        for loop in loops:
            if id(loop) in ctx.zero_loops:
                return
            if ctx.loop_calls.get(id(loop), set()) & ctx.zero_funcs:
                return
        yield Hit(
            node,
            "optimizer.step() in a loop that never clears the gradients"
            if site.loops
            else "step() in a helper called from a loop that never clears the gradients",
        )
