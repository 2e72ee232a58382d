"""L002 bce-on-sigmoid: binary cross-entropy computed on a sigmoid output instead of on the logits.

What it does
    Flags `nn.BCELoss` / `F.binary_cross_entropy` (and Keras `binary_crossentropy` /
    `BinaryCrossentropy()` called by hand) whose prediction argument is the output of a sigmoid:
    `torch.sigmoid(z)`, a variable assigned from one, an `nn.Sigmoid()` layer, an `nn.Sequential`
    that ends in `nn.Sigmoid()`, or a model class whose `forward` returns a sigmoid.

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

from nanscope.lint._types import Hit, Rule
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Site, keyword
from nanscope.lint.vocabulary import K

_TORCH_BCE = frozenset({"binary_cross_entropy"})
_TF_BCE = frozenset({"binary_crossentropy"})


class BceOnSigmoid(Rule):
    """Binary cross-entropy computed on a sigmoid output instead of on the logits."""

    code = "L002"
    name = "bce-on-sigmoid"
    fix = (
        "drop the sigmoid; BCEWithLogitsLoss / F.binary_cross_entropy_with_logits on the logits "
        "(Keras: from_logits=True)"
    )
    node_types = (ast.Call,)

    def check(self, node: ast.AST, site: Site, ctx: FileContext) -> Iterator[Hit]:
        assert isinstance(node, ast.Call)
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
                "binary cross-entropy of a sigmoid output: log(0) once the sigmoid saturates",
            )
