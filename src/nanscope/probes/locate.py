"""Localisation: replay the failing PyTorch update and name the op, module and line that broke it.

The adapter calls :func:`locate` with a :class:`~nanscope.probes.failure.TorchFailure` only after a
detector fired, so a healthy run never pays for any of this. The replay:

1. runs the model's forward again on the failing batch, with the parameters of the failing update
   (the step has not run), the same autocast dtype and, when the adapter saved it, the same RNG
   state, under anomaly mode (every autograd node records the stack that created it), with forward
   hooks on every submodule (which module is running, how large its output is) and a
   ``TorchFunctionMode`` that checks each op's output: the first op whose output is non-finite
   while its inputs are finite is where the NaN or inf was *made*;
2. replays the loss: ``failure.loss_module`` on the replayed output when there is one, otherwise
   the autograd graph of ``failure.loss`` while it still holds its saved tensors;
3. when the forward is clean, runs the backward (``torch.autograd.grad``, so ``.grad`` is never
   touched) with a hook on every autograd node: the first node whose output gradient is non-finite
   while the gradient it received is finite is the backward op (``SqrtBackward0`` at 0,
   ``DivBackward0`` by 0 ...);
4. names the user's source line: anomaly mode's traceback of the node, else the stack at the op,
   else the ``loss.backward()`` function scanned for the op's spelling.

Buffers (batch-norm statistics) are restored after the replay, and parameters' ``.grad`` is never
written. Everything is caught: a bug here returns ``{}`` with one warning, never an exception.

The result (merged into the diagnosis evidence)::

    {"located": {"phase", "op", "module", "source": {"file", "line"}, "inputs", "dtype", ...},
     "rows": [...], "activations": {...}, "weight_scale": {...}}

``located``'s keys are tabled in :mod:`nanscope.located`. The first update's producer, when the
live watch (:mod:`~nanscope.probes.producer`) saw it, wins over the replay's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import linecache
import math
import sys
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

from nanscope._frames import owner
from nanscope.numerics import HALF_MAX, op_name
from nanscope.probes import producer
from nanscope.probes._measure import backward_located, forward_name, why_nonfinite, widened
from nanscope.probes._source import op_family, scan_function, stack_source, traceback_source
from nanscope.probes._tensors import (
    all_finite,
    custom_saved,
    float_tensors,
    graph_nodes,
    has_forward,
    nonfinite_scalar,
    op_watch,
    saved_tensors,
    summary,
    tensors,
)
from nanscope.probes.confirm import confirm
from nanscope.probes.failure import TorchFailure
from nanscope.probes.fperrors import prepared
from nanscope.probes.loop import replay_preprocess

__all__ = ["inspect_graph", "locate"]

#: backward nodes (by name fragment) that turn a zero or a huge input into inf/NaN
_HAZARD_NODES = ("Log", "Div", "Sqrt", "Rsqrt", "Norm", "Pow", "Reciprocal", "Exp", "Xlogy", "Entr",
                 "BinaryCrossEntropy", "Atan2", "Acos", "Asin", "Cdist", "Erfinv")  # fmt: skip

def locate(failure: TorchFailure) -> dict[str, Any]:
    """Replay the failing update and say where the first non-finite value appeared.

    Returns ``{"located": {...}, "rows": [...], ...}`` with whatever could be found, or ``{}``
    (and one warning) when the probe itself failed.
    """
    live: dict[str, Any] | None = None
    try:
        producer.FIRST_UPDATE_WATCH.stop()
        live = producer.FIRST_UPDATE_WATCH.result()
    except Exception:
        live = None
    try:
        result = _with_producer(_Locator(failure).run(), live, failure)
        result = _with_micro_batches(result, failure)
    except Exception as exc:  # a probe bug must never kill the user's run
        _failed("the localisation replay", exc, "; the diagnosis goes on without the op and module")
        return {}
    if failure.extra.get("alarm", "nonfinite") != "nonfinite":
        return result
    try:
        _with_loop_producer(result, failure)
        _with_prepared_producer(result)
    except Exception as exc:  # a probe bug must never kill the user's run
        _failed("the re-evaluation of the loop's preprocessing", exc)
    try:
        result["confirmation"] = confirm(failure, result)
    except Exception as exc:  # a probe bug must never kill the user's run
        _failed("the confirming experiment", exc)
    return result


def _with_micro_batches(result: dict[str, Any], failure: TorchFailure) -> dict[str, Any]:
    """With gradient accumulation the update's last micro-batch (the one replayed) may be clean
    while an earlier one broke: when the replay saw no op make the value, each earlier
    micro-batch's forward is replayed too, and the first that shows the producer is taken."""
    batches = failure.extra.get("micro_batches") or []
    located = result.get("located") or {}
    if not batches or _made_here(located):
        return result
    dropped = ("micro_batches", "graph_located", "output_grad", "rng_state")  # (the last one's)
    extra = {k: v for k, v in failure.extra.items() if k not in dropped}
    for args, kwargs in batches:
        alone = dataclasses.replace(failure, args=args, kwargs=kwargs, output=None, loss=None,
                                    loss_args=(), targets=None, batch_index=None,
                                    extra=extra)  # fmt: skip
        found = _Locator(alone).run()
        seen = found.get("located") or {}
        if _made_here(seen) and seen.get("phase") == "forward":
            seen["micro_batch"] = "an earlier micro-batch of the update, replayed alone"
            out = {**result, "located": seen}
            if found.get("rows"):
                out["rows"] = found["rows"]
            return out
    return result


