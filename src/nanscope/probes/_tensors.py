"""The tensor helpers every PyTorch probe uses: find the tensors of an op's arguments, check them
finite, read what an autograd node saved, summarise a tensor for the diagnosis.

One copy for the live watch (:mod:`~nanscope.probes.producer`), the replay
(:mod:`~nanscope.probes.locate`), the loop's re-evaluation (:mod:`~nanscope.probes.loop`), the
confirming experiment and the loader's rows. torch is imported where a helper runs, never on
import (nanscope imports without torch).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["all_finite", "custom_saved", "float_tensors", "graph_nodes", "has_forward",
           "inputs_in_order", "loss_before_scale", "nonfinite_scalar", "number_summary",
           "op_watch", "saved_tensors", "static_scale", "summary", "tensors",
           "weighted_inputs"]  # fmt: skip

#: how deep nested lists, tuples and dicts of an op's arguments are searched for tensors
DEPTH = 3


def tensors(obj: Any, depth: int = 0, items: bool = False) -> list[Any]:
    """The tensors in ``obj`` (a tensor, or lists, tuples and dicts of them, three levels deep).

    ``items``: a dataset item's values too: numpy arrays, and Python numbers as 0-d arrays.
    """
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if items:
        import numpy as np

        if isinstance(obj, np.ndarray):
            return [obj]
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            return [np.asarray(obj)]
    out: list[Any] = []
    if depth < DEPTH and isinstance(obj, (list, tuple)):
        for value in obj:
            out.extend(tensors(value, depth + 1, items))
    elif depth < DEPTH and isinstance(obj, dict):
        for value in obj.values():
            out.extend(tensors(value, depth + 1, items))
    return out


def float_tensors(obj: Any) -> list[Any]:
    """The floating tensors of ``obj`` that hold values (not empty, not on the meta device)."""
    return [t for t in tensors(obj) if t.is_floating_point() and t.numel() and not t.is_meta]


def all_finite(values: list[Any]) -> bool:
    """All values finite. One pass (a sum, which any NaN or inf makes non-finite); the exact
    check only when the sum is not finite (it may have overflowed on finite values)."""
    import torch

    for t in values:
        if t.is_meta:
            continue  # no values to read (a model built on the meta device)
        t = t.detach()  # no graph node, no saved tensor (a checkpoint counts what a forward saves)
        narrow = t.dtype in (torch.float16, torch.bfloat16)
        s = t.sum(dtype=torch.float32) if narrow else t.sum()
        if not bool(torch.isfinite(s)) and not bool(torch.isfinite(t).all()):
            return False
    return True


def nonfinite_scalar(args: Any, kwargs: Any) -> bool:
    """Whether a plain float argument of an op is inf/NaN (a non-finite input that is no tensor)."""
    for value in list(args) + list((kwargs or {}).values()):
        if isinstance(value, float) and not math.isfinite(value):
            return True
    return False


def saved_tensors(node: Any) -> dict[str, Any]:
    """The floating tensors an autograd node saved (``_saved_self`` -> ``"self"``, ...).

    Raises ``RuntimeError`` when the graph was freed (a backward already ran): the caller decides
    what a freed graph means. Any other fault skips that attribute.
    """
    import torch

    saved: dict[str, Any] = {}
    for attr in _saved_names(type(node)):
        try:
            value = getattr(node, attr)
        except RuntimeError:
            raise  # freed graph: the caller decides
        except Exception:
            continue
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            saved[attr[len("_saved_"):]] = value
    return saved


#: node type -> its ``_saved_*`` attribute names
_SAVED_NAMES: dict[Any, tuple[str, ...]] = {}


def _saved_names(kind: Any) -> tuple[str, ...]:
    """The ``_saved_*`` attributes of a node type (``dir`` is slow; a type's never change)."""
    names = _SAVED_NAMES.get(kind)
    if names is None:
        names = _SAVED_NAMES[kind] = tuple(
            a for a in dir(kind)
            if a.startswith("_saved_") and not a.endswith(("_sym_sizes", "_sizes", "_strides"))
        )
    return names


def custom_saved(node: Any) -> dict[str, Any]:
    """What a custom ``torch.autograd.Function`` saved for its backward (``ctx.saved_tensors``),
    floating tensors only; empty for torch's own nodes or when it cannot be read."""
    import torch

    if not hasattr(node, "saved_tensors") or not hasattr(node, "apply"):
        return {}
    try:
        saved = node.saved_tensors
    except Exception:  # freed, or not a custom Function's node
        return {}
    return {f"saved_{i}": t for i, t in enumerate(saved or ())
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()}  # fmt: skip


def graph_nodes(root: Any, limit: int = 20000, stop: set[int] | None = None) -> list[Any]:
    """Every autograd node reachable from ``root``, root first (breadth first), at most ``limit``;
    nodes whose id is in ``stop`` are not entered."""
    seen: set[int] = set()
    order: list[Any] = []
    queue = [root]
    while queue and len(order) < limit:
        node = queue.pop(0)
        if node is None or id(node) in seen or (stop is not None and id(node) in stop):
            continue
        seen.add(id(node))
        order.append(node)
        queue.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
    return order


def summary(t: Any) -> dict[str, Any]:
    """dtype, shape, max |x| over the finite values, zero count, non-finite count, min."""
    import torch

    with torch.no_grad():
        x = t.detach()
        finite = torch.isfinite(x)
        out: dict[str, Any] = {"dtype": str(x.dtype).replace("torch.", ""),
                               "shape": list(x.shape)}  # fmt: skip
        bad = int((~finite).sum())
        if bad:
            out["nonfinite"] = bad
            out["nan"] = bool(torch.isnan(x).any())
        xf = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device)).double()
        out["absmax"] = float(xf.abs().max()) if xf.numel() else 0.0
        out["min"] = float(xf.min()) if xf.numel() else 0.0
        out["zeros"] = int((x == 0).sum())
        out["numel"] = int(x.numel())
    return out


