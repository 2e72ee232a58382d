"""L006 nan-masking: naN in a loss or a gradient replaced by a number (the failure is hidden).

What it does
    Flags `nan_to_num` (`torch.nan_to_num`, `np.nan_to_num`, `x.nan_to_num_()`),
    `torch.where(torch.isnan(loss), 0, loss)` / `tf.where(tf.math.is_nan(g), ...)`,
    `masked_fill(isnan(...), 0)`, `loss[torch.isnan(loss)] = 0` and
    `if torch.isnan(loss): loss = ...` when the value is a loss or a gradient (by its name, `.grad`,
    or because it came from a loss function). Cleaning input data this way is a different matter
    and is not flagged.

Why is this bad?
    A NaN loss or gradient is the symptom of a real fault: a log of zero, a division by zero, a
    step that diverged, bad input rows. Replacing it with zero keeps the loop running on weights
    that are already wrong, and removes the one signal that would have said where and when it
    happened. The run then "trains" to a model nobody can defend.

Example
    ```python
    loss = torch.nan_to_num(criterion(out, y))
    for p in model.parameters():
        p.grad = torch.where(torch.isnan(p.grad), torch.zeros_like(p.grad), p.grad)
    ```

Use instead
    ```python
    loss = criterion(out, y)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite loss at step {step}")   # or: nanscope run
    ```
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from nanscope.lint._types import Hit, Rule
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Site
from nanscope.lint.vocabulary import K

_NAN_TESTS = frozenset(
    {"isnan", "isinf", "isfinite", "is_nan", "is_inf", "is_finite", "isneginf", "isposinf"}
)
_NAN_TO_NUM = frozenset({"nan_to_num", "nan_to_num_"})
_MASKED_FILL = frozenset({"masked_fill", "masked_fill_"})


def nan_subjects(ctx: FileContext, expr: ast.AST) -> list[ast.expr]:
    """The expressions tested for NaN/inf inside ``expr`` (``isnan(x)``, ``x != x``)."""
    found: list[ast.expr] = []
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            _root, last, recv = ctx.func_parts(node)
            if last in _NAN_TESTS:
                if recv is not None:
                    found.append(recv)
                elif node.args:
                    found.append(node.args[0])
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.NotEq)
            and ast.dump(node.left) == ast.dump(node.comparators[0])
        ):
            found.append(node.left)
    return found


class NanMasking(Rule):
    """NaN in a loss or a gradient replaced by a number (the failure is hidden)."""

    code = "L006"
    name = "nan-masking"
    fix = (
        "let it fail loudly (raise, or skip the batch with a warning); find the cause: "
        "nanscope run"
    )
    node_types = (ast.Call, ast.Assign, ast.If)

    def _is_target(self, expr: ast.AST | None, site: Site, ctx: FileContext) -> bool:
        return expr is not None and bool(ctx.kind(expr, site.scope, site.comps) & (K.LOSS | K.GRAD))

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        if isinstance(node, ast.Call):
            root, last, recv = ctx.func_parts(node)
            if last in _NAN_TO_NUM and (recv is not None or root in ("torch", "numpy", "jax")):
                subject = recv if recv is not None else (node.args[0] if node.args else None)
                if self._is_target(subject, site, ctx):
                    yield Hit(
                        node,
                        "nan_to_num on a loss or gradient hides the NaN and its cause",
                    )
            elif last == "where" and root in ("torch", "numpy", "tensorflow", "jax") and node.args:
                subjects = nan_subjects(ctx, node.args[0])
                if subjects and any(
                    self._is_target(s, site, ctx) for s in [*subjects, *node.args[1:]]
                ):
                    yield Hit(
                        node,
                        "where(isnan(...)) on a loss or gradient hides the NaN and its cause",
                    )
            elif (
                last in _MASKED_FILL
                and recv is not None
                and node.args
                and nan_subjects(ctx, node.args[0])
                and self._is_target(recv, site, ctx)
            ):
                yield Hit(
                    node,
                    "masked_fill(isnan(...)) on a loss or gradient hides the NaN",
                )
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and nan_subjects(ctx, target.slice)
                    and self._is_target(target.value, site, ctx)
                ):
                    yield Hit(
                        node,
                        "overwriting the NaN entries of a loss or gradient hides the failure",
                    )
        elif isinstance(node, ast.If):
            tested = [s for s in nan_subjects(ctx, node.test) if self._is_target(s, site, ctx)]
            if not tested:
                return
            names = {ast.dump(s) for s in tested}
            for stmt in node.body:
                if isinstance(stmt, (ast.Assign, ast.AugAssign)):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    if any(ast.dump(_load(t)) in names for t in targets):
                        yield Hit(
                            node,
                            "replacing a NaN loss or gradient with a value hides the failure",
                        )
                        return


def _load(target: ast.expr) -> ast.expr:
    """The Load-context twin of an assignment target, so it dumps like the tested expression."""
    if isinstance(target, ast.Name):
        return ast.Name(id=target.id, ctx=ast.Load())
    if isinstance(target, ast.Attribute):
        return ast.Attribute(value=target.value, attr=target.attr, ctx=ast.Load())
    return target
