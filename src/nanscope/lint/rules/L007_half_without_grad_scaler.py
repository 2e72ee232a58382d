"""L007 half-without-grad-scaler: `float16` training with no loss scaler,
or a loss computed in float16.

What it does
    In a file that trains (calls `.backward()` or uses a `GradientTape`), flags a model converted to
    float16 (`model.half()`, `model.to(torch.float16)`), a float16 autocast
    (`torch.autocast("cuda")`, `torch.cuda.amp.autocast()`, `dtype=torch.float16`), or a Keras
    `mixed_float16` policy with a custom `GradientTape` loop, when neither the file nor another
    file linted in the same run has a gradient scaler (`GradScaler`, `LossScaleOptimizer`).
    Independently, flags a loss computed from float16 values (`criterion(out.half(), y)`,
    `loss.half()`). bfloat16 and `autocast(enabled=False)` (a full-precision region) are not
    flagged; a tensor cast to float16 is not a model.

Why is this bad?
    float16 has a range of about 6e-5 to 65504. Activations, the loss or the gradients pass 65504
    and become inf (then NaN), and small gradients underflow to zero. A dynamic loss scaler keeps
    the gradients in range and skips the steps that overflow; a loss reduced in float16 overflows or
    loses all precision on its own. This is the `fp16_overflow` cause.

Example
    ```python
    model = Net().cuda().half()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    ```

Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):   # keep the weights in float32
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    # or: torch.autocast("cuda", dtype=torch.bfloat16), which needs no scaler
    ```
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from nanscope.lint._types import CallRule, Hit
from nanscope.lint.inference import FileContext
from nanscope.lint.scopes import Site, keyword
from nanscope.lint.vocabulary import SCALERS, K

_TRAINING = frozenset({"backward", "GradientTape", "apply_gradients"})
_MODEL_NAME = re.compile(
    r"^(self|model|net|network|module|encoder|decoder|backbone|classifier|policy|\w+_model|"
    r"\w+_net|model_\w+|net_\w+)$",
    re.I,
)


def _dtype(expr: ast.AST | None) -> str | None:
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    return None


class HalfWithoutGradScaler(CallRule):
    """`float16` training with no loss scaler, or a loss computed in float16."""

    code = "L007"
    name = "half-without-grad-scaler"
    fix = "torch.amp.GradScaler (Keras: LossScaleOptimizer) with float32 weights, or bfloat16"

    def check_call(self, node: ast.Call, site: Site, ctx: FileContext) -> Iterator[Hit]:
        root, last, recv = ctx.func_parts(node)
        if last is None:
            return
        unscaled = (
            not ctx.idents & SCALERS
            and bool(ctx.idents & _TRAINING)
            and not (ctx.project is not None and ctx.project.mentioned & SCALERS)
        )
        if recv is not None and last in ("half", "to", "type"):
            is_half = last == "half" and not node.args and not node.keywords
            if last in ("to", "type"):
                is_half = any(
                    _dtype(a) in ("float16", "half")
                    for a in [*node.args, *(k.value for k in node.keywords)]
                )
            if not is_half:
                return
            k = ctx.kind(recv, site.scope, site.comps)
            if k & K.LOSS and not k & K.MODEL:
                yield Hit(
                    node,
                    "the loss is cast to float16: it overflows past 65504",
                    "compute and reduce the loss in float32",
                )
                return
            base = recv
            while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute):
                base = base.func.value  # model.cuda().half()
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if unscaled and (k & K.MODEL or _MODEL_NAME.match(name)):
                yield Hit(
                    node,
                    "model converted to float16 and no GradScaler in the file",
                )
            return
        if last == "autocast" and (root == "torch" or (recv is not None and _dtype(recv) == "amp")):
            if unscaled and self._autocast_is_fp16(node, ctx):
                yield Hit(
                    node,
                    "float16 autocast and no GradScaler in the file",
                )
            return
        if last in ("set_global_policy", "Policy", "set_policy") and "mixed_float16" in ctx.strings:
            arg = node.args[0] if node.args else None
            if (
                isinstance(arg, ast.Constant)
                and arg.value == "mixed_float16"
                and "GradientTape" in ctx.idents
                and "LossScaleOptimizer" not in ctx.idents
            ):
                yield Hit(
                    node,
                    "mixed_float16 policy, a GradientTape loop and no LossScaleOptimizer",
                    "wrap the optimizer in keras.mixed_precision.LossScaleOptimizer, or use "
                    "mixed_bfloat16",
                )
            return
        if (
            (node.args or node.keywords)
            and ("half" in ctx.idents or "float16" in ctx.idents)
            and ctx.kind(node, site.scope, site.comps) & K.LOSS
        ):
            args = [*node.args, *(k.value for k in node.keywords)]
            if any(ctx.kind(a, site.scope, site.comps) & K.HALF for a in args):
                yield Hit(
                    node,
                    "the loss is computed from float16 values: it overflows past 65504",
                    "cast its inputs to float32 (out.float()), or compute it under autocast",
                )

    def _autocast_is_fp16(self, node: ast.Call, ctx: FileContext) -> bool:
        enabled = keyword(node, "enabled")
        if isinstance(enabled, ast.Constant) and not enabled.value:
            return False  # autocast(enabled=False): a full-precision region
        dtype = _dtype(keyword(node, "dtype"))
        if dtype is None and len(node.args) > 1:
            dtype = _dtype(node.args[1])
        if dtype is not None:
            return dtype in ("float16", "half")
        qual = ctx.qualname(node.func) or ""
        if ".cpu." in qual:
            return False
        if ".cuda." in qual:
            return True
        device = keyword(node, "device_type") or (node.args[0] if node.args else None)
        return not (isinstance(device, ast.Constant) and device.value in ("cpu", "mps", "xla"))
