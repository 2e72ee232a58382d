"""What the op that made a non-finite value measured, in the rules' terms.

Shared by the live watch (:mod:`~nanscope.probes.producer`), the replay
(:mod:`~nanscope.probes.locate`) and the loop's re-evaluation (:mod:`~nanscope.probes.loop`):
the input values that made it (:func:`why_nonfinite`), the op run again wider
(:func:`recompute`, :func:`precision_verdict`) and a backward node's measures
(:func:`backward_located`).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Any

from nanscope.numerics import DIVISION_OPS, FLOAT_MAX, HALF_MAX, LOG_OPS
from nanscope.probes._source import traceback_source
from nanscope.probes._tensors import float_tensors, saved_tensors, summary

__all__ = ["backward_located", "forward_name", "inputs_text", "made_by", "precision_verdict",
           "recompute", "why_nonfinite", "widened"]  # fmt: skip


def why_nonfinite(op: str, ins: list[dict[str, Any]], out_dtype: str) -> dict[str, Any]:
    """The input values that made a finite-input op non-finite, in the rules' terms.

    ``{"kind": "zero_denominator" | "log_domain" | "past_range" | "nonfinite_input" | "other",
    "text": ..., ...}``
    """
    low = op.lower()
    limit = FLOAT_MAX.get(out_dtype)
    absmax = max((s.get("absmax", 0.0) for s in ins), default=0.0)
    if any(s.get("nonfinite") for s in ins):
        return {"kind": "nonfinite_input", "text": "its input was already non-finite"}
    if any(k in low for k in LOG_OPS):
        zero = any(s.get("zeros") for s in ins)
        neg = any(s.get("min", 0.0) < 0 for s in ins[:1])
        if zero or neg:
            text = "its argument was exactly 0" if zero else "its argument was negative"
            return {"kind": "log_domain", "text": text, "zero": zero, "negative": neg}
    if any(k in low for k in DIVISION_OPS):
        if low.startswith(("div", "remainder", "fmod")) and len(ins) >= 2:
            if ins[1].get("zeros"):
                both = bool(ins[0].get("zeros"))
                return {"kind": "zero_denominator", "zero": True, "zero_numerator": both,
                        "text": "its denominator was exactly 0"
                        + (" and so was the numerator (0/0)" if both else "")}  # fmt: skip
        elif any(s.get("zeros") for s in ins) or low.startswith(("rsqrt", "reciprocal")):
            return {"kind": "zero_denominator", "zero": True,
                    "text": "its input was exactly 0"}  # fmt: skip
        if any(s.get("min", 0.0) < 0 for s in ins[:1]) and "sqrt" in low:
            return {"kind": "domain", "text": "its argument was negative"}
    if limit is not None:
        return {"kind": "past_range", "limit": limit, "input_absmax": absmax,
                "text": f"its result passed the {out_dtype} range ({limit:.6g}); the largest "
                        f"input magnitude was {absmax:.3g}"}  # fmt: skip
    return {"kind": "other", "text": f"finite inputs (max |x| = {absmax:.3g})"}


def recompute(func: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    """Run the op again with its floating inputs in float32 and float64: finite there?"""
    import torch

    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.float64):

        def cast(x: Any, dtype: Any = dtype) -> Any:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                return x.detach().to(dtype)
            if isinstance(x, (list, tuple)):
                return type(x)(cast(v) for v in x)
            if isinstance(x, torch.dtype) and x in (torch.float16, torch.bfloat16):
                return dtype
            return x

        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kw = {k: cast(v) for k, v in (kwargs or {}).items() if k != "out"}
                if "dtype" in kw and kw["dtype"] in (torch.float16, torch.bfloat16):
                    kw["dtype"] = dtype
                res = func(*[cast(a) for a in args], **kw)
            tensors = float_tensors(res)
            if not tensors:
                continue
            name = str(dtype).replace("torch.", "")
            s = summary(tensors[0])
            out[name] = {"finite": "nonfinite" not in s, "absmax": s["absmax"]}
        except Exception:
            continue
    return out


def precision_verdict(dtype: str, recomputed: dict[str, Any]) -> dict[str, Any] | None:
    """A measured overflow of float16/bfloat16: finite in float32 (or 64) and past the limit."""
    limit = FLOAT_MAX.get(dtype)
    if dtype not in ("float16", "bfloat16") or limit is None:
        return None
    for wide in ("float32", "float64"):
        r = recomputed.get(wide)
        if r and r.get("finite") and r.get("absmax", 0.0) > limit:
            return {"dtype": dtype, "limit": limit, "value": r["absmax"], "in": wide,
                    "text": f"recomputed in {wide} the result is {r['absmax']:.3g}, finite: past "
                            f"the {dtype} limit {limit:.6g}"}  # fmt: skip
    return None


def inputs_text(why: dict[str, Any]) -> str:
    """The ``inputs`` words of a ``why``: 'exactly zero', 'past the half range' ..."""
    kind = why.get("kind")
    if kind in ("zero_denominator", "log_domain") and why.get("zero"):
        return "exactly zero"
    if kind == "past_range":
        return "past the half range" if why.get("limit") == HALF_MAX else "huge"
    if kind == "nonfinite_input":
        return "non-finite"
    return str(why.get("text", ""))


def made_by(why: dict[str, Any], ins: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``located`` keys of the input values that made an op's non-finite output: ``why``,
    ``inputs``, ``input_zero``, ``input_absmax`` (of the summaries ``ins``)."""
    return {"why": why, "inputs": inputs_text(why), "input_zero": bool(why.get("zero")),
            "input_absmax": max((x.get("absmax", 0.0) for x in ins), default=None)}  # fmt: skip