def _made_here(located: dict[str, Any]) -> bool:
    """The located op was seen make the non-finite value from finite inputs (not guessed, not
    met with a value already non-finite)."""
    guessed = located.get("guessed") or (located.get("source") or {}).get("guessed")
    return bool(located.get("op")) and not guessed and located.get("inputs") != "non-finite"


def _failed(what: str, exc: Exception, then: str = "") -> None:
    """One warning, attributed to :func:`locate`'s caller, for a probe that failed."""
    warnings.warn(f"nanscope: {what} failed ({type(exc).__name__}: {exc}){then}. Please report "
                  "this.", RuntimeWarning, stacklevel=3)  # fmt: skip


def _with_producer(result: dict[str, Any], live: dict[str, Any] | None,
                   failure: TorchFailure) -> dict[str, Any]:  # fmt: skip
    """The live first-update producer when it belongs to this failure; else the replay's, marked."""
    replay = result.get("located")
    step = failure.step  # (a failure of no watched update is not the first update's)
    optimizer = bool(live) and live.get("phase") == "optimizer"  # type: ignore[union-attr]
    if live and step is not None and (step <= 1 or (step == 2 and optimizer)):
        located = dict(live)
        located["step"] = failure.step
        located["detected"] = failure.what
        if replay and replay.get("op") and replay.get("op") != located.get("op"):
            located["replay"] = {k: replay.get(k) for k in ("phase", "op", "module", "note")
                                 if replay.get(k) is not None}  # fmt: skip
        result["located"] = {k: v for k, v in located.items() if v is not None}
        return result
    if failure.what == "weight" or _weights_nonfinite(failure.model):
        located = {
            "phase": "optimizer", "op": None, "observed": False, "step": failure.step,
            "how": "inferred", "detected": failure.what,
            "note": "the weights became non-finite in the optimizer step of the update before, "
                    "whose gradients were finite; that step's arithmetic was not replayed",
        }  # fmt: skip
        if replay:
            located["replay"] = {k: replay.get(k) for k in ("phase", "op", "module", "note")
                                 if replay.get(k) is not None}  # fmt: skip
        result["located"] = located
    elif replay:
        observed = not replay.get("guessed") and not replay.get("note") and bool(replay.get("op"))
        replay.setdefault("observed", observed)
        replay.setdefault("how", "replay of the failing update")
        replay.setdefault("detected", failure.what)
        result["located"] = replay
    elif failure.model is not None and failure.extra.get("alarm") == "nonfinite":
        result["located"] = {
            "observed": False, "found": False, "step": failure.step, "detected": failure.what,
            "note": "the producer was not found: the replay of the model's forward and backward "
                    "was finite, and the loss's graph held no op that made the value",
        }  # fmt: skip
    return result


def _with_loop_producer(result: dict[str, Any], failure: TorchFailure) -> None:
    """A later update whose batch the training loop made non-finite: its preprocessing lines,
    re-evaluated (:mod:`nanscope.probes.loop`), name the producer the model replay cannot see."""
    located = result.get("located") or {}
    if located.get("phase") == "preprocess" and located.get("observed"):
        return  # the first-update watch saw it
    found = replay_preprocess(failure)
    if not found:
        return
    rows = found.pop("input_rows", None) or []
    if located.get("op"):
        found["replay"] = {k: located.get(k) for k in ("phase", "op", "module", "note", "how")
                           if located.get(k) is not None}  # fmt: skip
    found["detected"] = failure.what
    result["located"] = {k: v for k, v in found.items() if v is not None}
    if rows:
        for row in rows:
            row.setdefault("before", f"{found.get('op')} at line {found['source']['line']}")
        result["rows"] = list(result.get("rows") or []) + rows


def _with_prepared_producer(result: dict[str, Any]) -> None:
    """An op whose input was already non-finite, in a script whose data preparation made a
    NaN/inf with numpy (a log of zero counts, a division by a zero std, before the loop): that
    op of the preparation is the producer, the op the replay saw meet it is kept beside it."""
    located = result.get("located") or {}
    if located.get("phase") == "preprocess":
        return
    if (located.get("why") or {}).get("kind") != "nonfinite_input":
        return
    found = prepared(int(located.get("step") or 1))
    where = (located.get("source") or located.get("backward_source") or {}).get("file")
    if found is None or found["source"].get("file") != where:
        return  # (numpy's errors of another file, an earlier notebook cell: not this data's)
    found["replay"] = {k: located.get(k) for k in ("phase", "op", "module", "how")
                       if located.get(k) is not None}  # fmt: skip
    found["detected"] = located.get("detected")
    result["located"] = {k: v for k, v in found.items() if v is not None}


def _weights_nonfinite(model: Any) -> bool:
    import torch

    try:
        return any(not bool(torch.isfinite(p.detach()).all()) for p in model.parameters()
                   if p.is_floating_point() and not p.is_meta)  # fmt: skip
    except Exception:
        return False


