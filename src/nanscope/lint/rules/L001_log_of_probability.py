"""L001 log-of-probability: log of a probability that can be exactly 0.

What it does
    Flags `log` (`torch.log`, `np.log`, `tf.math.log`, `math.log`, `p.log()`) applied to the output
    of a sigmoid or softmax, to `1 - p` of one, or to a probability that was not clamped and has no
    epsilon added. It follows the value: through assignments (`p = torch.sigmoid(z)` then
    `torch.log(p)`), into a method of the same class or a function of the file that receives it
    as an argument, out of a function that returns it, through in-place ops (`x.sigmoid_()`), and
    through `where(cond, p, 1)`, which selects and does not clamp. A Keras loss's `y_pred` is a
    probability. `p.clamp(1e-7, 1 - 1e-7)`, `p + eps`, `log_softmax` are fine, and so is a log a
    test looks after (`math.log(p) if p > 0 else -inf`, `if (p > 0).all():`,
    `where(p > 0, p, 1).log()`). An entropy written as `torch.special.entr(p)` or
    `torch.xlogy(p, p)` of such a probability is flagged too: finite at 0, its gradient
    `-(log p + 1)` is not. `--fix` rewrites `log(softmax(x))` as `log_softmax(x)` and
    `log(sigmoid(z))` / `log(1 - sigmoid(z))` as `logsigmoid(z)` / `logsigmoid(-z)` when the
    probability is computed right there.

Why is this bad?
    A sigmoid or softmax saturates to exactly 0.0 (or 1.0) in floating point once its input is
    large: in float32 `sigmoid(-104) == 0`. The log of that is `-inf`, the loss becomes `inf`, and
    its gradient `0 * inf` is NaN. This is the `log_of_zero` cause: the weights and the data are
    finite and the loss still goes NaN, often late in training when the model grows confident.

Example
    ```python
    p = torch.sigmoid(logits)
    loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()

    probs = F.softmax(scores, dim=-1)
    nll = -torch.log(probs[range(n), target]).mean()
    entropy = torch.special.entr(probs).sum(-1)   # NaN gradient where a probability is 0
    ```

Use instead
    ```python
    loss = F.binary_cross_entropy_with_logits(logits, y)   # or F.logsigmoid(logits)
    nll = F.cross_entropy(scores, target)                  # or F.log_softmax(scores, dim=-1)
    logp = F.log_softmax(scores, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)                 # finite gradient at p == 0

    # numpy: clip the probability away from 0 and 1
    p = np.clip(p, 1e-12, 1 - 1e-12)
    loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    ```
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from nanscope.lint._types import CallRule, Edit, Hit
from nanscope.lint.fixes import renamed_call, replace
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Site
from nanscope.lint.vocabulary import K

_LOGS = frozenset({"log", "log2", "log10", "log_"})


class LogOfProbability(CallRule):
    """Log of a probability that can be exactly 0."""

    code = "L001"
    name = "log-of-probability"
    fix = "clip the probability into [eps, 1-eps] (torch.clamp / np.clip) or add an epsilon"

    def check_call(self, node: ast.Call, site: Site, ctx: FileContext) -> Iterator[Hit]:
        root, last, recv = ctx.func_parts(node)
        if last in ("entr", "xlogy") and root == "torch" and recv is None and node.args:
            # -p log p: finite at 0 in the forward, -(log p + 1) = inf in the backward
            prob = node.args[-1] if last == "xlogy" else node.args[0]
            kp = ctx.kind(prob, site.scope, site.comps)
            if kp & K.PROB and not kp & K.SAFE:
                yield Hit(
                    node,
                    f"{last} of a probability has an infinite gradient where a probability is 0",
                    "use log-probabilities: logp = F.log_softmax(logits, -1); "
                    "-(logp.exp() * logp).sum(-1)",
                )
            return
        if last in _LOGS:
            if recv is not None:
                if node.args or node.keywords:
                    return  # logger.log("loss", x), self.log(...): not a math log
                arg: ast.expr | None = recv
            elif root in ("torch", "numpy", "tensorflow", "math", "jax", "keras", "cupy"):
                arg = node.args[0] if node.args else None
            else:
                return
        elif last == "log1p" and (
            recv is not None or root in ("torch", "numpy", "tensorflow", "math", "jax")
        ):
            arg = recv if recv is not None else (node.args[0] if node.args else None)
            if not (isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.USub)):
                return
            arg = arg.operand
            k = ctx.kind(arg, site.scope, site.comps)
            if k & K.PROB and not k & K.SAFE and not ctx.guards.looked_after(arg, site):
                yield Hit(node, "log1p(-p) of a probability is -inf when p reaches 1")
            return
        else:
            return
        if arg is None:
            return
        k = ctx.kind(arg, site.scope, site.comps)
        if not k & K.PROB or k & K.SAFE or ctx.guards.looked_after(arg, site):
            return
        edits = _log_space_fix(node, arg, ctx) if last == "log" else ()
        if k & K.SIGMOID:
            yield Hit(
                node,
                "log of a sigmoid output is -inf once the sigmoid saturates to 0 or 1",
                "work on the logits: F.logsigmoid(z), F.logsigmoid(-z) for log(1 - p), "
                "tf.math.log_sigmoid, BCEWithLogitsLoss",
                edits,
            )
        elif k & K.SOFTMAX:
            yield Hit(
                node,
                "log of a softmax output is -inf once a probability underflows to 0",
                "use log_softmax (F.log_softmax / tf.nn.log_softmax) or cross_entropy on logits",
                edits,
            )
        else:
            yield Hit(node, "log of a probability with no clamp or epsilon is -inf at p == 0")


#: the log-space twin of a probability function, per framework
_LOG_TWINS = {
    ("torch", "softmax"): "log_softmax",
    ("jax", "softmax"): "log_softmax",
    ("scipy", "softmax"): "log_softmax",
    ("tensorflow", "softmax"): "log_softmax",
}


def _log_space_fix(log_call: ast.Call, arg: ast.expr, ctx: FileContext) -> tuple[Edit, ...]:
    """``log(softmax(x))`` -> ``log_softmax(x)``, ``log(sigmoid(z))`` -> ``logsigmoid(z)``,
    ``log(1 - sigmoid(z))`` -> ``logsigmoid(-z)``, when the probability is computed right there
    (a name bound to it may be used elsewhere: that needs a person)."""
    source = ctx.source
    if not source:
        return ()
    negate = False
    if (
        isinstance(arg, ast.BinOp)
        and isinstance(arg.op, ast.Sub)
        and ctx.is_one(arg.left, ctx.module)
        and isinstance(arg.right, ast.Call)
    ):
        arg, negate = arg.right, True
    if not isinstance(arg, ast.Call):
        return ()
    root, last, recv = ctx.func_parts(arg)
    text: str | None = None
    if last == "softmax" and not negate:
        if recv is not None:
            text = renamed_call(arg, "log_softmax", source)
        elif root is not None and (root, "softmax") in _LOG_TWINS:
            qual = ctx.qualname(arg.func) or ""
            if root != "tensorflow" or qual.endswith(("nn.softmax", "math.softmax")):
                text = renamed_call(arg, "log_softmax", source)
    elif last == "sigmoid" and len(arg.args) + (recv is not None) == 1 and not arg.keywords:
        z = recv if recv is not None else arg.args[0]
        z_text = ast.get_source_segment(source, z)
        if z_text is None:
            return ()
        if negate:
            atom = isinstance(z, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
            z_text = f"-{z_text}" if atom else f"-({z_text})"
        qual = ctx.qualname(arg.func) or ""
        torch_alias = next((a for a, m in ctx.imports.items() if m == "torch"), None)
        tf_alias = next((a for a, m in ctx.imports.items() if m == "tensorflow"), None)
        if qual.startswith("torch.nn.functional.") and isinstance(arg.func, ast.Attribute):
            prefix = ast.get_source_segment(source, arg.func.value)
            text = f"{prefix}.logsigmoid({z_text})" if prefix else None
        elif (qual.startswith("torch.") or recv is not None) and torch_alias:
            text = f"{torch_alias}.nn.functional.logsigmoid({z_text})"
        elif qual.startswith("tensorflow.") and tf_alias:
            text = f"{tf_alias}.math.log_sigmoid({z_text})"
        elif qual.startswith("jax.") and isinstance(arg.func, ast.Attribute):
            prefix = ast.get_source_segment(source, arg.func.value)
            text = f"{prefix}.log_sigmoid({z_text})" if prefix else None
    if text is None:
        return ()
    return (replace(log_call, text),)