def number_summary(value: float) -> dict[str, Any]:
    """A Python number an op took (a divisor ``n - 1``), summarised as a tensor would be."""
    return {"dtype": "python", "shape": [], "absmax": abs(float(value)), "min": float(value),
            "zeros": int(value == 0), "numel": 1}  # fmt: skip


def inputs_in_order(args: Any, floats: list[Any]) -> list[dict[str, Any]]:
    """An op's inputs in argument order: its floating tensors and its plain numbers (a divisor
    that is a Python 0 is as much a zero denominator as a tensor's); at most four."""
    out: list[dict[str, Any]] = []
    ids = {id(t) for t in floats}
    for arg in args:
        if id(arg) in ids:
            out.append(summary(arg))
        elif isinstance(arg, (int, float)) and not isinstance(arg, bool) and math.isfinite(arg):
            out.append(number_summary(arg))
    if not any(s["dtype"] != "python" for s in out):
        out = [summary(t) for t in floats]  # the tensors came by keyword: those, at least
    return out[:4]


def has_forward(model: Any) -> bool:
    """Whether calling the model runs a forward of its own. A LightningModule often has none
    (its ``training_step`` calls the layers): such a model cannot be replayed by a call, and
    the loss's own graph is read instead."""
    try:
        import torch
    except ImportError:
        return False
    for cls in type(model).__mro__:
        if "forward" in cls.__dict__:
            # torch's placeholder raises; LightningModule's only hands on to it
            return cls is not torch.nn.Module and cls.__name__ != "LightningModule"
    return False


def op_watch(note: Callable[[Any, Any, Any, Any], None]) -> Any:
    """A ``TorchFunctionMode`` (``with op_watch(note): ...``) that runs every op as it is, then
    hands ``(func, args, kwargs, out)`` to ``note``; a fault in ``note`` is swallowed (the op's
    result is the code's, whatever the probe makes of it)."""
    from torch.overrides import TorchFunctionMode

    class OpWatch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            with contextlib.suppress(Exception):
                note(func, args, kwargs, out)
            return out

    return OpWatch()


#: how many frames above ``backward()`` a scaled loss's operand is looked for
_OPERAND_FRAMES = 8


def static_scale(root: Any) -> float | None:
    """The constant above 1 that multiplied a loss to make ``root`` (``loss * 32768``, a static
    loss scale written by hand), or None. A division (``loss / n``, gradient accumulation) or a
    factor below 1 is part of the loss the step applies, not a scale."""
    node = root.grad_fn
    if node is None or type(node).__name__ != "MulBackward0":
        return None
    (first, _), (second, _) = node.next_functions
    saved = "_saved_other" if second is None else "_saved_self" if first is None else None
    if saved is None or (first is None and second is None):
        return None
    try:
        constant: Any = getattr(node, saved, None)
    except RuntimeError:  # the backward ran and freed what the node saved
        return None
    # (a constant on an accelerator would be a sync to read: such a scale is left as it is)
    if not hasattr(constant, "numel") or constant.numel() != 1 or not constant.is_cpu:
        return None
    value = float(constant)
    return value if math.isfinite(value) and abs(value) > 1.0 else None


def loss_before_scale(root: Any) -> Any:
    """The loss ``backward()`` was called on, detached, before a static loss scale.

    For ``(loss * c).backward()`` it is the tensor ``c`` multiplied: read from a calling frame
    that holds it (the exact value, even where ``loss * c`` overflowed float16 while the
    gradients stayed finite), else ``root / c``. Any other root is itself."""
    value = root.detach()
    scale = static_scale(root)
    if scale is None:
        return value
    operand = _scaled_operand(root, sys._getframe(1))
    if operand is not None:
        return operand.detach()
    return value.float() / scale


def _scaled_operand(root: Any, frame: Any) -> Any:
    """The tensor a static scale multiplied to make ``root``: a local of ``frame`` or a frame
    above it, whose autograd node is the scale's input (None when none holds it)."""
    import torch

    inner = next((fn for fn, _ in root.grad_fn.next_functions if fn is not None), None)
    for _ in range(_OPERAND_FRAMES):
        if frame is None or inner is None:
            return None
        for value in list(frame.f_locals.values()):
            if type(value) is torch.Tensor and value.grad_fn is inner and value.numel() == 1:
                return value
        frame = frame.f_back
    return None


def weighted_inputs(root: Any, params: list[Any], limit: int = 2000) -> tuple[Any, ...]:
    """The data a loss's graph applied the weights to: what an op that takes a parameter saved
    beside it that needs no gradient (``xb`` of ``xb @ w``), read before the backward frees it.
    A loop that updates by hand calls no model: this is its batch. Empty when none is found."""
    ids = {id(p) for p in params}
    found: list[Any] = []
    for node in graph_nodes(root, limit):
        takes_weight = any(getattr(child, "variable", None) is not None
                           and id(child.variable) in ids
                           for child, _ in getattr(node, "next_functions", ()))  # fmt: skip
        if not takes_weight:
            continue
        try:
            saved = saved_tensors(node)
        except RuntimeError:
            return ()  # (the graph is freed already)
        for value in saved.values():
            if (not value.requires_grad and id(value) not in ids and value.dim() >= 1
                    and not any(value is f for f in found)):  # fmt: skip
                found.append(value)
    return tuple(found)
