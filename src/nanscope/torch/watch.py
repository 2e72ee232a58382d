"""``nanscope.watch(model, optimizer)``: feed the core Monitor from PyTorch hooks.

::

    watcher = nanscope.watch(model, optimizer)      # policy="raise" by default
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()                            # checked *before* the weights change

What is hooked, and when it costs anything:

* the model's forward pre-hook and forward hook keep references to the batch and the output;
* ``loss.backward()`` (a thin patch of ``Tensor.backward`` / ``torch.autograd.backward``) keeps the
  loss tensor; several backward calls before one step are micro-batches (gradient accumulation)
  and the record's loss is their mean;
* a loss module (``nn.MSELoss``...) keeps its target;
* the optimizer's step pre-hook measures the update (:mod:`nanscope.torch.measure`) and hands the
  record to :meth:`nanscope.Monitor.observe`. When a detector fires under the ``raise`` policy the
  hook raises :class:`nanscope.DivergenceError`, so ``optimizer.step`` never runs and the weights
  are those of the last good update; they are saved to ``run_dir/last_good.pt``. For
  ``optimizer.step(closure)`` (LBFGS, Lightning) the closure is wrapped and the check runs inside
  it, right after the closure's backward and before the optimizer uses the gradient.

A fault inside nanscope's hooks never stops training: one warning, that hook off, training goes on.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from nanscope.detectors import Alarm
from nanscope.errors import UsageError
from nanscope.monitor import Monitor
from nanscope.probes.failure import CallSite, TorchFailure
from nanscope.torch import _hooks
from nanscope.torch.measure import ParamMeasure, batch_stats, param_names

__all__ = ["FULL_EVERY", "SCALE_FLOOR", "SKIP_LIMIT", "Watcher", "watch"]

#: a loss scale below this is a collapse: fp16 overflow that scaling cannot fix
SCALE_FLOOR = 1e-4
#: this many consecutive skipped steps is a collapse too
SKIP_LIMIT = 25
#: default ``every``: the weight norm, per-layer gradient norms and batch max |x| every this many
#: updates (the loss, gradient finiteness and norm, and the sampled cosines on every update)
FULL_EVERY = 16
#: what the rollback policy multiplies the learning rate by
ROLLBACK_LR_FACTOR = 0.1
#: how many rollbacks the rollback policy makes before giving up
ROLLBACK_LIMIT = 3

_INPUT_KEYS = ("input", "inputs", "x", "input_ids", "pixel_values", "inputs_embeds", "features")
_TARGET_KEYS = ("labels", "label", "target", "targets", "y")


def watch(
    model: Any,
    optimizer: Any,
    *,
    policy: str | None = None,
    monitor: Monitor | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    every: int | None = None,
    sync_every: int | None = None,
) -> Watcher:
    """Watch ``model`` trained by ``optimizer``; returns the :class:`Watcher` (call ``.close()``).

    policy: ``"raise"`` (default), ``"warn"`` or ``"rollback"`` (skip the bad update: its
        gradients are dropped before the step, at most three times in a row).
    monitor: a :class:`nanscope.Monitor` to feed (default: a new one with ``policy``/``run_dir``).
    every: take the full measures (weight norm, per-layer gradient norms, the batch's max |x|)
        every ``every`` updates (default :data:`FULL_EVERY`), and at any non-finite update. The
        loss, the gradient's finiteness and norm, and the sampled update norm, cosines and sign
        flips are measured on every update.
    sync_every: read the device-side measures every this many updates (default 1 on CPU, 16 when
        the parameters are on an accelerator). Detection is then up to ``sync_every`` updates late;
        the failing update is still found exactly and the weights are restored from the last
        verified snapshot (see ``docs/torch.md``).
    """
    watcher = _make_watcher(model, optimizer, policy=policy, monitor=monitor, run_dir=run_dir,
                            every=every, sync_every=sync_every)  # fmt: skip
    _attach_distributed(watcher)
    return watcher


def _make_watcher(model: Any, optimizer: Any, **kwargs: Any) -> Watcher:
    """:func:`watch` without the distributed attachment (its arguments checked)."""
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"watch(model, optimizer): model must be a torch.nn.Module, got {type(model).__name__}"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(
            "watch(model, optimizer): optimizer must be a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    return Watcher(model, optimizer, **kwargs)


def _attach_distributed(watcher: Watcher) -> None:
    """Under ``torch.distributed`` (world size > 1): make the ranks agree on every stop."""
    dist = getattr(torch, "distributed", None)
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        if dist.get_world_size() <= 1:
            return
    except Exception:
        return
    from nanscope.torch import distributed

    try:
        distributed.attach_watcher(watcher)
    except Exception as exc:  # never stop training for nanscope's sake
        warnings.warn(f"nanscope: ranks will not agree on stops ({type(exc).__name__}: {exc})",
                      RuntimeWarning, stacklevel=3)  # fmt: skip


class Watcher:
    """Hooks one optimizer (and its model) into a :class:`nanscope.Monitor`.

    Attributes: ``monitor``, ``model``, ``optimizer``, ``step`` (updates seen), ``failure`` (the
    :class:`~nanscope.probes.failure.TorchFailure` of the stop, once one happened),
    ``last_good_path``, ``notes`` (what was skipped and why).
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        *,
        policy: str | None = None,
        monitor: Monitor | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        every: int | None = None,
        sync_every: int | None = None,
        hook_model: bool = True,
        hook_optimizer: bool = True,
    ) -> None:
        if every is None:
            every = FULL_EVERY
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise UsageError(f"every must be a positive integer, got {every!r}")
        if sync_every is not None and (
            isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1
        ):
            raise UsageError(f"sync_every must be a positive integer, got {sync_every!r}")
        if monitor is not None and not isinstance(monitor, Monitor):
            raise UsageError(f"monitor must be a nanscope.Monitor, got {type(monitor).__name__}")
        self.guard = _hooks.Guard()
        self.optimizer = optimizer
        self.model: Any = None
        self._owns_monitor = monitor is None
        if monitor is None:
            name = type(model).__name__ if model is not None else type(optimizer).__name__
            monitor = Monitor(policy=policy, run_dir=run_dir, name=name,
                              meta={"source": "torch"})  # fmt: skip
        elif policy is not None and policy != monitor.policy:
            raise UsageError(
                f"policy={policy!r} conflicts with the monitor's policy {monitor.policy!r}"
            )
        self.monitor = monitor
        self.every = every
        self.sync_every = sync_every
        self.step = 0
        self.failure: TorchFailure | None = None
        self.last_good_path: Path | None = None
        self.notes: list[str] = []
        self._handles: list[Any] = []
        self._measure: ParamMeasure | None = None
        self._groups_sig: list[tuple[int, int]] = []
        self._sampled_at = -1
        self._prev_loss: float | None = None
        # per-param gradient norms of recent updates, for the per-name norms at a stop
        self._gnorms: deque[tuple[int, list[float], Any]] = deque(maxlen=64)
        self._names: dict[int, str] = {}
        # the current window: what happened since the last optimizer step
        self._losses: list[torch.Tensor] = []
        self._last_loss: torch.Tensor | None = None
        self._scaled: Any = None
        self._site: CallSite | None = None
        self._args: tuple[Any, ...] = ()
        self._kwargs: dict[str, Any] = {}
        self._output: Any = None
        self._rng: Any = None
        self._index: Any = None
        self._loss_module: Any = None
        self._graph_located: dict[str, Any] | None = None
        self._loss_args: tuple[Any, ...] = ()
        self._clip_norm: Any = None
        self._autocast: Any = None
        # closures
        self._in_closure = 0
        self._closure_checked = False
        self._closure_losses: list[float] = []
        self._snapshot: list[torch.Tensor] | None = None
        # GradScaler
        self.scaler: Any = None
        self._scaler_stepping = False
        self._stepped = False
        self._skips = 0
        self.scale_history: deque[float] = deque(maxlen=64)
        # deferred (accelerator) reads
        self._pending: deque[tuple[int, Any, dict[str, Any], dict[str, Any]]] = deque()
        self._recent: deque[tuple[int, tuple[Any, ...], dict[str, Any], Any]] = deque(maxlen=64)
        self._verified: list[torch.Tensor] | None = None
        self._verified_step = 0
        self._observing = False
        self._failing: dict[str, Any] = {}
        self._rollbacks = 0
        self._closed = False
        if model is not None:
            self.bind_model(model, hook=hook_model)
        monitor.probes.append(self._probe)
        if monitor.rollback_handler is None:
            monitor.rollback_handler = self._rollback
        if hook_optimizer:
            self._handles.append(optimizer.register_step_pre_hook(self._step_pre))
            self._handles.append(optimizer.register_step_post_hook(self._step_post))
        _hooks.register(self)
        monitor.meta.setdefault("framework", f"torch {torch.__version__}")
        monitor.meta.setdefault("optimizer", type(optimizer).__name__)

    # ------------------------------------------------------------------ binding

    def bind_model(self, model: Any, *, hook: bool = True) -> None:
        """Attach the model (its names and, with ``hook``, its forward hooks)."""
        if model is self.model:
            return
        self.model = model
        self._names = param_names(model)
        self._measure = None
        if hook:
            self._handles.append(
                model.register_forward_pre_hook(self._forward_pre, with_kwargs=True)
            )
            self._handles.append(model.register_forward_hook(self._forward_post))
        if not self.monitor.meta.get("model"):
            self.monitor.meta["model"] = type(model).__name__

    def owns(self, optimizer: Any) -> bool:
        return optimizer is self.optimizer

    def close(self) -> Any:
        """Remove every hook; close the monitor if this watcher made it (returns its diagnosis)."""
        if self._closed:
            return self.monitor.diagnosis
        self._closed = True
        self._drain(force=True, allow_raise=False)
        for handle in self._handles:
            with contextlib.suppress(Exception):
                handle.remove()
        self._handles.clear()
        _hooks.unregister(self)
        if self._owns_monitor and len(self.monitor.trace):
            return self.monitor.close()
        return self.monitor.diagnosis

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ hooks (guarded)

    def _forward_pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.guard.run("forward pre", self.on_forward, args, kwargs)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        self._output = output

    def on_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._args = args
        self._kwargs = kwargs
        self._output = None
        self._rng = None
        self._index = _batch_index(args, kwargs)
        if self.failure is None and self._first_tensor_device() == "cpu":
            self._rng = torch.get_rng_state()
        if torch.is_autocast_enabled("cpu"):
            self._autocast = torch.get_autocast_dtype("cpu")
        elif _cuda_available() and torch.is_autocast_enabled("cuda"):
            self._autocast = torch.get_autocast_dtype("cuda")
        else:
            self._autocast = None

    def _first_tensor_device(self) -> str:
        for value in self._args:
            if isinstance(value, torch.Tensor):
                return value.device.type
        return "cpu"

    def on_backward(self, tensor: torch.Tensor, site: CallSite | None) -> None:
        if "backward" in self.guard.off:
            return
        if not self._in_window(tensor):
            return
        self._last_loss = tensor
        self._site = site
        scaler = _hooks.scaled_by(tensor)
        if scaler is not None:
            self.scaler = scaler
            self._scaled = scaler
        value = tensor.detach().reshape(())
        self._losses.append(value)
        # the graph's saved tensors are freed by this backward: read them now if it broke (CPU:
        # the read is free; on an accelerator it would be a sync per update)
        if (value.device.type == "cpu" and self._graph_located is None
                and not math.isfinite(float(value))):  # fmt: skip
            self.guard.run("live graph", self._inspect_live_graph, tensor, site)

    def _inspect_live_graph(self, tensor: torch.Tensor, site: CallSite | None) -> None:
        from nanscope.probes.locate import inspect_graph

        self._graph_located = inspect_graph(tensor, output=self._output, site=site) or {}

    def _in_window(self, tensor: torch.Tensor) -> bool:
        # a backward that cannot reach this optimizer's params is someone else's (GAN, 2 models)
        return bool(tensor.requires_grad)

    def on_loss_module(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._loss_module = module
        self._loss_args = args
        if len(args) < 2:
            target = kwargs.get("target")
            if target is not None:
                self._loss_args = (*args, target)

    def on_clip(self, total: Any) -> None:
        if isinstance(total, torch.Tensor):
            self._clip_norm = total.detach()

    def _step_pre(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if "step" in self.guard.off:
            return None
        self._stepped = False
        closure = kwargs.get("closure")
        if closure is None and len(args) > 1 and callable(args[1]):
            closure = args[1]
        if closure is not None:
            result = self.guard.run("closure", self._wrap_closure, closure)
            if result is None:
                return None
            if "closure" in kwargs:
                return args, {**kwargs, "closure": result}
            return (args[0], result, *args[2:]), kwargs
        self.guard.run("step", self.check)
        return None

    def _step_post(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._stepped = True
        self._snapshot = None
        if self._closure_losses:  # every closure evaluation of this update, the first one first
            records = self.monitor.trace.records
            if records and records[-1].get("step") == self.step:
                first = records[-1].get("loss")
                records[-1].setdefault("extra", {})["closure_losses"] = [
                    first, *self._closure_losses]
            self._closure_losses = []
            self._losses = []  # the later evaluations' losses are not the next update's

    def _wrap_closure(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        self._closure_checked = False
        self._closure_losses = []
        self._losses = []  # this update's loss is its first closure evaluation
        if isinstance(self.optimizer, torch.optim.LBFGS):
            # LBFGS changes the weights between closure calls: keep this update's start
            self._snapshot = [p.detach().clone() for p in self._params()]

        def checked_closure() -> Any:
            self._in_closure += 1
            try:
                out = closure()
            finally:
                self._in_closure -= 1
            if not self._closure_checked:
                self._closure_checked = True
                self.guard.run("step", self.check, out)
            elif isinstance(out, torch.Tensor) and out.numel() == 1:
                self._closure_losses.append(float(out.detach()))
                self.guard.run("step", self._check_inner, out)
            return out

        return checked_closure

    def _check_inner(self, loss: torch.Tensor) -> None:
        """A later closure call inside one LBFGS step: a NaN here restores the step's start."""
        if math.isfinite(float(loss.detach())):
            return
        if self._snapshot is not None:
            with torch.no_grad():
                for p, saved in zip(self._params(), self._snapshot):
                    p.copy_(saved)
        self._losses = [loss.detach().reshape(())]
        self.step -= 1
        self.check(loss)

    # ------------------------------------------------------------------ GradScaler

    def scaler_step_begin(self, scaler: Any) -> None:
        self.scaler = scaler
        self._scaler_stepping = True
        self._stepped = False

    def scaler_step_end(self, scaler: Any) -> None:
        self._scaler_stepping = False
        if self._stepped:
            self._skips = 0
            return
        # the scaler found inf/NaN in the (scaled) gradients and skipped optimizer.step
        self._skips += 1
        self.step += 1
        scale = _scale_of(scaler)
        self.scale_history.append(scale)
        loss = self._loss_value_host()
        record: dict[str, Any] = {
            "step": self.step,
            "loss": loss,
            "nf_loss": 0 if math.isfinite(loss) else 1,
            "events": ["skipped_step"],
            "extra": {"loss_scale": scale, "skipped_step": True, "consecutive_skips": self._skips},
        }
        lr = self._lr()
        if lr is not None:
            record["lr"] = lr
        collapsed = scale < SCALE_FLOOR or self._skips >= SKIP_LIMIT
        if collapsed:
            record["events"].append("loss_scale_collapse")
            record["nf_grads"] = 1  # the gradients are non-finite at every scale tried
            record["extra"]["fp16_story"] = (
                f"the loss scale fell to {scale:.3g} after {self._skips} consecutive skipped "
                "steps: the gradients overflow float16 even unscaled"
            )
        self._reset_measure_history()
        self._observe(record, what="grad" if collapsed else "loss")
        self._reset_window()

    # ------------------------------------------------------------------ the check

    def check(self, closure_loss: Any = None) -> None:
        """Measure this update and hand it to the Monitor (raises to stop the step)."""
        self.step += 1
        step = self.step
        full = (step - 1) % self.every == 0
        measure = self._measure
        if measure is None or self._params_changed():
            measure = self._get_measure()
            if measure.notes:
                self._note(measure.notes)
        loss = self._loss_tensor(closure_loss)
        sync_every = self._sync_every(_device_of(measure.weight if measure.weight is not None
                                                 else loss))  # fmt: skip
        # read every update (CPU): the sample is taken after the read, only when it is wanted
        deferred_sample = sync_every <= 1
        vec, layout = measure.device_vector(full, sample=not deferred_sample)
        if not deferred_sample:
            self._sampled_at = step
        args, kwargs = self._args, self._kwargs
        targets = self._targets_of()
        inputs = _pick_input(args, kwargs)
        dev = vec.device if vec is not None else _device_of(loss)
        if dev.type == "meta":
            dev = torch.device("cpu")
        parts: list[torch.Tensor] = []
        slots: dict[str, tuple[int, int]] = {}
        at = 0
        for name, t in (
            ("loss", loss),
            ("inputs", batch_stats(inputs) if full else None),
            ("targets", batch_stats(targets) if full else None),
            ("clip", self._clip_norm),
            ("scale", self._scale_tensor()),
            ("measure", vec),
        ):
            if t is None or t.device.type == "meta":
                continue
            if t.dtype != torch.float32:
                t = t.float()
            if t.device != dev:
                t = t.to(dev, non_blocking=True)
            if t.dim() != 1:
                t = t.reshape(-1)
            width = t.shape[0]
            slots[name] = (at, width)
            at += width
            parts.append(t)
        ctx = {
            "slots": slots,
            "layout": layout,
            "lr": self._lr(),
            "micro": len(self._losses),
            "full": full,
        }
        self._remember(step, targets, sync_every)
        device_vec = (torch.cat(parts) if len(parts) > 1 else parts[0]) if parts else None
        batch = (inputs, targets, self._rows_of(inputs))
        if sync_every <= 1 or device_vec is None:
            values = device_vec.tolist() if device_vec is not None else []
            self._process(step, values, ctx, batch=batch)
        else:
            self._pending.append((step, device_vec, ctx, {"batch": batch}))
            if len(self._pending) >= sync_every:
                self._drain(force=True, allow_raise=True)
        self._reset_window()

    def _sample_if_wanted(self, step: int, record: dict[str, Any], ctx: dict[str, Any]) -> None:
        """The sampled update norm, cosines and sign flips, when a detector can use them.

        The divergence and ascent detectors read them only over a run of rising losses, so on
        the synchronous path (CPU) the sample is taken on an update whose loss rose, and on the
        full update and the one after it (a point every ``every`` updates for the plots). The
        cosines need the previous update's sample: they appear from the second rising update on.
        """
        loss = record.get("loss")
        prev, self._prev_loss = self._prev_loss, loss
        rising = loss is not None and prev is not None and loss > prev
        if not (rising or ctx["full"] or (step - 2) % self.every == 0):
            return
        measure = self._measure
        if measure is None:
            return
        if self._sampled_at != step - 1:
            measure.reset_history()
        self._sampled_at = step
        stats = measure._sample_stats([p.grad for p in measure.params])
        if stats is not None:
            layout = {"n": 0, "stats": True, "no_grads": True, "half": measure._half ^ 1}
            record.update(measure.record(stats.tolist(), layout))

    def _scale_tensor(self) -> torch.Tensor | None:
        scaler = self.scaler
        if scaler is None or not _enabled(scaler):
            return None
        scale = getattr(scaler, "_scale", None)
        return scale if isinstance(scale, torch.Tensor) else None

    def _rows_of(self, inputs: Any) -> Any:
        """The dataset rows of this batch, when they are known and fit its first dimension."""
        index = self._index
        if index is None:
            return None
        if not isinstance(index, (list, tuple)):
            return index  # BatchRows: it checks its candidates against the batch itself
        first = inputs if isinstance(inputs, torch.Tensor) else self._targets_of()
        if isinstance(first, torch.Tensor) and first.dim() >= 1 and first.shape[0] != len(index):
            return None
        return index

    def _sync_every(self, dev: torch.device) -> int:
        if self.sync_every is not None:
            return self.sync_every
        return 1 if dev.type in ("cpu", "meta") else 16

    def _drain(self, *, force: bool, allow_raise: bool) -> None:
        """Read the pending device vectors (one sync), observe them in order, snapshot if clean."""
        if not self._pending:
            return
        steps = [p[0] for p in self._pending]
        stacked = torch.cat([p[1] for p in self._pending]).tolist()
        pos = 0
        items = list(self._pending)
        self._pending.clear()
        for step, vec, ctx, info in items:
            values = stacked[pos : pos + vec.numel()]
            pos += vec.numel()
            try:
                self._process(step, values, ctx, batch=info["batch"], late=step != steps[-1])
            except Exception:
                if allow_raise:
                    raise
                return
        # every update up to now was clean: the current weights are verified good
        params = self._params()
        if params and params[0].device.type != "meta":
            with torch.no_grad():
                if self._verified is None or len(self._verified) != len(params):
                    self._verified = [p.detach().clone() for p in params]
                else:
                    torch._foreach_copy_(self._verified, [p.detach() for p in params])
            self._verified_step = steps[-1]

    def _process(
        self, step: int, values: list[float], ctx: dict[str, Any], *, batch: Any, late: bool = False
    ) -> None:
        slots = ctx["slots"]
        record: dict[str, Any] = {"step": step}
        extra: dict[str, Any] = {}
        if "loss" in slots:
            loss = values[slots["loss"][0]]
            record["loss"] = loss
            record["nf_loss"] = 0 if math.isfinite(loss) else 1
        if ctx["lr"] is not None:
            record["lr"] = ctx["lr"]
        if "measure" in slots:
            start, width = slots["measure"]
            assert self._measure is not None
            measured = values[start : start + width]
            record.update(self._measure.record(measured, ctx["layout"]))
            n = int(ctx["layout"].get("n", 0))
            if n and "grad_norms" not in record:
                self._gnorms.append((step, measured[:n], ctx["layout"].get("has")))
        bad = bool(record.get("nf_loss") or record.get("nf_grads"))
        if not late and not bad and "measure" in slots and not ctx["layout"].get("stats"):
            self._sample_if_wanted(step, record, ctx)
        if bad and not ctx["full"]:
            self._full_at_failure(record, slots, batch, late=late)
        for source, prefix in (("inputs", "input"), ("targets", "target")):
            if source in slots:
                start, _ = slots[source]
                lo, hi = values[start], values[start + 1]
                absmax = max(abs(lo), abs(hi))
                if not math.isfinite(absmax):
                    record[f"nf_{source}"] = _count_nonfinite(batch[0 if source == "inputs" else 1])
                else:
                    record[f"nf_{source}"] = 0
                    record[f"{prefix}_absmax"] = absmax
        if "clip" in slots:
            pre = values[slots["clip"][0]]
            extra["grad_norm_clipped"] = record.get("grad_norm")
            record["grad_norm"] = pre
            extra["grad_norm_source"] = "pre_clip"
        if "scale" in slots:
            scale = values[slots["scale"][0]]
            extra["loss_scale"] = scale
            self.scale_history.append(scale)
        if ctx["micro"] > 1:
            extra["micro_batches"] = ctx["micro"]
        if late:
            extra["detected_late"] = True
        if extra:
            record["extra"] = extra
        what = "loss"
        if record.get("nf_grads"):
            what = "grad"
        if record.get("nf_params"):
            what = "weight"
        if record.get("nf_loss"):
            what = "loss"
        self._failing = {"step": step, "late": late}
        self._observe(record, what=what, batch=batch)

    def _observe(self, record: dict[str, Any], *, what: str, batch: Any = None) -> None:
        self._failing.setdefault("step", record["step"])
        self._failing["what"] = what
        self._failing["nf_params"] = bool(record.get("nf_params"))
        self._observing = True
        try:
            self.monitor.observe(record, batch=batch)
        finally:
            self._observing = False
            self._failing = {}

    # ------------------------------------------------------------------ when it fired

    def _probe(self, monitor: Monitor, alarm: Alarm) -> dict[str, Any]:
        if not self._observing:
            return {}
        evidence: dict[str, Any] = {}
        self.guard.run("grad norms", self._backfill_grad_norms)
        self._save_last_good(alarm)
        failure = self._make_failure(alarm)
        self.failure = failure
        torch_ev: dict[str, Any] = {"step": failure.step, "what": failure.what}
        if self.notes:
            torch_ev["notes"] = list(self.notes)
        if self.scale_history:
            torch_ev["scale_history"] = list(self.scale_history)[-16:]
        if self.guard.faults or _hooks.GUARD.faults:
            torch_ev["hook_faults"] = {**_hooks.GUARD.faults, **self.guard.faults}
        evidence["torch"] = torch_ev
        if alarm.data.get("shape") == "departure":
            return evidence  # a finite plateau: no op produced a non-finite value to replay for
        try:
            from nanscope.probes.locate import locate
        except ImportError:
            return evidence
        found = locate(failure)
        if found:
            evidence.update(found)
        return evidence

    def _save_last_good(self, alarm: Alarm) -> None:
        if self.model is None:
            return
        params = self._params()
        restored = False
        if self._failing.get("late") and self._verified is not None:
            with torch.no_grad():
                for p, saved in zip(params, self._verified):
                    p.copy_(saved)
            restored = True
            self.monitor.meta["last_good_step"] = self._verified_step
        elif self._failing.get("nf_params") or any(_nonfinite(p) for p in params):
            self._note(["the weights were already non-finite: no last good weights to save"])
            return
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()
                 if isinstance(v, torch.Tensor) and v.device.type != "meta"}  # fmt: skip
        if not state:
            return
        if self.monitor._write:
            path = self.monitor.run_dir / "last_good.pt"
            self.monitor.run_dir.mkdir(parents=True, exist_ok=True)
            torch.save(state, path)
            self.last_good_path = path
            self.monitor.meta["last_good"] = str(path)
        self.monitor.meta.setdefault("last_good_step", self._failing.get("step", alarm.step) - 1)
        if restored:
            self.monitor.meta["last_good_restored"] = True

    def _make_failure(self, alarm: Alarm) -> TorchFailure:
        step = int(self._failing.get("step") or alarm.step)
        args, kwargs, targets = self._args, self._kwargs, self._targets_of()
        extra: dict[str, Any] = {}
        for s, a, k, t in reversed(self._recent):
            if s == step:
                args, kwargs, targets = a, k, t
                break
        if self._failing.get("late"):
            extra["replay_from"] = {
                "step": self._verified_step,
                "batches": [(s, a, k) for s, a, k, _ in self._recent if s > self._verified_step],
            }
        if self._rng is not None:
            extra["rng_state"] = self._rng
        if self._graph_located and step == self.step:
            extra["graph_located"] = self._graph_located
        extra["alarm"] = alarm.kind
        return TorchFailure(
            model=self.model,
            args=args,
            kwargs=kwargs,
            output=self._output,
            loss=self._last_loss,
            loss_module=self._loss_module,
            loss_args=self._loss_args,
            targets=targets,
            backward_site=self._site,
            step=step,
            what=str(self._failing.get("what", "loss")),
            autocast=self._autocast,
            grad_scaler=self.scaler,
            scale_history=list(self.scale_history),
            batch_index=self._rows_of(_pick_input(args, kwargs)),
            extra=extra,
        )

    def _rollback(self, monitor: Monitor, alarm: Alarm) -> bool:
        """Policy ``rollback``: skip the offending batch and cut the learning rate tenfold.

        The check runs before ``optimizer.step``, so the model, the optimizer state, the scaler
        and the scheduler are still those of the last good update: dropping this update's
        gradients leaves them all as they were (the batch is skipped). Then every param group's
        lr (and a scheduler's ``initial_lr``) is multiplied by ``ROLLBACK_LR_FACTOR``. After
        ``ROLLBACK_LIMIT`` rollbacks the next failure raises as ``raise`` would.
        """
        if not self._observing or self._failing.get("late"):
            return False
        if self._failing.get("nf_params"):
            return False
        self._rollbacks += 1
        if self._rollbacks > ROLLBACK_LIMIT:
            return False
        for p in self._params():
            p.grad = None
        for group in self.optimizer.param_groups:
            if isinstance(group.get("lr"), (int, float)):
                group["lr"] = group["lr"] * ROLLBACK_LR_FACTOR
            if isinstance(group.get("initial_lr"), (int, float)):
                group["initial_lr"] = group["initial_lr"] * ROLLBACK_LR_FACTOR
        self._reset_measure_history()
        warnings.warn(
            f"nanscope: update {alarm.step} rolled back ({alarm.text}): batch skipped, weights "
            f"left as they were, lr x {ROLLBACK_LR_FACTOR}",
            RuntimeWarning,
            stacklevel=2,
        )
        return True

    # ------------------------------------------------------------------ helpers

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _get_measure(self) -> ParamMeasure:
        params = self._params()
        key = (len(params), sum(id(p) for p in params))
        if self._measure is None or self._measure.key != key:
            self._measure = ParamMeasure(params, self._names)
        self._groups_sig = self._group_signature()
        return self._measure

    def _group_signature(self) -> list[tuple[int, int]]:
        return [(id(g["params"]), len(g["params"])) for g in self.optimizer.param_groups]

    def _params_changed(self) -> bool:
        """Cheap per-update test: a param group added, or a group's list replaced or resized."""
        return self._group_signature() != self._groups_sig

    def _full_at_failure(
        self, record: dict[str, Any], slots: dict[str, Any], batch: Any, *, late: bool
    ) -> None:
        """A non-finite update that was not a full one: take the skipped measures now.

        The batch's max |x| (from the kept references), the per-name gradient norms and, when
        the weights are still those of this update, the weight norms.
        """
        measure = self._measure
        if measure is not None and self._gnorms and self._gnorms[-1][0] == record["step"]:
            _, gnorms, have = self._gnorms[-1]
            names = measure.grad_norms(gnorms, have)
            if names:
                record["grad_norms"] = names
        if measure is not None and not late:
            vec, layout = measure.weight_vector()
            if vec is not None:
                record.update(measure.record(vec.tolist(), layout))
        for source, prefix, value in (("inputs", "input", batch[0]),
                                      ("targets", "target", batch[1])):  # fmt: skip
            if source in slots:
                continue
            stats = batch_stats(value)
            if stats is None:
                continue
            lo, hi = stats.float().tolist()
            absmax = max(abs(lo), abs(hi))
            if math.isfinite(absmax):
                record[f"nf_{source}"] = 0
                record[f"{prefix}_absmax"] = absmax
            else:
                record[f"nf_{source}"] = _count_nonfinite(value)

    def _backfill_grad_norms(self) -> None:
        """At a stop: per-name gradient norms into the recent records that went without them."""
        measure = self._measure
        if measure is None or not self._gnorms:
            return
        kept = {step: (gnorms, have) for step, gnorms, have in self._gnorms}
        for record in self.monitor.trace.records[-len(kept) - 1 :]:
            step = record.get("step")
            if "grad_norms" in record or step not in kept:
                continue
            gnorms, have = kept[step]
            names = measure.grad_norms(gnorms, have)
            if names:
                record["grad_norms"] = names

    def _reset_measure_history(self) -> None:
        if self._measure is not None:
            self._measure.reset_history()

    def _loss_tensor(self, closure_loss: Any) -> torch.Tensor | None:
        losses = self._losses
        if not losses and isinstance(closure_loss, torch.Tensor) and closure_loss.numel() == 1:
            losses = [closure_loss.detach().reshape(())]
        if not losses:
            return None
        loss = losses[0] if len(losses) == 1 else torch.stack([v.float() for v in losses]).mean()
        if self._scaled is not None and getattr(self._scaled, "_scale", None) is not None:
            loss = loss.float() / self._scaled._scale.to(loss.device).reshape(())
        return loss

    def _loss_value_host(self) -> float:
        loss = self._loss_tensor(None)
        return float(loss) if loss is not None else math.nan

    def _lr(self) -> float | None:
        try:
            lr = self.optimizer.param_groups[0].get("lr")
        except (AttributeError, IndexError):
            return None
        if isinstance(lr, torch.Tensor):
            return float(lr.detach().cpu())
        return float(lr) if isinstance(lr, (int, float)) else None

    def _batch(self) -> tuple[Any, Any]:
        return _pick_input(self._args, self._kwargs), self._targets_of()

    def _targets_of(self) -> Any:
        if len(self._loss_args) >= 2 and isinstance(self._loss_args[1], torch.Tensor):
            return self._loss_args[1]
        for key in _TARGET_KEYS:
            value = self._kwargs.get(key)
            if isinstance(value, torch.Tensor):
                return value
        return None

    def _remember(self, step: int, targets: Any, sync_every: int) -> None:
        if sync_every <= 1:
            self._recent.clear()
        self._recent.append((step, self._args, self._kwargs, targets))

    def _reset_window(self) -> None:
        self._graph_located = None
        self._losses = []
        self._scaled = None
        self._clip_norm = None

    def _note(self, notes: list[str]) -> None:
        for note in notes:
            if note not in self.notes:
                self.notes.append(note)
                warnings.warn(f"nanscope: {note}", RuntimeWarning, stacklevel=4)


_CUDA: list[bool] = []


def _cuda_available() -> bool:
    if not _CUDA:
        _CUDA.append(bool(torch.cuda.is_available()))
    return _CUDA[0]


def _batch_index(args: Any, kwargs: Any) -> Any:
    """The dataset rows of this forward's batch (checked against the data only when read)."""
    rows = sys.modules.get("nanscope.probes.rows")
    if rows is None:
        return None
    try:
        return rows.current_batch_rows(args, kwargs)
    except Exception:
        return None


def _pick_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    first: Any = None
    for value in args:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                return value
            first = first if first is not None else value
    for key in _INPUT_KEYS:
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor):
            return value
    return first


def _device_of(value: Any) -> torch.device:
    return value.device if isinstance(value, torch.Tensor) else torch.device("cpu")


def _count_nonfinite(value: Any) -> int:
    if not isinstance(value, torch.Tensor):
        return 1
    count = int((~torch.isfinite(value.detach())).sum().item())
    return count if count else 1


def _nonfinite(p: torch.Tensor) -> bool:
    if p.device.type == "meta" or p.numel() == 0:
        return False
    return not bool(torch.isfinite(p.detach()).all())


def _enabled(scaler: Any) -> bool:
    try:
        return bool(scaler.is_enabled())
    except Exception:
        return False


def _scale_of(scaler: Any) -> float:
    scale = getattr(scaler, "_scale", None)
    if isinstance(scale, torch.Tensor):
        return float(scale.detach().cpu().reshape(-1)[0])
    return math.nan

