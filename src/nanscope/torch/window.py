"""The per-step window: what happened between two optimizer steps (batch, output, losses, clip).

A :class:`StepWindow` is fed by the hooks (the model's forward, ``loss.backward()``, a loss module,
``clip_grad_norm_``) and read once per update by the :class:`~nanscope.torch.watcher.Watcher`
when it checks the step; :meth:`StepWindow.reset` empties it for the next one. It holds references
only: nothing is copied or read from an accelerator here.

Several backward calls before one step are micro-batches (gradient accumulation): the step's loss
is their mean (:meth:`StepWindow.loss`).
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from nanscope.capture.keys import INPUT_KEYS, TARGET_KEYS
from nanscope.probes._tensors import loss_before_scale
from nanscope.probes.failure import CallSite, TorchFailure
from nanscope.torch import sharded

__all__ = ["OUTPUT_GRAD_MAX", "StepWindow", "pick_input"]

#: the forwards of one update kept for the probes (the micro-batches of gradient accumulation)
MICRO_BATCHES = 64
#: the gradient at the model's output is kept for outputs of at most this many elements
OUTPUT_GRAD_MAX = 1 << 22
#: ``NANSCOPE_OUTPUT_GRAD=0`` keeps no gradient at the output (the replay then takes it as ones)
KEEP_OUTPUT_GRAD = os.environ.get("NANSCOPE_OUTPUT_GRAD", "1") != "0"


class StepWindow:
    """References to this step's batch, output and losses (see the module docstring).

    ``args``/``kwargs``/``output``: the model's last forward; ``losses``: the detached loss of each
    backward since the last step; ``last_loss`` (the tensor, graph attached), ``site`` (the user's
    ``backward()`` line), ``scaled_by`` (the GradScaler whose ``scale()`` made the last loss);
    ``loss_module``/``loss_args``: the last loss module call; ``clip_norm``: the pre-clip total
    norm ``clip_grad_norm_`` returned; ``graph_located``: what the live graph of a non-finite CPU
    loss showed; ``rng``: the CPU RNG state at the forward (for the replay); ``index``: the
    batch's dataset rows when known; ``given``: ``(inputs, targets)`` a trainer callback named.
    """

    def __init__(self) -> None:
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.output: Any = None
        self.rng: Any = None
        #: whether the model's forward draws from the CPU RNG (then its state is kept at every
        #: forward, for an exact replay); measured on the forwards :meth:`on_forward` probes
        self.rng_used = True
        #: this forward's state is to be compared at its end (:meth:`probe_rng`)
        self.rng_probing = False
        self.index: Any = None
        self.autocast: Any = None
        self.given: tuple[Any, Any] = (None, None)
        self.loss_module: Any = None
        self.loss_args: tuple[Any, ...] = ()
        self.loss_args_live = False
        #: the user's lines that called the loss module and the model (for the producer's line)
        self.loss_site: CallSite | None = None
        self.model_site: CallSite | None = None
        self.last_loss: torch.Tensor | None = None
        self.site: CallSite | None = None
        self.output_grad: torch.Tensor | None = None
        self._output_gen = 0
        self.reset()

    def reset(self) -> None:
        """Start the next step's window (the batch references stay until the next forward)."""
        self.losses: list[torch.Tensor] = []
        #: the host values of ``losses`` where they were read at the backward (CPU), else empty
        self.loss_floats: list[float] = []
        self.scaled_by: Any = None
        self.clip_norm: torch.Tensor | None = None
        #: how many backward calls came before the clip call (fresh: all of them)
        self.clip_backwards = -1
        #: ``(params, max_norm, norm_type)`` of this step's ``clip_grad_norm_`` call, when read
        self.clip_call: tuple[Any, Any, Any] | None = None
        self.graph_located: dict[str, Any] | None = None
        #: ``(args, kwargs)`` of each forward of this update: with gradient accumulation the
        #: micro-batch that broke may be any of them (references, until the check)
        self.forwards: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        #: kept from this update's backward until its check: nothing past the update
        self.output_grad = None
        # a replay reruns a loss module that took the output, or a model that returns its own
        # loss, by itself: the gradient at the output is kept only for a loss the script
        # computes around the model (decided from the step that ends here; the first keeps it)
        self.want_output_grad = not (getattr(self, "_loss_module_seen", False)
                                     or getattr(self, "_loss_in_output", False))  # fmt: skip
        self._loss_module_seen = False
        self._loss_in_output = False

    # ------------------------------------------------------------------ fed by the hooks

    def on_forward(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any = None,
        *,
        rng: bool,
        probe: bool = True,
        site: CallSite | None = None,
    ) -> None:
        """The model's forward ran; ``rng``: keep the CPU RNG state (for an exact replay);
        ``site``: the user's line that called the model.

        The state (a 5 kB copy) is kept on every forward while the forward is known to draw
        from the RNG (dropout); a ``probe`` forward keeps it and :meth:`probe_rng` compares it at
        the forward's end: a forward that drew nothing needs no state to be replayed exactly,
        and the forwards after it skip the copy until the next probe says otherwise."""
        self.args = args
        self.kwargs = kwargs
        self.output = output
        self.model_site = site
        if len(self.forwards) < MICRO_BATCHES:
            self.forwards.append((args, kwargs))
        if output is not None:
            self.keep_output_grad(output)
        else:  # (what keep_output_grad starts with; the forward hook gives the output later)
            self.output_grad = None
            self._output_gen += 1
        self.rng = None
        self.rng_probing = False
        self.index = _batch_index(args, kwargs)
        if rng and (self.rng_used or probe) and self._on_cpu():
            self.rng = torch.get_rng_state()
            self.rng_probing = probe
        self.autocast = autocast_dtype()

    def on_traced_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The model's forward while ``torch.compile`` traces it: references only, which the
        compiler replays after the graph (reading the RNG or the frames would break the graph,
        an error under ``fullgraph=True``)."""
        self.args, self.kwargs, self.rng = args, kwargs, None

    def on_output(self, output: Any) -> None:
        """The model's forward returned ``output`` (its gradient and the RNG probe follow, where
        wanted: :meth:`keep_output_grad`, :meth:`probe_rng`)."""
        self.output = output

    def probe_rng(self) -> None:
        """At the end of a probed forward: did it draw from the CPU RNG?"""
        if self.rng_probing:
            self.rng_probing = False
            if self.rng is not None:
                self.rng_used = not torch.equal(torch.get_rng_state(), self.rng)

    def keep_output_grad(self, output: Any) -> None:
        """The model's forward returned ``output``: hook the autograd node that made the tensor
        the replay backpropagates from (its first floating tensor that requires grad) so the
        backward hands over the gradient it sends into it, the gradient a loss written as an
        expression in the loop makes. Only where a replay needs it (``want_output_grad``, see
        :meth:`reset`). The hook keeps a reference, no copy, and runs only when backward does;
        the gradient of an output of more than :data:`OUTPUT_GRAD_MAX` elements is not kept (it
        would outlive the backward until the step's check: a language model's logits)."""
        self.output_grad = None
        self._output_gen += 1
        if output is None or not KEEP_OUTPUT_GRAD or not self.want_output_grad:
            return
        # (a plain tensor output, the common case, without the walk; the checks by cost)
        root = output if type(output) is torch.Tensor else _grad_root(output)
        if root is None:
            return
        node = root.grad_fn
        if node is None or root.numel() > OUTPUT_GRAD_MAX or not root.is_floating_point():
            return
        if _IS_COMPILING is not None and _IS_COMPILING():
            return
        # a pre-hook on the node that made the output: one C++ call to register, where a tensor
        # hook costs several Python calls per update; it sees the gradient of the node's outputs
        try:
            node.register_prehook(functools.partial(self._kept, self._output_gen, root.output_nr))
        except Exception:  # a node that takes no hooks: the replay takes the gradient as ones
            return

    def _kept(self, gen: int, index: int, grads: tuple[Any, ...]) -> None:
        if gen == self._output_gen and index < len(grads):  # the last forward's, not an earlier
            self.output_grad = grads[index]

    def on_batch(self, inputs: Any, targets: Any) -> None:
        """A trainer callback names the batch (used where the forward's arguments do not)."""
        self.given = (inputs, targets)

    def on_backward(
        self,
        tensor: torch.Tensor,
        site: CallSite | None,
        scaler: Any,
        inspect: Callable[[torch.Tensor, CallSite | None], dict[str, Any] | None],
        value: torch.Tensor | None = None,
    ) -> None:
        """``backward()`` was called on ``tensor``; ``inspect`` reads a broken CPU graph now
        (what it found, ``{}`` for nothing, None when it could not look); ``value``: the loss
        before a static scale when it was read already."""
        self.last_loss = tensor
        self.site = site
        output = self.output
        if output is not None and not self._loss_in_output:
            self._loss_in_output = output is tensor if type(output) is torch.Tensor \
                else _holds(output, tensor)  # fmt: skip
        if scaler is not None:
            self.scaled_by = scaler
            value = tensor.detach()
        elif value is None:  # a static scale written by hand: the loss before it (the scaled
            value = loss_before_scale(tensor)  # value may be inf while the gradients are finite)
        if value.dim():
            value = value.reshape(())
        self.losses.append(value)
        # the graph's saved tensors are freed by this backward: read them now if it broke (CPU:
        # the read is free; on an accelerator it would be a sync per update)
        if value.is_cpu:
            number = float(value)
            self.loss_floats.append(number)
            if self.graph_located is None and not math.isfinite(number):
                found = inspect(tensor, site)
                if found is not None:
                    self.graph_located = found

    def on_loss_module(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if args and not self._loss_module_seen:
            # the replay reruns it on its own output when it took the output (or its shape)
            root = self.output if type(self.output) is torch.Tensor else _grad_root(self.output)
            first = args[0]
            self._loss_module_seen = root is not None and (
                first is root or getattr(first, "shape", None) == root.shape
            )
        self.loss_module = module
        self.loss_args = args
        self.loss_args_live = True  # they may hold the graph: the check detaches them
        hooks = sys.modules.get("nanscope.torch._hooks")  # (imported: it calls this)
        self.loss_site = hooks.LOSS_SITE.get("site") if hooks is not None else None
        if len(args) < 2:
            target = kwargs.get("target")
            if target is not None:
                self.loss_args = (*args, target)

    def on_clip(self, total: Any, call: tuple[Any, Any, Any] | None = None) -> None:
        """``clip_grad_norm_`` returned ``total``; ``call``: its ``(params, max_norm,
        norm_type)`` when they were read."""
        if isinstance(total, torch.Tensor):
            self.clip_norm = sharded.replicated(total.detach())  # FSDP2: a replicated DTensor
            self.clip_backwards = len(self.losses)
        self.clip_call = call

    def restart_losses(self, loss: torch.Tensor | None = None) -> None:
        """The step's losses start again (a closure's evaluations): empty, or ``loss`` alone."""
        self.losses = [] if loss is None else [loss.detach().reshape(())]

    def drop_graph(self) -> None:
        """Forget the loss tensor and the output once the update is checked: they hold the
        autograd graph (an unrolled graph, LBFGS's last closure) until the next backward."""
        self.last_loss = None
        self.output = None
        if self.loss_args_live:
            # the loss module's arguments stay for a replay, without the graph the output holds
            self.loss_args_live = False
            self.loss_args = tuple(
                a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a
                for a in self.loss_args
            )

    def forget_update(self) -> None:
        """A finite update the lean check passed is never replayed: its loss module's arguments
        are not kept, nor the loss and the output (their graph)."""
        self.loss_args, self.loss_args_live = (), False
        self.last_loss = self.output = None

    @property
    def holds_graph(self) -> bool:
        """Something of this update may still hold its autograd graph."""
        return self.loss_args_live or self.output is not None or self.last_loss is not None

    @property
    def clip_fresh(self) -> bool:
        """The clip's total was taken after this step's last backward: it is the norm of the
        gradients the step applies (a clip called before ``backward()`` read stale ones)."""
        return self.clip_norm is not None and self.clip_backwards == len(self.losses)

    # ------------------------------------------------------------------ read at the check

    @property
    def micro(self) -> int:
        """How many backward calls (micro-batches) this step had."""
        return len(self.losses)

    def loss(self, closure_loss: Any = None, scale: torch.Tensor | None = None) -> Any:
        """This step's loss tensor, divided by ``scale`` when given: the sum of the losses each
        ``backward()`` of the step was called on, the loss whose gradient the step applies. With
        gradient accumulation written as ``(loss / n).backward()`` per micro-batch (GPT trainers,
        the HF and Lightning trainers) that is the batch's loss the script logs.

        Without any backward seen, a one-element ``closure_loss`` (what ``step(closure)``
        returned) is used.
        """
        losses = self.losses
        if not losses and isinstance(closure_loss, torch.Tensor) and closure_loss.numel() == 1:
            losses = [closure_loss.detach().reshape(())]
        if not losses:
            return None
        loss = losses[0] if len(losses) == 1 else torch.stack([v.float() for v in losses]).sum()
        if scale is not None:
            loss = loss.float() / scale.to(loss.device).reshape(())
        return loss

    def inputs(self) -> Any:
        found = pick_input(self.args, self.kwargs)
        return found if found is not None else self.given[0]

    def targets(self) -> Any:
        return _targets(self.loss_args, self.kwargs, self.given)

    def refs(self) -> tuple[Any, ...]:
        """What :func:`batch_of` needs to name this step's batch later: references to the
        forward's arguments and the target, not to the loss module's output (its graph)."""
        loss_args = self.loss_args  # (the target alone: the output holds the graph)
        target = loss_args[1] if len(loss_args) > 1 else None
        return (self.args, self.kwargs, target, self.given, self.index)

    @staticmethod
    def batch_of(refs: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        """``(inputs, targets, rows)`` of a step from its :meth:`refs`, as the check makes it."""
        window = StepWindow.__new__(StepWindow)
        window.args, window.kwargs, target, window.given, window.index = refs
        window.loss_args = (None, target)
        inputs = window.inputs()
        return inputs, window.targets(), window.rows_of(inputs)

    def rows_of(self, inputs: Any) -> Any:
        """The dataset rows of this batch, when they are known and fit its first dimension."""
        index = self.index
        if index is None:
            return None
        if not isinstance(index, (list, tuple)):
            return index  # BatchRows: it checks its candidates against the batch itself
        first = inputs if isinstance(inputs, torch.Tensor) else self.targets()
        if isinstance(first, torch.Tensor) and first.dim() >= 1 and first.shape[0] != len(index):
            return None
        return index

    def failure(
        self,
        model: Any,
        step: int,
        what: str,
        *,
        kept: tuple[Any, Any, Any] | None,
        current: bool,
        scaler: Any,
        scale_history: list[float],
        extra: dict[str, Any],
    ) -> TorchFailure:
        """The state of failing update ``step`` for the probes (the replay of :mod:`locate`).

        kept: ``(args, kwargs, targets)`` of that update when it is not this window's (a late
        read); current: it is this window's update (its live-graph finding applies).
        """
        args, kwargs, targets = kept or (self.args, self.kwargs, self.targets())
        extra = dict(extra)
        if self.rng is not None:
            extra["rng_state"] = self.rng
        if self.graph_located and current:
            extra["graph_located"] = self.graph_located
        if self.output_grad is not None and current:
            extra["output_grad"] = self.output_grad
        if current and len(self.forwards) > 1:
            extra["micro_batches"] = self.forwards[:-1]  # (the last is ``args``)
        for key in ("loss_site", "model_site"):
            site = getattr(self, key, None)
            if site is not None:
                extra[key] = {"file": site.file, "line": site.line, "function": site.function}
        return TorchFailure(
            model=model, args=args, kwargs=kwargs, output=self.output, loss=self.last_loss,
            loss_module=self.loss_module, loss_args=self.loss_args, targets=targets,
            backward_site=self.site, step=step, what=what, autocast=self.autocast,
            grad_scaler=scaler, scale_history=scale_history,
            batch_index=self.rows_of(pick_input(args, kwargs)), extra=extra,
        )  # fmt: skip

    def _on_cpu(self) -> bool:
        for value in self.args:
            if isinstance(value, torch.Tensor):
                return bool(value.is_cpu)
        return True


def _targets(loss_args: tuple[Any, ...], kwargs: dict[str, Any], given: tuple[Any, Any]) -> Any:
    if len(loss_args) >= 2 and isinstance(loss_args[1], torch.Tensor):
        return loss_args[1]
    for key in TARGET_KEYS:
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor):
            return value
    target = given[1]
    return target if isinstance(target, torch.Tensor) else None


_CUDA: list[bool] = []


def _cuda_available() -> bool:
    if not _CUDA:
        _CUDA.append(bool(torch.cuda.is_available()))
    return _CUDA[0]


#: one C call that says whether any autocast is on (None on a torch without it)
_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)


def autocast_dtype() -> Any:
    """The autocast dtype active now (CPU, then CUDA), or None."""
    if _ANY_AUTOCAST is not None and not _ANY_AUTOCAST():  # (one C call: it runs every forward)
        return None
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    if _cuda_available() and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None


def _batch_index(args: Any, kwargs: Any) -> Any:
    """The dataset rows of this forward's batch (checked against the data only when read)."""
    rows = sys.modules.get("nanscope.probes.rows")
    if rows is None:
        return None
    try:
        return rows.current_batch_rows(args, kwargs)
    except Exception:
        return None


#: True while ``torch.compile`` traces (a hook there is the compiler's business)
_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _holds(output: Any, tensor: torch.Tensor) -> bool:
    """``tensor`` is one of the model output's own tensors (a model that returns its loss)."""
    if output is tensor:
        return True
    if isinstance(output, (list, tuple)):
        return any(item is tensor for item in output)
    if isinstance(output, dict):
        return any(item is tensor for item in output.values())
    return False


def _grad_root(output: Any, depth: int = 0) -> torch.Tensor | None:
    """The tensor of ``output`` the replay backpropagates from: its first floating tensor (lists,
    tuples and dicts, as the replay walks them) that requires grad, else None."""
    if isinstance(output, torch.Tensor):
        if output.requires_grad and output.is_floating_point() and output.grad_fn is not None:
            return output
        return None
    if depth >= 3:
        return None
    if isinstance(output, (list, tuple)):
        items: Any = output
    elif isinstance(output, dict):
        items = output.values()
    else:
        return None
    for item in items:
        found = _grad_root(item, depth + 1)
        if found is not None:
            return found
    return None


def pick_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The batch's input tensor: the first floating positional one, else a known keyword."""
    first: Any = None
    for value in args:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                return value
            first = first if first is not None else value
    for key in INPUT_KEYS:
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor):
            return value
    return first
