"""L002 bce-on-sigmoid: binary cross-entropy computed on a sigmoid output instead of on the logits.

What it does
    Flags `nn.BCELoss` / `F.binary_cross_entropy` (and Keras `binary_crossentropy` /
    `BinaryCrossentropy()` called by hand) whose prediction argument is the output of a sigmoid:
    `torch.sigmoid(z)`, a variable assigned from one, an `nn.Sigmoid()` layer, an `nn.Sequential`
    that ends in `nn.Sigmoid()`, or a model class whose `forward` returns a sigmoid, also when the
    class is defined in another file linted in the same run (`from .models import
    Discriminator`) or the loss reaches the training function as an argument. `--fix` moves
    `F.binary_cross_entropy(torch.sigmoid(z), y)` and `nn.BCELoss()` (or a criterion used only
    there) applied to `sigmoid(z)` to the with-logits form on `z`.

Why is this bad?
    The probability-space loss has to take `log(sigmoid(z))`: once the sigmoid saturates the
    information in `z` is gone, the loss has to be clamped (PyTorch clamps the log at -100, which
    zeroes the gradient), and without a clamp it is `log(0) = -inf`. The with-logits form computes
    `softplus` on `z` directly, which is exact and finite for every `z`.

Example
    ```python
    criterion = nn.BCELoss()
    loss = criterion(torch.sigmoid(model(x)), y)
    ```

Use instead
    ```python
    criterion = nn.BCEWithLogitsLoss()
    loss = criterion(model(x), y)          # keep the sigmoid for predictions only

    # Keras: tf.keras.losses.BinaryCrossentropy(from_logits=True) on the logits
    ```
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from nanscope.lint._types import CallRule, Edit, Hit
from nanscope.lint.fixes import insert_after, replace
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Site, keyword
from nanscope.lint.vocabulary import K

_TORCH_BCE = frozenset({"binary_cross_entropy"})
_TF_BCE = frozenset({"binary_crossentropy"})


class BceOnSigmoid(CallRule):
    """Binary cross-entropy computed on a sigmoid output instead of on the logits."""

    code = "L002"
    name = "bce-on-sigmoid"
    fix = (
        "drop the sigmoid: BCEWithLogitsLoss or F.binary_cross_entropy_with_logits on the logits "
        "(Keras: from_logits)"
    )

    def check_call(self, node: ast.Call, site: Site, ctx: FileContext) -> Iterator[Hit]:
        root, last, recv = ctx.func_parts(node)
        pred: ast.expr | None = None
        if recv is None and root == "torch" and last in _TORCH_BCE:
            pred = node.args[0] if node.args else keyword(node, "input")
        elif recv is None and root in ("tensorflow", "keras") and last in _TF_BCE:
            logits = keyword(node, "from_logits")
            if logits is not None and not (isinstance(logits, ast.Constant) and not logits.value):
                return
            pred = (
                node.args[1]
                if len(node.args) > 1
                else (keyword(node, "y_pred") or keyword(node, "output"))
            )
        elif root is None:
            callee = ctx.kind(node.func, site.scope, site.comps)
            if callee & K.FN_BCE:
                pred = node.args[0] if node.args else keyword(node, "input")
            elif callee & K.FN_BCE_TF:
                pred = node.args[1] if len(node.args) > 1 else keyword(node, "y_pred")
        if pred is None:
            return
        k = ctx.kind(pred, site.scope, site.comps)
        if k & K.PROB and k & (K.SIGMOID | K.SOFTMAX):
            yield Hit(
                node,
                "binary cross-entropy of a sigmoid output: log(0) once it saturates",
                edits=_with_logits_fix(node, pred, root, site, ctx),
            )


def _logits_of(pred: ast.expr, ctx: FileContext) -> ast.expr | None:
    """``z`` when ``pred`` is ``torch.sigmoid(z)``, ``F.sigmoid(z)`` or ``z.sigmoid()`` itself."""
    if not isinstance(pred, ast.Call) or pred.keywords:
        return None
    root, last, recv = ctx.func_parts(pred)
    if last != "sigmoid":
        return None
    if recv is not None and not pred.args:
        return recv
    if root == "torch" and len(pred.args) == 1:
        return pred.args[0]
    return None


def _bce_ctor(call: ast.expr) -> ast.expr | None:
    """The function of ``nn.BCELoss(...)`` when ``call`` is that constructor call."""
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "BCELoss"
    ):
        return call.func
    return None


def _with_logits_fix(
    node: ast.Call, pred: ast.expr, root: str | None, site: Site, ctx: FileContext
) -> tuple[Edit, ...]:
    """``F.binary_cross_entropy(torch.sigmoid(z), y)`` -> ``F.binary_cross_entropy_with_logits(z,
    y)``; ``nn.BCELoss()(sigmoid(z), y)`` and ``criterion(sigmoid(z), y)`` with
    ``criterion = nn.BCELoss()`` used nowhere else -> ``BCEWithLogitsLoss`` on ``z``."""
    logits = _logits_of(pred, ctx)
    if logits is None or not ctx.source:
        return ()
    logits_text = ast.get_source_segment(ctx.source, logits)
    if logits_text is None:
        return ()
    swap = replace(pred, logits_text)
    func = node.func
    if root == "torch" and isinstance(func, ast.Attribute) and func.attr == "binary_cross_entropy":
        return (insert_after(func, "_with_logits"), swap)
    ctor = _bce_ctor(func)
    if ctor is None and isinstance(func, (ast.Name, ast.Attribute)) and ctx.loads(func) == 1:
        value, _ = ctx.value_of(func, site.scope)
        ctor = _bce_ctor(value)
    if ctor is None or not isinstance(ctor, ast.Attribute):
        return ()
    end_line = ctor.end_lineno or ctor.lineno
    end_col = ctor.end_col_offset or 0
    rename = Edit(end_line, end_col - len("BCELoss"), end_line, end_col, "BCEWithLogitsLoss")
    return (rename, swap)
