"""L008 relu-recurrent-without-clipping: `relu` as the activation of a recurrent cell,
with no gradient clipping in the file.

What it does
    Flags `nn.RNN(..., nonlinearity="relu")` / `nn.RNNCell`, TensorFlow and Keras recurrent layers
    and cells (`LSTMCell`, `LSTM`, `GRU`, `SimpleRNN`, ...) built with `activation=tf.nn.relu`,
    `activation="relu"` (or another unbounded activation such as `elu`), including through a list
    comprehension over `(size, activation)` pairs, when neither the file nor another file linted
    in the same run clips gradients (`clip_grad_norm_`, `tf.clip_by_global_norm`, `clipnorm=`,
    `gradient_clip_val=`...).

Why is this bad?
    A recurrent cell applies the same weights at every time step. With `tanh` the state stays in
    [-1, 1]; with relu nothing bounds it, so the state and the gradients through time grow
    geometrically with the sequence length whenever the recurrent weights' gain exceeds 1. The
    loss runs for many epochs and then jumps to inf or NaN: the `exploding_gradients` cause.

Example
    ```python
    cells = [tf.nn.rnn_cell.LSTMCell(400, activation=tf.nn.relu) for _ in range(3)]
    rnn = nn.RNN(128, 256, nonlinearity="relu")
    ```

Use instead
    ```python
    cells = [tf.nn.rnn_cell.LSTMCell(400) for _ in range(3)]   # the default tanh
    # or keep relu and clip:
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer = tf.keras.optimizers.Adam(1e-3, clipnorm=1.0)
    ```
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from nanscope.lint._types import CallRule, Hit
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Site, keyword
from nanscope.lint.vocabulary import CLIPPING

_RECURRENT = frozenset(
    {
        "RNN",
        "RNNCell",
        "LSTM",
        "LSTMCell",
        "GRU",
        "GRUCell",
        "SimpleRNN",
        "SimpleRNNCell",
        "BasicRNNCell",
        "BasicLSTMCell",
        "ConvLSTM1D",
        "ConvLSTM2D",
        "ConvLSTM3D",
        "LSTMBlockCell",
        "GRUBlockCell",
    }
)
_RELU = frozenset({"relu", "leaky_relu", "elu", "selu", "ReLU", "LeakyReLU", "ELU", "SELU"})


def _relu_like(expr: ast.AST | None) -> bool:
    if expr is None:
        return False
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str) and expr.value in _RELU
    if isinstance(expr, ast.Call):
        return _relu_like(expr.func)
    if isinstance(expr, ast.Attribute):
        return expr.attr in _RELU
    if isinstance(expr, ast.Name):
        return expr.id in _RELU
    return False


class ReluRecurrentWithoutClipping(CallRule):
    """`relu` as the activation of a recurrent cell, with no gradient clipping in the file."""

    code = "L008"
    name = "relu-recurrent-without-clipping"
    fix = (
        "keep tanh, or clip the gradient norm (clip_grad_norm_, tf.clip_by_global_norm, "
        "clipnorm=1.0)"
    )

    def check_call(self, node: ast.Call, site: Site, ctx: FileContext) -> Iterator[Hit]:
        _root, last, recv = ctx.func_parts(node)
        if last not in _RECURRENT or recv is not None or ctx.idents & CLIPPING:
            return
        if ctx.project is not None and ctx.project.mentioned & CLIPPING:
            return  # clipped in another file of the package (the training loop)
        candidates: list[ast.expr] = [a for a in node.args[1:] if not isinstance(a, ast.Starred)]
        for name in ("activation", "nonlinearity", "recurrent_activation"):
            value = keyword(node, name)
            if value is not None:
                candidates.append(value)
        for cand in candidates:
            if self._relu(cand, site, ctx):
                yield Hit(
                    node,
                    "recurrent cell with a relu activation and no gradient clipping",
                )
                return

    def _relu(self, expr: ast.expr, site: Site, ctx: FileContext) -> bool:
        if _relu_like(expr):
            return True
        if not isinstance(expr, ast.Name):
            return False
        bound = ctx.lookup(expr.id, site.scope, (expr.lineno, expr.col_offset), site.comps)
        if isinstance(bound, ast.comprehension):
            return any(_relu_like(n) for n in ast.walk(bound.iter))
        if isinstance(bound, tuple) and bound[1] is not None:
            return _relu_like(bound[1])
        return False
