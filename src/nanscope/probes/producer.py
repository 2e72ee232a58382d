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
* :func:`graph_producer`, before ``backward()`` frees a non-finite loss's graph: its nodes rerun
  from the inputs they saved.

A producer op is run again in float32 / float64 from the same inputs
(:func:`nanscope.probes._measure.recompute`): finite there and past the float16 / bfloat16 range
in the op's own dtype is a measured precision overflow (:data:`~nanscope.numerics.HALF_MAX`), not
a guess. Later failures are replayed by :mod:`nanscope.probes.locate` (forward under the same
kind of mode, backward with node hooks), which builds on this module's result; ``observed`` is
true only for what an op check actually saw.

Everything is guarded: a fault here switches the watch off with one warning, never an exception in
the user's training.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import os
import sys
import threading
import warnings
from typing import Any

from nanscope._frames import user_frame
from nanscope.numerics import HALF_MAX, op_name
from nanscope.probes._measure import (
    backward_located,
    forward_name,
    made_by,
    precision_verdict,
    why_nonfinite,
    widened,
)
from nanscope.probes._source import scan_function
from nanscope.probes._tensors import (
    all_finite,
    float_tensors,
    graph_nodes,
    inputs_in_order,
    nonfinite_scalar,
    saved_tensors,
    summary,
    tensors,
)

__all__ = [
    "FIRST_UPDATE_WATCH",
    "GRAPH_NODE",
    "HALF_MAX",
    "FirstUpdateWatch",
    "graph_producer",
    "recompute_without_rows",
]  # fmt: skip

#: ops the live watch checks at most (one update of a very large script stops being checked)
OP_BUDGET = 200_000
#: propagators kept after the producer
CHAIN = 12

_INPLACE_DUNDER = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__", "__ipow__",
                   "__ifloordiv__", "__imatmul__"}  # fmt: skip


def _torch() -> Any:
    import torch

    return torch


#: this module's own frames (the watch's mode and checks) stand between an op and its caller
_HERE = __file__


def _user_line(skip: int) -> dict[str, Any] | None:
    """The user's line running the op (``skip`` frames up): ``None`` when that line is nanscope's
    own (its measures of the update are not the user's ops)."""
    frame = user_frame(sys._getframe(skip), through=(_HERE,))
    if frame is None:
        return None
    code = frame.f_code
    out: dict[str, Any] = {"file": code.co_filename, "line": frame.f_lineno,
                           "function": code.co_name}  # fmt: skip
    with contextlib.suppress(Exception):
        text = linecache.getline(code.co_filename, frame.f_lineno).strip()
        if text:
            out["code"] = text
    return out


def _is_inplace(func: Any, kwargs: dict[str, Any]) -> bool:
    name = getattr(func, "__name__", "") or ""
    if name in _INPLACE_DUNDER:
        return True
    return (name.endswith("_") and not name.startswith("__")) or "out" in kwargs


# ------------------------------------------------------------------------------ the live watch


def _records_graph(out: Any) -> bool:
    """``out`` is a tensor an autograd graph is being built from (an update's forward)."""
    return bool(getattr(out, "requires_grad", False)) and _torch().is_grad_enabled()


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
        self.producer_after_backward = False
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

    def end_by_hand(self) -> None:
        """A loop that updates by hand was found, at the end of update 2's backward: update 1
        ended at its own update, so a producer seen in a forward after its backward was update
        2's (the replay's control sees it again, as what it is). Forget it, and stop."""
        if self.producer is not None and self.producer_after_backward:
            self.producer, self.chain = None, []
        self.stop()

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
                ins = float_tensors(args) + float_tensors(kwargs)
                finite = all_finite(ins)
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
        for t in tensors(out)[:2]:
            fn = getattr(t, "grad_fn", None)
            if fn is not None and id(fn) not in self.nodes:
                self.nodes[id(fn)] = {"forward_op": op_name(func), "module": self._module_name(),
                                      "source": _user_line(4)}  # fmt: skip

    def _check(self, func: Any, args: Any, kwargs: Any, out: Any, inplace: bool,
               before: Any) -> None:  # fmt: skip
        outs = float_tensors(out)
        if inplace and not outs:
            outs = float_tensors(args[:1]) + float_tensors(kwargs.get("out"))
        if not outs or all_finite(outs):
            return
        source = _user_line(3)
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
            floats = float_tensors(args) + float_tensors(kwargs)
            in_finite = all_finite(floats)
            ins = inputs_in_order(args, floats)
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
        located.update(made_by(why, ins))
        if why["kind"] == "past_range" or s["dtype"] in ("float16", "bfloat16"):
            located.update(widened(func, call_args, kwargs, s["dtype"]))
        self.producer = located
        # a graph built after a backward: another micro-batch of update 1, or, in a loop that
        # updates by hand (no step to stop at), update 2's forward (:meth:`end_by_hand`)
        self.producer_after_backward = self.backward_done and not self.in_backward and (
            _records_graph(out))  # fmt: skip

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
        roots = tensors(root)
        if not roots or getattr(roots[0], "grad_fn", None) is None:
            return
        fn = roots[0].grad_fn
        scale = _loss_scale(fn)
        if scale is not None:
            self.loss_scale = scale
        source = _user_line(4)
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
                if not gi or all_finite(gi) or not all_finite(go):
                    return
                self.producer = backward_located(node, gi, go, source)
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


#: the process's live watch (one: the first update of the first watched fit)
FIRST_UPDATE_WATCH = FirstUpdateWatch()


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
    kept = list(saved.values())
    if not kept or any(t.dim() < 1 or t.shape[0] != batch for t in kept):
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
    order = graph_nodes(root, 5000)
    found: dict[str, Any] | None = None
    with torch.no_grad():
        for node in reversed(order):  # the deepest (earliest in the forward) first
            name = type(node).__name__
            try:
                saved = saved_tensors(node)
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
            if out is None or all_finite([out]):
                continue
            if inputs and not all_finite(list(inputs.values())):
                continue  # a propagator
            ins = [summary(t) for t in list(inputs.values())[:4]]
            s = summary(out)
            op = forward_name(name)
            why = why_nonfinite(op, ins, s["dtype"]) if ins else {
                "kind": "other", "text": "its inputs were not kept by autograd"}  # fmt: skip
            found = {
                "phase": "loss", "op": op, "backward_op": name, "module": "loss",
                "dtype": s["dtype"], "output": "nan" if s.get("nan") else "inf",
                "observed": observed and bool(ins), "input_values": ins, **made_by(why, ins),
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
        source = scan_function(site, found["op"])
        if source:
            found["source"] = source
    return found