def widened(func: Any, args: Any, kwargs: Any, dtype: str) -> dict[str, Any]:
    """The ``located`` keys of an op run again in float32 and float64: ``recomputed``, and
    ``precision`` when that measured an overflow of ``dtype``."""
    out: dict[str, Any] = {"recomputed": recompute(func, args, kwargs)}
    verdict = precision_verdict(dtype, out["recomputed"])
    if verdict:
        out["precision"] = verdict
    return out


def forward_name(node_name: str) -> str:
    """The forward op of a backward node: ``BinaryCrossEntropyBackward0`` ->
    ``binary_cross_entropy``."""
    base = re.sub(r"Backward\d*$", "", node_name)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()


def backward_located(node: Any, gi: list[Any], go: list[Any],
                  source: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """A backward node that made a non-finite gradient from a finite one."""
    name = type(node).__name__
    g_in = summary(gi[0])
    g_out = [summary(g) for g in go[:2]]
    saved = {}
    with contextlib.suppress(Exception):
        saved = {k: summary(v) for k, v in list(saved_tensors(node).items())[:4]}
    dtype = g_in["dtype"]
    located: dict[str, Any] = {
        "phase": "backward", "op": name, "module": None, "dtype": dtype,
        "output": "nan" if g_in.get("nan") else "inf", "observed": True,
        "grad_in": g_out, "saved": saved,
    }  # fmt: skip
    if source is not None:
        located["backward_source"] = source
    with contextlib.suppress(Exception):
        tb = node.metadata.get("traceback_")
        src = traceback_source(tb) if tb else None
        if src:
            located["source"] = src
    limit = FLOAT_MAX.get(dtype)
    gmax = max((s.get("absmax", 0.0) for s in g_out), default=0.0)
    low = name.lower()
    log_like = any(k in low for k in LOG_OPS)
    zero = any(s.get("zeros") for s in saved.values()) and (log_like or any(
        k in low for k in ("sqrt", "norm", "div", "pow", "rsqrt", "reciprocal")))
    why: dict[str, Any]
    if any(v.get("nonfinite") for v in saved.values()):
        # what the node saved was already non-finite (data that came in with an inf): it
        # carried that value into the gradient, it did not make it
        why = {"kind": "nonfinite_input", "text": "a saved input of the op was already "
                                                  "non-finite"}  # fmt: skip
    elif zero:
        why = {"kind": "log_domain" if log_like else "zero_denominator",
               "zero": True, "text": "a saved input of the op was exactly 0"}  # fmt: skip
    elif limit is not None and dtype in ("float16", "bfloat16"):
        why = {"kind": "past_range", "limit": limit, "input_absmax": gmax,
               "text": f"the gradient it received reached {gmax:.3g}; its result passed the "
                       f"{dtype} range ({limit:.6g})"}  # fmt: skip
        if any(s["dtype"] in ("float32", "float64") for s in g_out) and gmax > limit:
            located["precision"] = {
                "dtype": dtype, "limit": limit, "value": gmax, "in": g_out[0]["dtype"],
                "text": f"the incoming gradient is {gmax:.3g} in {g_out[0]['dtype']}, finite: "
                        f"past the {dtype} limit {limit:.6g}"}  # fmt: skip
    else:
        why = why_nonfinite(name, list(saved.values()), dtype)
    located["why"] = why
    located["inputs"] = inputs_text(why)
    located["input_zero"] = bool(why.get("zero"))
    located["input_absmax"] = max([gmax] + [s.get("absmax", 0.0) for s in saved.values()])
    return located