def inspect_graph(loss: Any, *, output: Any = None, site: Any = None) -> dict[str, Any]:
    """The hazardous op of a non-finite loss's autograd graph, read while the graph is alive.

    Called by the adapter right before ``backward()`` frees the saved tensors, so the op (a
    division by exactly zero, a log of zero ...) is named from its inputs, not guessed. Returns
    the ``located`` dict, or ``{}``.
    """
    try:
        produced = producer.graph_producer(loss, site)
        if produced and produced.get("observed"):
            produced["from"] = "live graph"
            return produced
    except Exception:
        pass
    try:
        failure = TorchFailure(model=None, loss=loss, output=output, backward_site=site)
        found = _Locator(failure)._from_loss_graph(loss)
    except Exception:
        return {}
    if not found or found.get("guessed"):
        return {}
    found["from"] = "live graph"
    return found


# ---------------------------------------------------------------------------------- helpers


# ---------------------------------------------------------------------------------- the replay


class _Locator:
    """The replay of one failing update: the forward (watched by a :class:`_ForwardWatch`), then
    the loss and the backward, or the loss's own graph; and the batch's bad rows and columns."""

    def __init__(self, failure: TorchFailure) -> None:
        import torch

        self.torch = torch
        self.f = failure
        self.watch = _ForwardWatch(failure)
        #: how the backward replay from the model's output was seeded: "kept" or "ones"
        self.gradient_at_output: str | None = None

    # ---------------------------------------------------------------- entry

    def run(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        rows = _rows(self.f)
        if rows:
            result["rows"] = rows
        columns = _nonfinite_columns(self.f)
        if columns:
            result["nonfinite_columns"] = columns
        located: dict[str, Any] | None = None
        model = self.f.model
        if model is not None and hasattr(model, "named_modules") and has_forward(model):
            self.watch.names.update(
                (id(m), n or type(model).__name__) for n, m in model.named_modules()
            )
            try:
                located = self._replay(model)
            finally:
                self._restore_buffers(model)
            if self.watch.activations:
                result["activations"] = _activation_summary(self.watch.activations)
            scale = _weight_scale(model)
            if scale:
                result["weight_scale"] = scale
        elif self.f.loss is not None:
            located = self._from_loss_graph(self.f.loss)
            if located is not None and model is not None:
                located.setdefault(
                    "note", f"{type(model).__name__} has no forward of its own (its training "
                    "step calls the layers), so the update was not replayed: the op is read off "
                    "the loss's graph",
                )  # fmt: skip
        live = self.f.extra.get("graph_located")
        if live and (not located or located.get("guessed") or not located.get("op")):
            located = dict(live)
        if located:
            located.setdefault("step", self.f.step)
            result["located"] = {k: v for k, v in located.items() if v is not None}
        return result

    # ---------------------------------------------------------------- forward replay

    def _replay(self, model: Any) -> dict[str, Any] | None:
        torch = self.torch
        f = self.f
        params = [p for p in model.parameters() if p.requires_grad]
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        hooks = []
        for module in model.modules():
            hooks.append(module.register_forward_pre_hook(self.watch.pre_hook))
            hooks.append(module.register_forward_hook(self.watch.post_hook))
        loss_module = f.loss_module
        if loss_module is not None and hasattr(loss_module, "register_forward_pre_hook"):
            self.watch.names.setdefault(id(loss_module), type(loss_module).__name__)
            hooks.append(loss_module.register_forward_pre_hook(self.watch.pre_hook))
            hooks.append(loss_module.register_forward_hook(self.watch.post_hook))
        out = loss = None
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(warnings.catch_warnings())
                warnings.simplefilter("ignore")
                stack.enter_context(self._rng(device))
                stack.enter_context(torch.enable_grad())
                stack.enter_context(torch.autograd.detect_anomaly(check_nan=False))
                if f.autocast is not None:
                    stack.enter_context(torch.autocast(device.type, dtype=f.autocast))
                stack.enter_context(_eager_compiled(torch))
                stack.enter_context(op_watch(self.watch.note_op))
                out = model(*f.args, **f.kwargs)
                self.watch.module_stack = []
                loss = self._replay_loss(out)
        finally:
            for h in hooks:
                h.remove()
        origin = self.watch.origin()
        if origin is not None:
            return self.watch.located(origin)
        # the forward is clean: the loss part of the original graph, then the backward
        graph = None
        if loss is None and f.loss is not None:
            graph = self._from_loss_graph(f.loss, forward_only=True)
            if graph and (not graph.get("guessed") or self._output_grad(out) is None):
                return graph
        found = self._backward(model, out, loss, params)
        if graph and (not found or found.get("guessed") or not found.get("op")):
            return graph  # the loss graph's one hazardous op, guessed: nothing better was seen
        return found

    def _output_grad(self, out: Any) -> Any:
        """The gradient the failing update's backward sent into the model's output (kept by the
        adapter's hook on it, :meth:`~nanscope.torch.window.StepWindow.keep_output_grad`), when
        it fits the replayed output; else None."""
        grad = self.f.extra.get("output_grad")
        outs = [t for t in float_tensors(out) if t.grad_fn is not None]
        if grad is None or not outs or getattr(grad, "shape", None) != outs[0].shape:
            return None
        loss = self.f.loss
        if isinstance(loss, self.torch.Tensor) and not bool(
            self.torch.isfinite(loss.detach()).all()
        ):
            return None  # the loss was already non-finite: its producer came before the backward
        return grad

    def _restore_buffers(self, model: Any) -> None:
        """Put back the buffers (batch-norm statistics) the replay's forward moved."""
        with self.torch.no_grad():
            named = dict(model.named_buffers())
            for n, b in getattr(self, "buffers", {}).items():
                if n in named:
                    named[n].copy_(b)

    def _rng(self, device: Any) -> Any:
        torch = self.torch
        devices = [device] if device.type == "cuda" else []
        ctx = torch.random.fork_rng(devices=devices)
        state = self.f.extra.get("rng_state")
        cuda_state = self.f.extra.get("cuda_rng_state")

        @contextlib.contextmanager
        def restore() -> Iterator[None]:
            with ctx:
                if state is not None:
                    torch.set_rng_state(state)
                if cuda_state is not None and devices:
                    torch.cuda.set_rng_state(cuda_state, device)
                yield

        return restore()

    def _replay_loss(self, out: Any) -> Any:
        """The loss on the replayed output: the loss module's, when the adapter saw one."""
        f = self.f
        module = f.loss_module
        if module is None or not f.loss_args:
            return None
        args = list(f.loss_args)
        first = args[0]
        if first is f.output or (
            hasattr(first, "shape") and hasattr(out, "shape") and first.shape == out.shape
        ):
            args[0] = out
        return module(*args)

    # ---------------------------------------------------------------- backward replay

    def _backward(self, model: Any, out: Any, loss: Any, params: list[Any]) -> dict | None:
        torch = self.torch
        f = self.f
        if not params:
            return None
        if loss is not None and getattr(loss, "grad_fn", None) is not None:
            root, grad_out = loss, None
            if root.numel() != 1:
                grad_out = torch.ones_like(root)
        else:
            outs = [t for t in float_tensors(out) if t.grad_fn is not None]
            if not outs:
                return self._from_loss_graph(f.loss) if f.loss is not None else None
            root = outs[0]
            grad_out = self._output_grad(out)
            if grad_out is None:
                grad_out = torch.ones_like(root)
                self.gradient_at_output = "ones"
            elif not bool(torch.isfinite(grad_out).all()):
                # the loss code (after the model) made the non-finite gradient
                graph = self._from_loss_graph(f.loss) if f.loss is not None else None
                return graph or {"phase": "backward", "op": None, "module": None,
                                 "note": "the gradient reaching the model's output is already "
                                         "non-finite: the loss code made it"}  # fmt: skip
            else:
                grad_out = grad_out.to(dtype=root.dtype, device=root.device)
                self.gradient_at_output = "kept"
        found = self._hooked_backward(root, grad_out, params)
        if found is not None and self.gradient_at_output:
            found["gradient_at_output"] = (
                "the gradient the failing update's backward sent into the model's output"
                if self.gradient_at_output == "kept" else
                "taken as ones (the gradient the loss sent into the model's output was not kept)"
            )  # fmt: skip
        if found is None and loss is None and f.loss is not None:
            return self._from_loss_graph(f.loss)
        return found

    def _hooked_backward(self, root: Any, grad_out: Any, params: list[Any]) -> dict | None:
        torch = self.torch
        nodes = graph_nodes(root.grad_fn)
        hits: list[Any] = []
        grads: list[tuple[list[Any], list[Any]]] = []
        rows: list[int] = []
        handles = []

        def make(node: Any) -> Any:
            def hook(grad_inputs: Any, grad_outputs: Any) -> None:
                if hits:
                    return
                gi = [g for g in grad_inputs if g is not None and g.is_floating_point()]
                go = [g for g in grad_outputs if g is not None and g.is_floating_point()]
                if gi and not all_finite(gi) and all_finite(go):
                    hits.append(node)
                    grads.append((gi, go))
                    bad = next(g for g in gi if not all_finite([g]))
                    rows.extend(_nonfinite_batch_rows(self.f, bad))

            return hook

        for node in nodes:
            if type(node).__name__ == "AccumulateGrad":
                continue
            with contextlib.suppress(Exception):
                handles.append(node.register_hook(make(node)))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.autograd.grad(root, params, grad_outputs=grad_out, allow_unused=True,
                                    retain_graph=True)  # fmt: skip
        except RuntimeError as exc:
            # part of the replayed graph reuses a tensor the failing backward already freed (a
            # model that keeps a graph across calls): this backward cannot be replayed
            if "second time" not in str(exc):
                raise
            return None
        finally:
            for h in handles:
                h.remove()
        if not hits:
            return None
        located = self._node_located(hits[0], "backward")
        with contextlib.suppress(Exception):
            _with_gradients(located, hits[0], *grads[0])
        if rows:
            located["producer_rows"] = rows
        return located

    def _node_located(self, node: Any, phase: str) -> dict[str, Any]:
        name = type(node).__name__
        info = self.watch.node_info.get(id(node), {})
        try:
            saved = saved_tensors(node)
        except Exception:
            saved = {}
        custom = not saved and custom_saved(node)
        if custom:
            saved = custom
        summaries = [summary(t) for t in saved.values()]
        source = None
        with contextlib.suppress(Exception):
            source = traceback_source(node.metadata.get("traceback_"))
        if source is None:
            source = _call_site(self.f, self.watch.names, info.get("module"))
        if source is None:
            source = scan_function(self.f.backward_site, name)
        located: dict[str, Any] = {
            "phase": phase,
            "op": name,
            "module": info.get("module"),
            "forward_op": info.get("op"),
            "source": source,
        }
        if summaries:
            located["inputs"] = _backward_inputs(name, saved, summaries)
            if custom:  # a custom Function's own backward: its formula is the user's, unknown
                located["custom_function"] = True
                absmax = max(s["absmax"] for s in summaries)
                located["inputs"] = f"finite (max |x| = {absmax:.3g})"
                if any(s.get("nonfinite") for s in summaries):
                    located["inputs"] = "non-finite"
            located["dtype"] = summaries[0]["dtype"]
            located["input_absmax"] = max(s["absmax"] for s in summaries)
            located["input_zero"] = located["inputs"] == "exactly zero"
        return located

    # ---------------------------------------------------------------- the original loss graph

    def _from_loss_graph(self, loss: Any, forward_only: bool = False) -> dict[str, Any] | None:
        """Inspect ``failure.loss``'s autograd graph: saved tensors if alive, names if freed."""
        torch = self.torch
        root = getattr(loss, "grad_fn", None)
        if root is None:
            return None
        stop: set[int] = set()
        out = self.f.output
        for t in float_tensors(out):
            if t.grad_fn is not None:
                stop.add(id(t.grad_fn))
        nodes = graph_nodes(root, 5000, stop)
        alive = True
        hazards: list[tuple[Any, str | None]] = []
        for node in reversed(nodes):  # deepest (earliest in the forward) first
            name = type(node).__name__
            if not any(h in name for h in _HAZARD_NODES):
                continue
            try:
                saved = saved_tensors(node)
            except RuntimeError:
                alive = False
                saved = {}
            if not saved:
                hazards.append((node, None))
                continue
            summaries = [summary(t) for t in saved.values()]
            hazards.append((node, _backward_inputs(name, saved, summaries)))
        bad = [(n, why) for n, why in hazards if why and why != "finite"]
        if bad:
            node, _why = bad[0]
            loss_finite = bool(torch.isfinite(loss.detach()).all())
            located = self._node_located(node, "backward" if loss_finite else "forward")
            if not loss_finite:
                located["op"] = forward_name(type(node).__name__)
                located["backward_op"] = type(node).__name__
            located["module"] = located.get("module") or "loss"
            return located
        if forward_only and alive:
            return None
        if hazards and not alive:
            loss_finite = bool(torch.isfinite(loss.detach()).all())
            node = _likeliest(hazards, "backward" if loss_finite else "forward")
            if node is None:
                return None
            name = type(node).__name__
            return {
                "phase": "backward" if loss_finite else "forward",
                "op": name if loss_finite else forward_name(name),
                "module": "loss",
                "source": scan_function(self.f.backward_site, name),
                "note": "the loss's graph was freed; the op is the one hazardous op found in it",
                "guessed": True,
            }
        return None


class _ForwardWatch:
    """What the replayed forward shows, module by module and op by op: the first op that made a
    non-finite value (:meth:`origin`), the ops that carried it on, the module and op of every
    autograd node it made, and the scale of each module's activations."""

    def __init__(self, failure: TorchFailure) -> None:
        import torch

        self.torch = torch
        self.f = failure
        #: id of a module -> its name in the model
        self.names: dict[int, str] = {}
        self.module_stack: list[str] = []
        self.first: dict[str, Any] | None = None  # origin: non-finite out, finite in
        self.first_nan: dict[str, Any] | None = None  # inf -> nan
        self.first_any: dict[str, Any] | None = None
        #: id of an autograd node -> the op and module that made it
        self.node_info: dict[int, dict[str, Any]] = {}
        self.activations: list[dict[str, Any]] = []
        self.first_bad_module: str | None = None
        self.chain: list[dict[str, Any]] = []
        self.quiet = False
        #: per running module: its inputs' autograd nodes (made before it ran)
        self.input_nodes: list[set[int]] = []

    def pre_hook(self, module: Any, args: Any) -> None:
        self.module_stack.append(self.names.get(id(module), type(module).__name__))
        nodes: set[int] = set()
        with contextlib.suppress(Exception):
            nodes = {id(t.grad_fn) for t in float_tensors(args) if t.grad_fn is not None}
        self.input_nodes.append(nodes)

    def post_hook(self, module: Any, args: Any, output: Any) -> None:
        torch = self.torch
        name = self.names.get(id(module), type(module).__name__)
        if self.module_stack:
            self.module_stack.pop()
        before = self.input_nodes.pop() if self.input_nodes else set()
        with contextlib.suppress(Exception):
            self._claim_nodes(output, name, before)
        try:
            outs = float_tensors(output)
            if not outs:
                return
            t = outs[0].detach()
            if self.first_bad_module is None and not all_finite(outs):
                self.first_bad_module = name
            self.quiet = True  # this hook's own ops are not the model's
            has_params = any(True for _ in module.parameters(recurse=False))
            if has_params and module is not self.f.loss_module:
                with torch.no_grad():
                    tf = t.float()
                    finite = torch.isfinite(tf)
                    rms = float(tf[finite].pow(2).mean().sqrt()) if bool(finite.any()) else math.nan
                self.activations.append(
                    {"module": name, "rms": rms, "finite": bool(finite.all()),
                     "dtype": str(t.dtype).replace("torch.", "")}
                )
        except Exception:
            pass
        finally:
            self.quiet = False

    def _claim_nodes(self, output: Any, name: str, before: set[int]) -> None:
        """Name the module of the autograd nodes its forward made that no op call showed the op
        watch (a custom ``torch.autograd.Function``'s ``apply``): those reachable from its
        output, up to the nodes its inputs came with. An inner module's hook runs first and
        claims its own; the nodes of ops the watch saw keep theirs. Each node is walked once per
        module around it."""
        queue = [t.grad_fn for t in float_tensors(output) if t.grad_fn is not None]
        seen: set[int] = set()
        while queue and len(seen) < 20000:
            node = queue.pop()
            key = id(node)
            if key in seen or key in before or type(node).__name__ == "AccumulateGrad":
                continue
            seen.add(key)
            if key not in self.node_info:
                self.node_info[key] = {"op": None, "module": name}
            queue.extend(n for n, _ in node.next_functions if n is not None)

    def note_op(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """Called by the op watch for each op of the replay (two frames below the op's caller)."""
        if self.quiet:
            return
        outs = float_tensors(out)
        if not outs or self._from_nanscope():
            return
        name = op_name(func)
        module = self.module_stack[-1] if self.module_stack else None
        for t in outs:
            fn = getattr(t, "grad_fn", None)
            if fn is not None and id(fn) not in self.node_info:
                self.node_info[id(fn)] = {"op": name, "module": module}
        if self.first is not None:
            if len(self.chain) < 12 and not all_finite(outs):
                self.chain.append({"op": name, "module": module})  # a propagator after it
            return
        if all_finite(outs):
            return
        ins = float_tensors(args) + float_tensors(kwargs)
        in_finite = all_finite(ins)
        entry: dict[str, Any] = {
            "op": name, "module": module, "ins": [summary(t) for t in ins[:4]],
            "out": summary(outs[0]),
            # without this call and the mode's __torch_function__: the op's caller is kept (a
            # builtin op like torch.log has no Python frame of its own between the two)
            "stack": traceback.extract_stack()[:-2],
        }  # fmt: skip
        if in_finite and not nonfinite_scalar(args, kwargs or {}):
            self.first = entry
            entry["call"] = (func, args, kwargs)
            entry["rows"] = _nonfinite_batch_rows(self.f, outs[0])
        elif self.first_nan is None and entry["out"].get("nan") and not any(
            s.get("nan") for s in entry["ins"]
        ):
            self.first_nan = entry
        if self.first_any is None:
            self.first_any = entry

    def _from_nanscope(self) -> bool:
        """True when the op was called by nanscope's own hooks (the adapter's measures)."""
        frame: Any = sys._getframe(3)
        for _ in range(16):
            if frame is None:
                return False
            path = frame.f_code.co_filename
            if path == __file__:
                return False  # reached the replay itself: the model (or loss) called the op
            kind = owner(path)
            if kind != "library":
                return kind == "nanscope"
            # torch, the standard library, or nanscope's thin patches that call the user's op
            frame = frame.f_back
        return False

    def origin(self) -> dict[str, Any] | None:
        """The op the failure is traced to: the first that made a non-finite value from finite
        inputs, else the first that turned inf into nan, else the first non-finite one."""
        return self.first or self.first_nan or self.first_any

    def located(self, origin: dict[str, Any]) -> dict[str, Any]:
        """The ``located`` dict of the forward op ``origin``."""
        out_dtype = origin["out"]["dtype"]
        located: dict[str, Any] = {
            "phase": "forward",
            "op": origin["op"],
            "module": origin["module"] or self.first_bad_module,
            "source": stack_source(origin["stack"]),
            "inputs": _describe(origin["op"], origin["ins"], out_dtype),
            "dtype": out_dtype,
            "input_absmax": max((s["absmax"] for s in origin["ins"]), default=None),
            "output": "nan" if origin["out"].get("nan") else "inf",
        }
        located["input_zero"] = located["inputs"] == "exactly zero"
        if origin is self.first and origin.get("rows"):
            located["producer_rows"] = origin["rows"]
        if origin is self.first and self.chain:
            located["chain"] = [{k: v for k, v in c.items() if v is not None} for c in self.chain]
        with contextlib.suppress(Exception):
            located["why"] = why_nonfinite(origin["op"], origin["ins"], out_dtype)
            call = origin.get("call")
            if call is not None and out_dtype in ("float16", "bfloat16"):
                func, args, kwargs = call
                located.update(widened(func, args, kwargs, out_dtype))
        if origin is not self.first:
            located["note"] = "the op's inputs were already non-finite"
        if self.f.autocast is not None:
            located["autocast"] = str(self.f.autocast).replace("torch.", "")
        if located["source"] is None:
            located["source"] = _call_site(self.f, self.names, located.get("module"))
        if located["source"] is None:
            located["source"] = scan_function(self.f.backward_site, origin["op"])
        return located


# ---------------------------------------------------------------- the batch's rows and columns


def _rows(f: TorchFailure) -> list[dict[str, Any]]:
    """The batch's non-finite rows, else its extreme ones (inputs and targets)."""
    import numpy as np

    from nanscope.capture.arrays import nonfinite_rows, robust_rows

    index = f.batch_index
    if index is not None:
        try:
            index = np.asarray(
                index.detach().cpu() if hasattr(index, "detach") else index
            ).reshape(-1)
        except Exception:
            index = None
    found: list[dict[str, Any]] = []
    for source, tensor in _batch(f, float_targets=False):
        try:
            array = tensor.detach().float().cpu().numpy()
            count, bad = nonfinite_rows(array, source, index)
            if not count and array.ndim >= 1 and array.shape[0] >= 3:
                _, bad = robust_rows(array, source, index)
        except Exception:
            continue
        for row in bad:
            row["step"] = f.step
        found.extend(bad)
    return found


def _batch(f: TorchFailure, float_targets: bool) -> list[tuple[str, Any]]:
    """``("inputs", x)`` and ``("targets", y)``: the batch's first floating input tensor and
    its first target tensor (a floating one when ``float_targets``), those that exist."""
    sources: list[tuple[str, Any]] = []
    inputs = float_tensors(f.args) or float_tensors(f.kwargs)
    if inputs:
        sources.append(("inputs", inputs[0]))
    if f.targets is not None:
        targets = [t for t in tensors(f.targets) if t.is_floating_point() or not (
            float_targets)]  # fmt: skip
        if targets:
            sources.append(("targets", targets[0]))
    return sources


def _nonfinite_columns(f: TorchFailure) -> list[dict[str, Any]]:
    """Columns of the batch that are non-finite in every one of its rows (two rows or more):
    such a column is computed (a division or a log over it), not a few bad rows of the data."""
    import torch

    out: list[dict[str, Any]] = []
    for source, tensor in _batch(f, float_targets=True):
        try:
            if tensor.dim() < 1 or tensor.shape[0] < 2:
                continue
            flat = tensor.detach().reshape(tensor.shape[0], -1)
            bad = ~torch.isfinite(flat).any(dim=0)
            cols = [int(c) for c in torch.nonzero(bad).reshape(-1)[:16].tolist()]
        except Exception:
            continue
        if cols:
            out.append({"source": source, "columns": cols, "rows": int(flat.shape[0]),
                        "step": f.step})  # fmt: skip
    return out


def _nonfinite_batch_rows(f: TorchFailure, t: Any) -> list[int]:
    """The batch rows (first dimension) where ``t`` is non-finite, when ``t`` has one row per
    batch row and only a few of them are: the rows whose values made the producer's output."""
    import torch

    batch = next((int(x.shape[0]) for x in tensors((f.args, f.kwargs))
                  if x.dim() >= 1), None)  # fmt: skip
    if batch is None or batch < 2 or t.dim() < 1 or int(t.shape[0]) != batch:
        return []
    with torch.no_grad():
        bad = ~torch.isfinite(t.detach().reshape(batch, -1)).all(dim=1)
        rows = [int(r) for r in torch.nonzero(bad).reshape(-1).tolist()]
    # a few rows, not most of the batch (then it is no row's story: leaving them out would
    # leave out the batch)
    return rows if len(rows) <= min(64, batch // 2) else []


def _call_site(f: TorchFailure, names: dict[int, str], module: Any) -> dict[str, Any] | None:
    """The user's line that called the loss module or the model the op ran in (the op itself
    is inside torch's code): recorded when the call was made, not guessed."""
    if not module:
        return None
    loss_module = f.loss_module
    key = "model_site"
    if loss_module is not None and module == names.get(id(loss_module)):
        key = "loss_site"
    site = f.extra.get(key)
    if not isinstance(site, dict) or not site.get("file"):
        return None
    out = dict(site)
    code = linecache.getline(str(site["file"]), int(site.get("line") or 0)).strip()
    if code:
        out["code"] = code
    out["call"] = "loss module" if key == "loss_site" else "model"
    return out


# ---------------------------------------------------------------- first-batch evidence


def _activation_summary(acts: list[dict[str, Any]]) -> dict[str, Any]:
    """How the activations' scale grows through the layers, and where it went non-finite."""
    rms = [a["rms"] for a in acts]
    finite = [r for r in rms if math.isfinite(r) and r > 0]
    out: dict[str, Any] = {"layers": acts[:64]}
    if len(finite) >= 2:
        ratios = [b / a for a, b in itertools.pairwise(finite)]
        ratios.sort()
        out["growth"] = finite[-1] / finite[0]
        out["median_ratio"] = ratios[len(ratios) // 2]
        out["rising"] = sum(1 for r in ratios if r > 1.5)
    out["nonfinite_at"] = next((a["module"] for a in acts if not a["finite"]), None)
    return out


def _weight_scale(model: Any) -> dict[str, Any]:
    """std(W) * sqrt(fan_in) per weight matrix: about 0.5..1.5 for standard initialisers."""
    import torch

    layers: list[dict[str, Any]] = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2 or not p.is_floating_point() or p.is_meta or not name.endswith(
                "weight"
            ):
                continue
            fan_in = p[0].numel()
            if fan_in < 2:
                continue
            w = p.detach().float()
            if not bool(torch.isfinite(w).all()):
                continue
            ratio = float(w.std() * math.sqrt(fan_in))
            layers.append({"param": name, "fan_in": int(fan_in), "ratio": ratio})
            if len(layers) >= 64:
                break
    if not layers:
        return {}
    ratios = sorted(x["ratio"] for x in layers)
    return {"layers": layers, "median_ratio": ratios[len(ratios) // 2],
            "max_ratio": ratios[-1], "min_ratio": ratios[0]}  # fmt: skip


def _with_gradients(located: dict[str, Any], node: Any, gi: list[Any], go: list[Any]) -> None:
    """What the gradients at a replayed backward producer measured: the dtype its non-finite
    gradient was made in and, in float16 / bfloat16, the finite gradient it received past that
    dtype's limit (``why`` past_range, ``precision``), as the first-update watch reads them."""
    m = backward_located(node, gi, go, None)
    located["dtype"] = m.get("dtype") or located.get("dtype")
    located.setdefault("grad_in", m.get("grad_in"))
    why = m.get("why") or {}
    if why.get("kind") == "past_range":
        located["why"] = why
        located["inputs"] = m.get("inputs")
        if m.get("precision"):
            located["precision"] = m["precision"]


def _describe(op: str, summaries: list[dict[str, Any]], out_dtype: str | None) -> str:
    """'exactly zero' / 'huge (max |x| = ...)' / 'past the half range' / 'non-finite'."""
    family = op_family(op)
    if any(s.get("nonfinite") for s in summaries):
        return "non-finite (" + ("nan" if any(s.get("nan") for s in summaries) else "inf") + ")"
    half = out_dtype == "float16" or any(s["dtype"] == "float16" for s in summaries)
    absmax = max((s["absmax"] for s in summaries), default=0.0)
    zero_ops = ("log", "xlogy", "sqrt", "rsqrt", "norm", "reciprocal", "cosine",
                "binary_cross_entropy")  # fmt: skip
    if family in zero_ops and any(s["zeros"] for s in summaries):
        return "exactly zero"
    if family == "div":
        divisor = summaries[1] if len(summaries) > 1 else summaries[0] if summaries else None
        if divisor is not None and divisor["zeros"]:
            return "exactly zero"
    if family == "pow" and any(s["zeros"] for s in summaries):
        return "exactly zero"
    if half and (absmax > HALF_MAX / 64 or family == "exp"):
        return "past the half range"
    if family == "exp" and absmax > 80:
        return f"huge (max |x| = {absmax:.3g})"
    if absmax > 1e15:
        return f"huge (max |x| = {absmax:.3g})"
    if half:
        return "past the half range"
    if any(s["zeros"] for s in summaries):
        return "exactly zero"
    return f"finite (max |x| = {absmax:.3g})"


#: with the saved tensors gone, which op most often makes the non-finite value, per phase
_LIKELY = {
    "forward": ("Log", "Xlogy", "Div", "Reciprocal", "Rsqrt", "Exp", "Pow", "Sqrt"),
    "backward": ("Sqrt", "Norm", "Rsqrt", "Cdist", "Pow", "Div", "Atan2", "Acos", "Asin", "Xlogy",
                 "Entr", "Log"),
}


def _likeliest(hazards: list[tuple[Any, str | None]], phase: str) -> Any:
    nodes = []
    for node, _ in hazards:
        exponent = getattr(node, "_saved_exponent", None)
        if isinstance(exponent, (int, float)) and exponent >= 1 and "Pow" in type(node).__name__:
            continue  # x ** 2 is harmless
        nodes.append(node)
    for fragment in _LIKELY[phase]:
        for node in nodes:
            if fragment in type(node).__name__:
                return node
    return nodes[0] if nodes else None


def _backward_inputs(name: str, saved: dict[str, Any], summaries: list[dict[str, Any]]) -> str:
    """Why a backward node's saved inputs make a non-finite gradient."""
    family = op_family(name)
    if any(s.get("nonfinite") for s in summaries):
        return "non-finite"
    if family == "div":
        other = saved.get("other")
        if other is not None and bool((other == 0).any()):
            return "exactly zero"
        return "finite"
    if family in ("sqrt", "rsqrt", "norm"):
        target = saved.get("result", saved.get("self"))
        if target is not None and bool((target == 0).any()):
            return "exactly zero"
        return "finite"
    if family in ("log", "reciprocal", "pow", "xlogy", "binary_cross_entropy"):
        target = saved.get("self")
        if target is None and saved:
            target = next(iter(saved.values()))
        if target is not None and bool((target == 0).any()):
            return "exactly zero"
        if family == "binary_cross_entropy" and target is not None and bool((target == 1).any()):
            return "exactly zero"  # 1 - p == 0
        return "finite"
    if family == "exp":
        absmax = max(s["absmax"] for s in summaries)
        if any(s["dtype"] == "float16" for s in summaries) and absmax > HALF_MAX / 64:
            return "past the half range"
        return f"huge (max |x| = {absmax:.3g})" if absmax > 80 else "finite"
    return "finite"


def _eager_compiled(torch: Any) -> Any:
    """Run what ``torch.compile`` compiled (the model, ``model.compile()``, compiled blocks)
    eagerly for the replay: a compiled graph hides the ops the replay watches one by one."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if set_stance is None:
        return contextlib.nullcontext()
    try:
        return set_stance("force_eager")
    except Exception:  # a torch whose stances differ: replay as it is
        return contextlib.nullcontext()
