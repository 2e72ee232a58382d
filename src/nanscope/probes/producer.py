"""The producer: the first op whose inputs were all finite and whose output was not.

nanscope stops where a non-finite value is *seen* (the loss, a gradient, a weight); this probe
names where it was *born*. Two ways in, both PyTorch:

* :class:`FirstUpdateWatch`, live: from the moment nanscope starts watching until the first
  optimizer step has run (update 1, where most absurd-from-the-start failures happen), a
  ``TorchFunctionMode`` checks every op's output. It sees the batch's preprocessing in the training
  loop, the model's forward (with the module running, through global module hooks), the loss
  expression, the backward (a hook on every autograd node of the graph ``backward()`` is called
  on: the first node whose input gradient is finite and whose output gradient is not) and the
  optimizer's own arithmetic (in-place ops are checked on their inputs *before* they run). The
  first producer and the propagators after it (``chain``) are kept; then it checks nothing more
  and leaves the mode stack as soon as the update is over. An op budget bounds its cost.
* :func:`recompute`: a producer op run again in float32 / float64 from the same inputs. Finite
  there and past the float16 / bfloat16 range in the op's own dtype is a measured precision
  overflow (:data:`HALF_MAX`), not a guess.

Later failures are replayed by :mod:`nanscope.probes.locate` (forward under the same kind of mode,
backward with node hooks); this module turns either result into the ``located`` dict of the
diagnosis, with ``observed`` true only for what an op check actually saw.

Everything is guarded: a fault here switches the watch off with one warning, never an exception in
the user's training.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
import warnings
from typing import Any

__all__ = ["FLOAT_MAX", "HALF_MAX", "LIVE", "FirstUpdateWatch", "nonfinite_scalar", "recompute",
           "summary", "why_nonfinite"]  # fmt: skip

#: the largest finite float16 and bfloat16
HALF_MAX = 65504.0
BF16_MAX = 3.3895313892515355e38
FLOAT_MAX = {"float16": HALF_MAX, "bfloat16": BF16_MAX, "float32": 3.4028234663852886e38,
             "float64": 1.7976931348623157e308}  # fmt: skip

#: ops the live watch checks at most (one update of a very large script stops being checked)
OP_BUDGET = 200_000
#: propagators kept after the producer
CHAIN = 12

_INPLACE_DUNDER = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__", "__ipow__",
                   "__ifloordiv__", "__imatmul__"}  # fmt: skip
_NAME_FIXES = {
    "truediv": "div", "rtruediv": "div", "true_divide": "div", "divide": "div", "rpow": "pow",
    "rdiv": "div", "rmul": "mul", "rsub": "sub", "radd": "add", "itruediv": "div",
    "imul": "mul", "iadd": "add", "isub": "sub", "ipow": "pow", "square": "pow",
}  # fmt: skip
#: op families, by how they turn finite inputs into a non-finite output
LOG_OPS = ("log", "xlogy", "binary_cross_entropy", "nll_loss", "cross_entropy", "digamma",
           "lgamma", "logit", "acosh", "atanh", "special_entr", "specialentr")  # fmt: skip
DIV_OPS = ("div", "reciprocal", "rsqrt", "sqrt", "norm", "std", "var", "cosine", "normalize",
           "remainder", "fmod", "cdist", "pdist")  # fmt: skip
GROW_OPS = ("exp", "pow", "mul", "matmul", "mm", "bmm", "addmm", "linear", "sum", "mean",
            "cumsum", "prod", "sinh", "cosh", "expm1", "add", "sub", "conv", "einsum",
            "baddbmm", "addmv", "mv", "dot", "softplus", "mse_loss", "to", "copy", "float",
            "half", "bfloat16", "type")  # fmt: skip


def _torch() -> Any:
    import torch

    return torch


def _lib_dirs() -> tuple[str, ...]:
    """torch's folder and the stdlib modules that sit between an op and its caller."""
    torch = _torch()
    dirs = [os.path.dirname(torch.__file__)]
    for name in ("contextlib", "functools", "runpy", "threading"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            dirs.append(os.path.splitext(str(mod.__file__))[0])
    return tuple(os.path.realpath(d) for d in dirs)


_NANSCOPE = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HERE = os.path.realpath(os.path.abspath(__file__))
_PATCHES = os.path.join(_NANSCOPE, "torch", "_hooks.py")
#: filename -> "lib" | "nanscope" | "here" | "user"
_KIND: dict[str, str] = {}


def _kind(path: str, lib: tuple[str, ...]) -> str:
    hit = _KIND.get(path)
    if hit is None:
        real = os.path.realpath(path) if path and not path.startswith("<") else path
        if real == _HERE:
            hit = "here"
        elif real == _PATCHES:
            hit = "lib"  # nanscope's patches of torch (loss modules, GradScaler.step) call through
        elif not path or path.startswith("<frozen") or any(real.startswith(d) for d in lib):
            hit = "lib"
        elif real.startswith(_NANSCOPE + os.sep):
            hit = "nanscope"
        else:
            hit = "user"
        _KIND[path] = hit
    return hit


def user_frame(lib: tuple[str, ...], skip: int = 1) -> dict[str, Any] | None:
    """The innermost frame outside torch: the user's line running the op.

    ``None`` when that frame is nanscope's own (its measures of the update are not the user's ops).
    """
    frame: Any = sys._getframe(skip)
    for _ in range(64):
        if frame is None:
            return None
        code = frame.f_code
        kind = _kind(code.co_filename, lib)
        if kind == "nanscope":
            return None
        if kind == "user":
            out: dict[str, Any] = {"file": code.co_filename, "line": frame.f_lineno,
                                   "function": code.co_name}  # fmt: skip
            with contextlib.suppress(Exception):
                import linecache

                text = linecache.getline(code.co_filename, frame.f_lineno).strip()
                if text:
                    out["code"] = text
            return out
        frame = frame.f_back
    return None


def op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or str(func)
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    name = name.strip("_")
    return _NAME_FIXES.get(name, name)


def _is_inplace(func: Any, kwargs: dict[str, Any]) -> bool:
    name = getattr(func, "__name__", "") or ""
    if name in _INPLACE_DUNDER:
        return True
    return (name.endswith("_") and not name.startswith("__")) or "out" in kwargs


def _tensors(obj: Any, depth: int = 0) -> list[Any]:
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list[Any] = []
    if depth < 3 and isinstance(obj, (list, tuple)):
        for item in obj:
            out.extend(_tensors(item, depth + 1))
    elif depth < 3 and isinstance(obj, dict):
        for item in obj.values():
            out.extend(_tensors(item, depth + 1))
    return out


def _floats(obj: Any) -> list[Any]:
    return [t for t in _tensors(obj) if t.is_floating_point() and t.numel() and not t.is_meta]


def _finite(tensors: list[Any]) -> bool:
    """All values finite. One pass (a sum, which any NaN or inf makes non-finite); the exact
    check only when the sum is not finite (it may have overflowed on finite values)."""
    torch = _torch()
    for t in tensors:
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


def summary(t: Any) -> dict[str, Any]:
    """dtype, shape, max |x| over the finite values, zero count, non-finite count, min."""
    torch = _torch()
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


def _in_order(args: Any, tensors: list[Any]) -> list[dict[str, Any]]:
    """The op's inputs in argument order: its floating tensors and its plain numbers (a divisor
    that is a Python 0 is as much a zero denominator as a tensor's); at most four."""
    out: list[dict[str, Any]] = []
    ids = {id(t) for t in tensors}
    for arg in args:
        if id(arg) in ids:
            out.append(summary(arg))
        elif isinstance(arg, (int, float)) and not isinstance(arg, bool) and math.isfinite(arg):
            out.append(number_summary(arg))
    if not any(s["dtype"] != "python" for s in out):
        out = [summary(t) for t in tensors]  # the tensors came by keyword: those, at least
    return out[:4]


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
    if any(k in low for k in DIV_OPS):
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
    torch = _torch()
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
            tensors = _floats(res)
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


# ------------------------------------------------------------------------------ the live watch


def _multi_rank() -> bool:
    """Whether this process is one rank of several in an initialised process group."""
    dist: Any = getattr(_torch(), "distributed", None)
    try:
        return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:
        return False


def _compiling() -> bool:
    """True while ``torch.compile`` traces (hooks run inside the traced function then)."""
    check = getattr(getattr(_torch(), "compiler", None), "is_compiling", None)
    return bool(check()) if check is not None else False


class FirstUpdateWatch:
    """Checks every op of the first update, live, and keeps the first producer and its chain.

    ``start()`` when nanscope begins watching (the autowatch's enable, a ``Watcher``'s creation);
    ``stop()`` after the first optimizer step, or at a stop. ``result()`` is the producer found (or
    ``None``) with ``update`` = 1.
    """

    def __init__(self) -> None:
        self.mode: Any = None
        self.active = False
        self.done = False
        self.broken = False
        self.pushed = False
        self.lock = threading.Lock()
        self.thread: int | None = None
        self.reset()

    def reset(self) -> None:
        self.producer: dict[str, Any] | None = None
        self.chain: list[dict[str, Any]] = []
        self.ops = 0
        self.modules: list[Any] = []
        self.forward_seen = False
        self.in_backward = 0
        self.backward_done = False
        self.loss_scale: float | None = None
        self.handles: list[Any] = []
        self.nodes: dict[int, dict[str, Any]] = {}
        self.fault: str | None = None

    # ------------------------------------------------------------ lifecycle

    def enabled(self) -> bool:
        return os.environ.get("NANSCOPE_FIRST_UPDATE", "1") not in ("0", "off", "no", "false")

    def start(self) -> None:
        """Push the mode (once per process): every op from now to the first step is checked."""
        with self.lock:
            if self.active:
                return
            self.reset()  # a producer of an earlier watch in this process is not this run's
            if self.broken or not self.enabled():
                return
            try:
                self._start()
            except Exception as exc:
                self._fail(exc)

    def _start(self) -> None:
        from torch.nn.modules import module as module_mod
        from torch.overrides import TorchFunctionMode

        from nanscope.torch._hooks import transforming

        self.lib = _lib_dirs()
        watch = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                kwargs = kwargs or {}
                if not watch.active or compiling() or threading.get_ident() != watch.thread:
                    return func(*args, **kwargs)
                if transforming():  # a torch.func transform's or a jit trace's stand-in values
                    return func(*args, **kwargs)
                if _multi_rank():
                    # ranks exchange tensors (DDP, FSDP): checking ops here would wait on or
                    # reorder collectives on one rank alone, so this update is not watched
                    watch.active = False
                    return func(*args, **kwargs)
                return watch._call(func, args, kwargs)

        compiling = getattr(getattr(_torch(), "compiler", None), "is_compiling", lambda: False)
        self.mode = _Mode()
        self.thread = threading.get_ident()
        self.handles.append(module_mod.register_module_forward_pre_hook(self._pre))
        self.handles.append(module_mod.register_module_forward_hook(self._post, always_call=True))
        self.mode.__enter__()
        self.pushed = True
        self.active = True

    def stop(self) -> None:
        """Leave the mode stack (only when ours is on top; else just go quiet) and unhook."""
        if not self.pushed:  # every step after the first: nothing to do, no lock to take
            return
        with self.lock:
            if not self.pushed:
                return
            self.pushed = False
            self.active = False
            self.done = True
            for h in self.handles:
                with contextlib.suppress(Exception):
                    h.remove()
            self.handles = []
            self._clear_node_hooks()
            if threading.get_ident() == self.thread:
                with contextlib.suppress(Exception):
                    _remove_mode(self.mode)

    def _fail(self, exc: BaseException) -> None:
        self.fault = f"{type(exc).__name__}: {exc}"
        self.broken = True
        self.active = False
        self.done = True
        warnings.warn(
            f"nanscope: the first-update op watch failed ({self.fault}); it is off, the "
            "diagnosis goes on without it. Please report this.",
            RuntimeWarning,
            stacklevel=3,
        )

    def result(self) -> dict[str, Any] | None:
        if self.producer is None:
            return None
        out = dict(self.producer)
        out["chain"] = list(self.chain)
        if self.loss_scale is not None:
            out["loss_scale"] = self.loss_scale
        return out

    # ------------------------------------------------------------ module hooks

    def _pre(self, module: Any, args: Any) -> None:
        # (under torch.compile the hooks are traced into the graph: the watch looks at eager ops
        # only, and reading its own state there trips the compiler's side-effect tracking)
        if self.active and not _compiling():
            self.modules.append(module)
            self.forward_seen = True

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self.active and not _compiling() and self.modules:
            self.modules.pop()

    def _module_name(self) -> str | None:
        if not self.modules:
            return None
        root, leaf = self.modules[0], self.modules[-1]
        if leaf is root:
            return type(root).__name__
        with contextlib.suppress(Exception):
            for name, m in root.named_modules():
                if m is leaf:
                    return name or type(root).__name__
        return type(leaf).__name__

    def _phase(self, source: dict[str, Any] | None) -> str:
        if self.in_backward:
            return "backward"
        if self.modules:
            from torch.nn.modules.loss import _Loss

            return "loss" if isinstance(self.modules[0], _Loss) else "forward"
        if self.backward_done:
            return "optimizer"
        return "loss" if self.forward_seen else "preprocess"

    # ------------------------------------------------------------ each op

    def _call(self, func: Any, args: Any, kwargs: Any) -> Any:
        self.ops += 1
        if self.ops > OP_BUDGET or len(self.chain) >= CHAIN:
            self.active = False  # enough: pass everything through from now on
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name == "backward" or func is getattr(_torch().autograd, "backward", None):
            return self._backward(func, args, kwargs)
        if name == "__get__":
            return func(*args, **kwargs)  # an attribute read (p.grad, x.data) computes nothing
        try:
            inplace = _is_inplace(func, kwargs)
            before = None
            if inplace and self.producer is None:
                ins = _floats(args) + _floats(kwargs)
                finite = _finite(ins)
                # only a finite start can make a producer: keep its values (summarised if it is)
                before = (finite, [t.detach().clone() for t in ins[:4]] if finite else [])
        except Exception as exc:
            self._fail(exc)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        try:
            self._check(func, args, kwargs, out, inplace, before)
            if self.producer is None and len(self.nodes) < 50_000:
                self._remember_node(func, out)
        except Exception as exc:
            self._fail(exc)
        return out

    def _remember_node(self, func: Any, out: Any) -> None:
        """Which op, module and line made each autograd node (for a backward producer)."""
        torch = _torch()
        if not torch.is_grad_enabled():
            return
        for t in _tensors(out)[:2]:
            fn = getattr(t, "grad_fn", None)
            if fn is not None and id(fn) not in self.nodes:
                self.nodes[id(fn)] = {"forward_op": op_name(func), "module": self._module_name(),
                                      "source": user_frame(self.lib, 4)}  # fmt: skip

    def _check(self, func: Any, args: Any, kwargs: Any, out: Any, inplace: bool,
               before: Any) -> None:  # fmt: skip
        outs = _floats(out)
        if inplace and not outs:
            outs = _floats(args[:1]) + _floats(kwargs.get("out"))
        if not outs or _finite(outs):
            return
        source = user_frame(self.lib, 3)
        if source is None:
            return  # nanscope's or torch's own op, not the user's
        op = op_name(func)
        if self.producer is not None:
            self.chain.append({"op": op, "phase": self._phase(source), "module":
                               self._module_name(), "source": source})  # fmt: skip
            return
        if before is not None:
            in_finite, originals = before
            ins = [summary(t) for t in originals]
            call_args: Any = (*originals, *args[len(originals):]) if originals else args
        else:
            tensors = _floats(args) + _floats(kwargs)
            in_finite = _finite(tensors)
            ins = _in_order(args, tensors)
            call_args = args
        if not in_finite or nonfinite_scalar(args, kwargs):
            return  # a propagator of a value made before the watch, or a deliberate inf
        if not ins or op.startswith(("empty", "new_empty", "set")):
            return  # made from no finite value (uninitialised memory, a literal): not computed
        s = summary(outs[0])
        located: dict[str, Any] = {
            "phase": self._phase(source), "op": op, "module": self._module_name(),
            "source": source, "dtype": s["dtype"], "output": "nan" if s.get("nan") else "inf",
            "input_values": ins, "observed": True, "how": "first-update op watch", "update": 1,
        }  # fmt: skip
        why = why_nonfinite(op, ins, s["dtype"])
        located["why"] = why
        located["inputs"] = _inputs_text(why)
        located["input_zero"] = bool(why.get("zero"))
        located["input_absmax"] = max((x.get("absmax", 0.0) for x in ins), default=None)
        if why["kind"] == "past_range" or s["dtype"] in ("float16", "bfloat16"):
            kw = {k: v for k, v in kwargs.items() if k != "out"}
            located["recomputed"] = recompute(func, call_args, kw)
            verdict = precision_verdict(s["dtype"], located["recomputed"])
            if verdict:
                located["precision"] = verdict
        self.producer = located

    # ------------------------------------------------------------ the backward

    def _backward(self, func: Any, args: Any, kwargs: Any) -> Any:
        root = args[0] if args else kwargs.get("tensors")
        try:
            if self.producer is None:
                self._hook_graph(root)
        except Exception as exc:
            self._fail(exc)
        self.in_backward += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.in_backward -= 1
            self.backward_done = True
            self._clear_node_hooks()

    def _hook_graph(self, root: Any) -> None:
        torch = _torch()
        roots = _tensors(root)
        if not roots or getattr(roots[0], "grad_fn", None) is None:
            return
        fn = roots[0].grad_fn
        scale = _loss_scale(fn)
        if scale is not None:
            self.loss_scale = scale
        source = user_frame(self.lib, 4)
        seen: set[int] = set()
        queue = [fn]
        count = 0
        while queue and count < 20000:
            node = queue.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            count += 1
            queue.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
            if type(node).__name__ == "AccumulateGrad":
                continue
            with contextlib.suppress(Exception):
                self.node_handles.append(node.register_hook(self._node_hook(node, source)))
        del torch

    @property
    def node_handles(self) -> list[Any]:
        handles = self.__dict__.setdefault("_node_handles", [])
        return handles  # type: ignore[no-any-return]

    def _clear_node_hooks(self) -> None:
        for h in self.node_handles:
            with contextlib.suppress(Exception):
                h.remove()
        self.node_handles.clear()

    def _node_hook(self, node: Any, source: dict[str, Any] | None) -> Any:
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            if self.producer is not None or not self.active:
                return
            try:
                gi = [g for g in grad_inputs if g is not None and g.is_floating_point()]
                go = [g for g in grad_outputs if g is not None and g.is_floating_point()]
                if not gi or _finite(gi) or not _finite(go):
                    return
                self.producer = _node_located(node, gi, go, source)
                known = self.nodes.get(id(node)) or {}
                for key in ("forward_op", "module", "source"):
                    if known.get(key) and not self.producer.get(key):
                        self.producer[key] = known[key]
                self.producer["how"] = "first-update op watch"
                self.producer["update"] = 1
            except Exception as exc:
                self._fail(exc)

        return hook


def _remove_mode(mode: Any) -> None:
    """Take ``mode`` off this thread's function-mode stack, wherever it is (modes the user pushed
    after it, ``with torch.device(...)`` for one, are put back in their order)."""
    torch = _torch()
    C = torch._C
    depth = C._len_torch_function_stack()
    if not any(C._get_function_stack_at(i) is mode for i in range(depth)):
        return
    above: list[Any] = []
    while C._len_torch_function_stack() > 0:
        top = C._pop_torch_function_stack()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        C._push_on_torch_function_stack(m)


def _inputs_text(why: dict[str, Any]) -> str:
    kind = why.get("kind")
    if kind in ("zero_denominator", "log_domain") and why.get("zero"):
        return "exactly zero"
    if kind == "past_range":
        return "past the half range" if why.get("limit") == HALF_MAX else "huge"
    if kind == "nonfinite_input":
        return "non-finite"
    return str(why.get("text", ""))


def _loss_scale(fn: Any) -> float | None:
    """The constant a loss was multiplied by right before ``backward()`` (a hand-rolled scale)."""
    torch = _torch()
    if type(fn).__name__ not in ("MulBackward0", "MulBackward1"):
        return None
    for attr in ("_saved_other", "_saved_self"):
        try:
            value = getattr(fn, attr)
        except Exception:
            continue
        constant = isinstance(value, torch.Tensor) and value.numel() == 1 and not (
            value.requires_grad
        )
        if constant or isinstance(value, (int, float)):
            v = float(value)
        else:
            continue
        if math.isfinite(v) and abs(v) >= 256:
            return v
    return None


def _saved(node: Any) -> dict[str, Any]:
    torch = _torch()
    saved: dict[str, Any] = {}
    for attr in dir(node):
        if not attr.startswith("_saved_") or attr.endswith(("_sym_sizes", "_sizes", "_strides")):
            continue
        try:
            value = getattr(node, attr)
        except Exception:
            continue
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            saved[attr[len("_saved_"):]] = value
    return saved


def _node_located(node: Any, gi: list[Any], go: list[Any],
                  source: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """A backward node that made a non-finite gradient from a finite one."""
    name = type(node).__name__
    g_in = summary(gi[0])
    g_out = [summary(g) for g in go[:2]]
    saved = {}
    with contextlib.suppress(Exception):
        saved = {k: summary(v) for k, v in list(_saved(node).items())[:4]}
    dtype = g_in["dtype"]
    located: dict[str, Any] = {
        "phase": "backward", "op": name, "module": None, "dtype": dtype,
        "output": "nan" if g_in.get("nan") else "inf", "observed": True,
        "grad_in": g_out, "saved": saved,
    }  # fmt: skip
    if source is not None:
        located["backward_source"] = source
    with contextlib.suppress(Exception):
        from nanscope.probes.locate import _library_dirs, _source_from_traceback

        tb = node.metadata.get("traceback_")
        src = _source_from_traceback(tb, _library_dirs()) if tb else None
        if src:
            located["source"] = src
    limit = FLOAT_MAX.get(dtype)
    gmax = max((s.get("absmax", 0.0) for s in g_out), default=0.0)
    low = name.lower()
    log_like = any(k in low for k in LOG_OPS)
    zero = any(s.get("zeros") for s in saved.values()) and (log_like or any(
        k in low for k in ("sqrt", "norm", "div", "pow", "rsqrt", "reciprocal")))
    why: dict[str, Any]
    if zero:
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
    located["inputs"] = _inputs_text(why)
    located["input_zero"] = bool(why.get("zero"))
    located["input_absmax"] = max([gmax] + [s.get("absmax", 0.0) for s in saved.values()])
    return located


#: the process's live watch (one: the first update of the first watched fit)
LIVE = FirstUpdateWatch()


# ------------------------------------------------------------------ the loss graph, recomputed


def _recompute_node(name: str, node: Any, saved: dict[str, Any], dtype: Any = None) -> Any:
    """The forward output of a few common autograd nodes, from their saved inputs (or None)."""
    torch = _torch()
    F = torch.nn.functional

    def s(key: str) -> Any:
        t = saved.get(key)
        if t is not None and dtype is not None:
            t = t.to(dtype)
        return t

    if name == "PowBackward0" and s("self") is not None:
        exponent = getattr(node, "_saved_exponent", None)
        if isinstance(exponent, (int, float)):
            return s("self") ** exponent
    if name == "MulBackward0" and s("self") is not None and s("other") is not None:
        return s("self") * s("other")
    if name == "DivBackward0" and s("self") is not None and s("other") is not None:
        return s("self") / s("other")
    if name in ("LogBackward0", "Log2Backward0", "Log10Backward0", "Log1PBackward0"):
        fn = {"LogBackward0": torch.log, "Log2Backward0": torch.log2,
              "Log10Backward0": torch.log10, "Log1PBackward0": torch.log1p}[name]  # fmt: skip
        if s("self") is not None:
            return fn(s("self"))
    if name == "XlogyBackward0" and s("self") is not None and s("other") is not None:
        return torch.xlogy(s("self"), s("other"))
    if name == "MseLossBackward0" and s("self") is not None and s("target") is not None:
        return F.mse_loss(s("self"), s("target"), reduction="none")
    if name == "BinaryCrossEntropyBackward0" and s("self") is not None and (
        s("target") is not None
    ):
        return F.binary_cross_entropy(s("self"), s("target"), reduction="none")
    if name == "MmBackward0" and s("self") is not None and s("mat2") is not None:
        return s("self") @ s("mat2")
    if name == "AddmmBackward0" and s("mat1") is not None and s("mat2") is not None:
        return s("mat1") @ s("mat2")
    return None


#: the producer node of the last non-finite loss graph: {"name", "node", "saved", "op"}
GRAPH_NODE: dict[str, Any] = {}
#: nodes whose saved inputs all share the batch's first dimension (rows can be left out)
_ELEMENTWISE = ("PowBackward0", "MulBackward0", "DivBackward0", "LogBackward0", "Log2Backward0",
                "Log10Backward0", "Log1PBackward0", "XlogyBackward0", "MseLossBackward0",
                "BinaryCrossEntropyBackward0")  # fmt: skip


def recompute_without_rows(rows: list[int], batch: int, loss: Any) -> dict[str, Any] | None:
    """The graph producer of ``loss`` recomputed with the batch rows ``rows`` left out (or None)."""
    torch = _torch()
    if not GRAPH_NODE or GRAPH_NODE.get("loss") != id(loss):
        return None
    saved = GRAPH_NODE["saved"]
    tensors = [t for t in saved.values()]
    if not tensors or any(t.dim() < 1 or t.shape[0] != batch for t in tensors):
        return None
    keep = torch.ones(batch, dtype=torch.bool)
    keep[[r for r in rows if 0 <= r < batch]] = False
    cut = {k: v[keep.to(v.device)] for k, v in saved.items()}
    with torch.no_grad():
        out = _recompute_node(GRAPH_NODE["name"], GRAPH_NODE["node"], cut)
    if out is None:
        return None
    s = summary(out)
    return {"op": GRAPH_NODE["op"], "finite": "nonfinite" not in s, "absmax": s["absmax"]}


_RESULT_ONLY = ("ExpBackward0", "SqrtBackward0", "RsqrtBackward0", "ReciprocalBackward0",
                "LogSoftmaxBackward0", "SoftmaxBackward0", "TanhBackward0", "SigmoidBackward0",
                "StdBackward0", "PowBackward1")  # fmt: skip


def graph_producer(loss: Any, site: Any = None) -> dict[str, Any] | None:
    """The producer inside a non-finite loss's live autograd graph, recomputed from saved inputs.

    Called before ``backward()`` frees the saved tensors: each node whose forward can be rerun
    from what it saved (``pow``, ``mul``, ``div``, ``log``, ``mse_loss``, ``mm`` ...) is rerun; the
    deepest one whose saved inputs are finite and whose output is not is the producer (observed).
    """
    torch = _torch()
    root = getattr(loss, "grad_fn", None)
    if root is None:
        return None
    order: list[Any] = []
    seen: set[int] = set()
    queue = [root]
    while queue and len(order) < 5000:
        node = queue.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        queue.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
    found: dict[str, Any] | None = None
    with torch.no_grad():
        for node in reversed(order):  # the deepest (earliest in the forward) first
            name = type(node).__name__
            try:
                saved = _saved(node)
            except Exception:
                continue
            if not saved:
                continue
            inputs = {k: v for k, v in saved.items() if k != "result"}
            out = None
            with contextlib.suppress(Exception):
                out = _recompute_node(name, node, saved)
            observed = out is not None
            if out is None and name in _RESULT_ONLY and "result" in saved:
                out = saved["result"]
            if out is None or _finite([out]):
                continue
            if inputs and not _finite(list(inputs.values())):
                continue  # a propagator
            ins = [summary(t) for t in list(inputs.values())[:4]]
            s = summary(out)
            op = re.sub(r"Backward\d*$", "", name)
            op = re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()
            why = why_nonfinite(op, ins, s["dtype"]) if ins else {
                "kind": "other", "text": "its inputs were not kept by autograd"}  # fmt: skip
            found = {
                "phase": "loss", "op": op, "backward_op": name, "module": "loss",
                "dtype": s["dtype"], "output": "nan" if s.get("nan") else "inf",
                "observed": observed and bool(ins), "input_values": ins, "why": why,
                "inputs": _inputs_text(why), "input_zero": bool(why.get("zero")),
                "input_absmax": max((x.get("absmax", 0.0) for x in ins), default=None),
                "how": "the loss's autograd graph, recomputed from its saved inputs",
            }  # fmt: skip
            if observed and name in _ELEMENTWISE:
                # kept (by reference, one at a time) so the confirming experiment can recompute
                # it without the suspect rows
                GRAPH_NODE.clear()
                GRAPH_NODE.update(name=name, node=node, saved=saved, op=op, loss=id(loss))
            if observed and s["dtype"] in ("float16", "bfloat16"):
                wide: dict[str, Any] = {}
                for dt in (torch.float32, torch.float64):
                    with contextlib.suppress(Exception):
                        r = _recompute_node(name, node, saved, dt)
                        if r is not None:
                            rs = summary(r)
                            wide[str(dt).replace("torch.", "")] = {
                                "finite": "nonfinite" not in rs, "absmax": rs["absmax"]}
                found["recomputed"] = wide
                verdict = precision_verdict(s["dtype"], wide)
                if verdict:
                    found["precision"] = verdict
            break
    if found is None:
        return None
    with contextlib.suppress(Exception):
        from nanscope.probes.locate import _scan_function

        source = _scan_function(site, found["op"])
        if source:
            found["source"] = source
    return found
