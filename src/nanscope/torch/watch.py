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

The :class:`Watcher` composes parts with one job each: :mod:`~nanscope.torch.window` (what
happened since the last step), :mod:`~nanscope.torch.records` (the record builder every torch entry
point uses), :mod:`~nanscope.torch.deferred` (late reads on accelerators),
:mod:`~nanscope.torch.precision` (the GradScaler) and :mod:`~nanscope.torch.rollback` (last good
weights, the rollback policy).

On CPU the check of an ordinary update is lean: one fused gradient norm and the loss read at its
backward decide at once whether the update is finite; a finite update's record is then shown to
the detectors and written with the next ones, in batches of :data:`BATCH_RECORDS` or every
:data:`BATCH_SECONDS` (the Python of a record costs several times less in a warm loop than right
after ``optimizer.step()``). A non-finite update is still stopped before its step; a finite
divergence is found at most one batch late.

A fault inside nanscope's hooks never stops training: one warning, that hook off, training goes on.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from nanscope.detectors import Alarm, Divergence
from nanscope.errors import DivergenceError, UsageError
from nanscope.monitor import DetectorChain, Monitor
from nanscope.monitor import observers as _observers
from nanscope.outcome import FAR, UNSCALED_RATIO
from nanscope.probes import producer as _producer
from nanscope.probes.failure import CallSite, TorchFailure
from nanscope.torch import _hooks, distributed, sharded
from nanscope.torch.deferred import DeferredReads
from nanscope.torch.history import History
from nanscope.torch.measure import param_names
from nanscope.torch.precision import SCALE_FLOOR, SKIP_LIMIT, Precision, unscale_tensor
from nanscope.torch.records import FULL_EVERY, RecordBuilder, step_extra
from nanscope.torch.rollback import ROLLBACK_LIMIT, ROLLBACK_LR_FACTOR, LastGood
from nanscope.torch.window import StepWindow

__all__ = ["BATCH_RECORDS", "BATCH_SECONDS", "CLIMB_RISES", "FULL_EVERY", "ROLLBACK_LIMIT",
           "ROLLBACK_LR_FACTOR", "SCALE_FLOOR", "SKIP_LIMIT", "Watcher", "watch"]  # fmt: skip

#: finite records shown to the detectors together, at most this many ...
BATCH_RECORDS = 16
#: ... or once the oldest waited this long (a slow fit is judged update by update)
BATCH_SECONDS = 0.25
#: a climb is judged at once from this many rises in a row on: the divergence detector decides
#: from the fourth, the ascent detector from the fifth; one before, as a margin (the watcher
#: counts the rises of its own records, the detectors those they are shown). A noisy loss rises
#: three times in a row about half as often as twice, and each judgment out of turn is a cold one.
CLIMB_RISES = Divergence.RISES - 1


def watch(
    model: Any,
    optimizer: Any,
    *,
    policy: str | None = None,
    monitor: Monitor | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    every: int | None = None,
    sync_every: int | None = None,
    every_agree: int = 1,
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
    every_agree: under ``torch.distributed`` with more than one rank (call ``watch`` on every
        rank), the ranks agree on every stop (:mod:`nanscope.torch.distributed`); they combine
        their verdicts on updates divisible by ``every_agree`` (default 1: every update).
    """
    if isinstance(every_agree, bool) or not isinstance(every_agree, int) or every_agree < 1:
        raise UsageError(f"every_agree must be a positive integer, got {every_agree!r}")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"watch(model, optimizer): model must be a torch.nn.Module, got {type(model).__name__}"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(
            "watch(model, optimizer): optimizer must be a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    watcher = Watcher(model, optimizer, policy=policy, monitor=monitor, run_dir=run_dir,
                      every=every, sync_every=sync_every)  # fmt: skip
    try:
        if distributed.is_distributed():
            distributed.attach_watcher(watcher, every=every_agree)
    except Exception as exc:  # never stop training for nanscope's sake
        warnings.warn(f"nanscope: ranks will not agree on stops ({type(exc).__name__}: {exc})",
                      RuntimeWarning, stacklevel=2)  # fmt: skip
    return watcher


def _eager(model: Any) -> Any:
    """The module a ``torch.compile`` wrapper runs (the replay watches its ops one by one, which
    a compiled graph hides), else ``model`` itself."""
    frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(frame, "OptimizedModule", None)
    if wrapper is not None and isinstance(model, wrapper):
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            return inner
    return model


def _positive(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")


class Watcher:
    """Hooks one optimizer (and its model) into a :class:`nanscope.Monitor`.

    Attributes: ``monitor``, ``model``, ``optimizer``, ``step`` (updates seen), ``failure`` (the
    :class:`~nanscope.probes.failure.TorchFailure` of the stop, once one happened),
    ``last_good_path``, ``notes`` (what was skipped and why); ``guard`` (the hooks' fault guard);
    the parts: ``window`` (this step's batch, losses, clip), ``records`` (the record builder:
    ``records.every``), ``deferred`` (late reads: ``deferred.sync_every``), ``precision`` (the
    GradScaler: ``precision.scaler``, ``precision.scale_history``) and ``last_good``.
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
        every = FULL_EVERY if every is None else every
        _positive("every", every)
        _positive("sync_every", sync_every, optional=True)
        if monitor is not None and not isinstance(monitor, Monitor):
            raise UsageError(f"monitor must be a nanscope.Monitor, got {type(monitor).__name__}")
        self.guard = _hooks.Guard()
        self.optimizer = optimizer
        self.model: Any = None
        #: the model's forward hooks are this watcher's own (not ``nanscope run``'s global ones)
        self.model_hooked = False
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
        faults = monitor.meta.setdefault("hook_faults", {})  # a rank says why it saw nothing:
        self.guard.faults = monitor.trace.meta.setdefault("hook_faults", faults)  # (the engine)
        self.step = 0
        self.failure: TorchFailure | None = None
        self.notes: list[str] = []
        self.window = StepWindow()
        self.records = RecordBuilder(every)
        self.deferred = DeferredReads(sync_every)
        self.precision = Precision()
        self.last_good = LastGood(monitor)
        #: snapshots and recent update inputs for the decisive experiment (probes/replay.py)
        self.history = History(model, optimizer)
        self._replayed = False
        self._handles: list[Any] = []
        self._extra: dict[str, Any] = {}
        self._in_closure = 0
        self._closure_checked = False
        self._closure_losses: list[float] = []
        self._snapshot: list[torch.Tensor] | None = None  # LBFGS: the weights at the step's start
        self._failing: dict[str, Any] = {}  # the update being observed: step, late, what
        self._observing = False
        self._closed = False
        #: finite updates checked, their records not yet shown to the detectors: [step, record,
        #: batch references] (references for the last three only, what the Monitor keeps)
        self._batched: list[list[Any]] = []
        self._batched_since = 0.0
        self._draining = False
        self._stop_error: DivergenceError | None = None
        self._lean_grad: float | None = None  # the last lean check's gradient norm
        self._model_sites = _hooks.CallerSites()  # the user's line that calls the model
        self._training: bool | None = None  # the model's mode at the last forward
        monitor.pending.append(self.drain_batched)
        if model is not None:
            self.bind_model(model, hook=hook_model)
        monitor.probes.append(self._probe)
        monitor.holds.append(self._hold)
        _producer.LIVE.start()  # producer: check every op of the first update (probes/producer.py)
        if monitor.rollback_handler is None:
            monitor.rollback_handler = self._rollback
        if hook_optimizer:
            self._handles.append(optimizer.register_step_pre_hook(self.step_pre))
            self._handles.append(optimizer.register_step_post_hook(self.step_post))
        _hooks.register(self)
        monitor.meta.setdefault("framework", f"torch {torch.__version__}")
        monitor.meta.setdefault("optimizer", type(optimizer).__name__)
        defaults = getattr(optimizer, "defaults", None)
        base = defaults.get("lr") if isinstance(defaults, dict) else None
        if isinstance(base, (int, float)) and not isinstance(base, bool) and base > 0:
            # the lr the optimizer was built with: a schedule's peak, where the script has one
            monitor.meta.setdefault("optimizer_lr", float(base))
        eps = defaults.get("eps") if isinstance(defaults, dict) else None
        if isinstance(eps, (int, float)) and not isinstance(eps, bool):
            monitor.meta.setdefault("optimizer_eps", float(eps))  # (0 in float16 below 6e-8)

    # ------------------------------------------------------------------ binding

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_good_path(self) -> Path | None:
        return self.last_good.path

    def bind_model(self, model: Any, *, hook: bool = True) -> None:
        """Attach the model (its names and, with ``hook``, its forward hooks)."""
        if model is self.model:
            return
        self.model = model
        self.model_hooked = False
        self.history.bind(model)
        self.records.rename(param_names(model))
        if hook:
            self.hook_model()
        if not self.monitor.meta.get("model"):
            self.monitor.meta["model"] = type(model).__name__

    def hook_model(self) -> None:
        """Hook the bound model's forward (``nanscope run`` binds first, hooks once it knows)."""
        if self.model is None or self.model_hooked:
            return
        if isinstance(self.model, torch.jit.ScriptModule):
            return  # it takes no Python hooks: nanscope run's global module hooks see its calls
        self.model_hooked = True
        self._handles.append(
            self.model.register_forward_pre_hook(self._forward_pre, with_kwargs=True)
        )
        self._handles.append(self.model.register_forward_hook(self._forward_post))

    def owns(self, optimizer: Any) -> bool:
        return optimizer is self.optimizer

    def params(self) -> list[torch.Tensor]:
        """The optimizer's parameters, every group, in order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def add_extra(self, extra: Mapping[str, Any]) -> None:
        """Fields for the next record's ``extra`` (a trainer's own logged values)."""
        self._extra.update(extra)

    def close(self) -> Any:
        """Remove every hook; close the monitor if this watcher made it (returns its diagnosis)."""
        if self._closed:
            return self.monitor.diagnosis
        self._closed = True
        _producer.LIVE.stop()
        with contextlib.suppress(DivergenceError):  # a stop in the last batch: already saved
            self.drain_batched()
        with contextlib.suppress(ValueError):
            self.monitor.pending.remove(self.drain_batched)
        self.deferred.drain(self._process, sharded.local_shards(self.params()), allow_raise=False)
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

    # The hooks below run on every update: each is written out (the guard's try inline, no
    # helper between the hook and the work) because a Python call right after the step's
    # kernels costs several times its warm time (docs/performance.md).

    def _forward_pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if _hooks.compiling():
            # torch.compile traces this hook into the model's graph: only references, which the
            # compiler replays after the graph (the RNG read, the frames, would break the graph,
            # an error under fullgraph=True)
            window = self.window
            window.args, window.kwargs, window.rng = args, kwargs, None
            return
        if "forward pre" in self.guard.off or _hooks.aside():
            return  # (a transform's or a checkpoint's call: not this update's batch)
        try:
            self.on_forward(args, kwargs)
        except Exception as exc:
            self.guard.fault("forward pre", exc)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if _hooks.compiling():
            self.window.output = output
            return
        if _hooks.aside():
            return
        window = self.window
        window.output = output
        if not (window.want_output_grad or window.rng_probing):
            return
        if window.want_output_grad:
            self.guard.run("output gradient", window.keep_output_grad, output)
        if window.rng_probing:
            self.guard.run("rng probe", window.probe_rng)

    def on_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any = None) -> None:
        """The model's forward was called with ``args``/``kwargs`` (and returned ``output``)."""
        # the forward of every ``every``-th update, and the first after a train/eval switch,
        # says whether the forward draws from the RNG (window.probe_rng)
        training = getattr(self.model, "training", None)
        probe = self.step % self.records.every == 0 or training is not self._training
        self._training = training
        self.window.on_forward(args, kwargs, output, rng=self.failure is None, probe=probe)
        if self.history.off is None:
            try:
                self.history.on_forward(args, kwargs)
            except Exception as exc:  # the replay is lost, never the forward hook
                self.history.off = f"the history of updates failed ({type(exc).__name__}: {exc})"
        try:
            # the user's line that called the model (None when called late, not from a forward)
            self.window.model_site = self._model_sites.get(2, skip_from="_bind")
        except Exception:
            self.window.model_site = None

    def on_batch(self, inputs: Any, targets: Any) -> None:
        """A trainer callback names this step's batch (read where the forward's arguments fail)."""
        self.window.on_batch(inputs, targets)

    def on_backward(self, tensor: torch.Tensor, site: CallSite | None) -> None:
        # a backward that cannot reach this optimizer's params is someone else's (GAN, 2 models)
        if "backward" in self.guard.off or not tensor.requires_grad:
            return
        scaler = _hooks.scaled_by(tensor)
        if scaler is not None:
            self.precision.scaler = scaler
        self.window.on_backward(tensor, site, scaler, self._inspect_live_graph)

    def _inspect_live_graph(self, tensor: torch.Tensor, site: CallSite | None) -> None:
        def inspect() -> None:
            from nanscope.probes.locate import inspect_graph

            found = inspect_graph(tensor, output=self.window.output, site=site)
            self.window.graph_located = found or {}

        self.guard.run("live graph", inspect)

    def on_loss_module(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.window.on_loss_module(module, args, kwargs)

    def on_clip(self, total: Any) -> None:
        self.window.on_clip(total)
        call = _hooks.CLIP_CALL
        self.window.clip_call = (call["params"], call["max_norm"], call["norm_type"]) if call \
            else None  # fmt: skip

    def step_pre(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The optimizer's step pre-hook: check this update before the weights change."""
        if "step" in self.guard.off:
            return None
        self.precision.stepped = False
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
        try:
            self.check()
        except DivergenceError:
            raise
        except Exception as exc:
            self.guard.fault("step", exc)
        return None

    def step_post(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The optimizer's step post-hook: the update was applied."""
        if _producer.LIVE.pushed:  # the first update's op watch (every later step: nothing)
            _producer.LIVE.stop()
        self.precision.on_step()
        self._snapshot = None
        window = self.window
        if not (self._closure_losses or window.loss_args_live or window.output is not None
                or window.last_loss is not None):  # fmt: skip
            return  # a lean check dropped the graph already
        if self._closure_losses:  # every closure evaluation of this update, the first one first
            records = self.monitor.trace.records
            if records and records[-1].get("step") == self.step:
                first = records[-1].get("loss")
                losses = [first, *self._closure_losses]
                records[-1].setdefault("extra", {})["closure_losses"] = losses
                # on disk too: the record was written at the first evaluation (trace.read_trace
                # puts this line back on it)
                self.monitor.write({"event": "closure_losses", "step": self.step, "losses": losses})
            self._closure_losses = []
            self.window.losses = []  # the later evaluations' losses are not the next update's
        self._drop_graph()

    def _drop_graph(self) -> None:
        """Forget the loss tensor and the output once the update is checked: they hold the
        autograd graph (an unrolled graph, LBFGS's last closure) until the next backward."""
        window = self.window
        window.last_loss = None
        window.output = None
        if window.loss_args_live:
            # the loss module's arguments stay for a replay, without the graph the output holds
            window.loss_args_live = False
            window.loss_args = tuple(
                a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a
                for a in window.loss_args
            )

    def _wrap_closure(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        self._closure_checked = False
        self._closure_losses = []
        self.window.losses = []  # this update's loss is its first closure evaluation
        if isinstance(self.optimizer, torch.optim.LBFGS):
            # LBFGS changes the weights between closure calls: keep this update's start
            self._snapshot = [p.detach().clone() for p in self.params()]

        def checked_closure() -> Any:
            if self._closure_checked:
                # the first update's loss and gradient were watched at the first evaluation, and
                # the optimizer's arithmetic up to this one: watching 20 more forwards and
                # backwards would only keep their per-op bookkeeping alive
                _producer.LIVE.stop()
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
                self._drop_graph()  # a finite evaluation: its graph is not needed any more
            return out

        return checked_closure

    def _check_inner(self, loss: torch.Tensor) -> None:
        """A later closure call inside one LBFGS step: a NaN here restores the step's start."""
        if math.isfinite(float(loss.detach())):
            return
        if self._snapshot is not None:
            with torch.no_grad():
                for p, saved in zip(self.params(), self._snapshot):
                    p.copy_(saved)
        self.window.losses = [loss.detach().reshape(())]
        self.step -= 1
        self.check(loss)

    def scaler_step_begin(self, scaler: Any) -> None:
        self.precision.step_begin(scaler)

    def scaler_step_end(self, scaler: Any) -> None:
        skip = self.precision.step_end(scaler)
        if skip is None:
            return
        self.drain_batched()
        self.step += 1
        loss = self.window.loss(None, unscale_tensor(self.window.scaled_by))
        value = float(loss) if loss is not None else math.nan
        record = Precision.skipped_record(self.step, value, self._lr(), skip)
        self.records.reset_history()
        self._observe(record, what="grad" if skip["collapsed"] else "loss")
        self.window.reset()

    # ------------------------------------------------------------------ the check

    def check(self, closure_loss: Any = None) -> None:
        """Measure this update and hand it to the Monitor (raises to stop the step)."""
        if self._stop_error is not None:  # found while the trace was read between two steps
            error, self._stop_error = self._stop_error, None
            raise error
        self.step += 1
        step = self.step
        if self.history.off is None and not self._in_closure:
            try:
                self.history.on_check(step, 1, self.window.model_site)
            except Exception as exc:  # the replay is lost, never the run
                self.history.off = f"the history of updates failed ({type(exc).__name__}: {exc})"
        records = self.records
        measure = records.measure
        if measure is None or records.params_changed(self.optimizer):
            measure = records.measure_for(self.optimizer, self.params())
            if measure.notes:
                self._note(measure.notes)
        if (closure_loss is None and measure.lean and self._lean_applies(step)
                and self._check_lean(step, measure)):  # fmt: skip
            return
        window = self.window
        self.drain_batched()  # the records before this one first
        loss = window.loss(closure_loss, unscale_tensor(window.scaled_by))
        weight = measure.weight if measure.weight is not None else loss
        interval = self.deferred.interval(
            weight.device if isinstance(weight, torch.Tensor) else torch.device("cpu")
        )
        vec, ctx, batch = records.pack(step, window, loss, self.precision.scale_tensor(),
                                       interval=interval, lr=self._lr())  # fmt: skip
        self.deferred.remember(step, window.args, window.kwargs, batch[1], interval)
        if interval <= 1 or vec is None:
            self._process(step, vec.tolist() if vec is not None else [], ctx, batch=batch)
        elif self.deferred.push(step, vec, ctx, batch):
            shards = sharded.local_shards(self.params())
            self.deferred.drain(self._process, shards, allow_raise=True)
        window.reset()
        self._drop_graph()

    def _lean_applies(self, step: int) -> bool:
        """The lean check serves this update: CPU, read at once, not a full update, no loss
        scale; and nothing needs each record the moment it is made (the rollback policy, a
        sweep's observers, the cross-rank agreement, which runs its collectives per record)."""
        window = self.window
        floats = window.loss_floats
        return (
            self.deferred.sync_every in (None, 1)
            and (step - 1) % self.records.every != 0
            and bool(floats) and len(floats) == len(window.losses)
            and window.scaled_by is None and self.precision.scaler is None
            and self.monitor.policy != "rollback"
            and not _observers
            and type(self.monitor.detectors) is DetectorChain
        )  # fmt: skip

    def _check_lean(self, step: int, measure: Any) -> bool:
        """Check a CPU update with one norm pass; False hands it to the full check (a
        non-finite value, a missing gradient), which then measures everything at once.

        It runs on every update, right after the backward (a cold cache): the record is made
        here with as few calls as it takes, and judged later with the next ones
        (:meth:`drain_batched`), unless a detector could fire on it now."""
        window = self.window
        floats = window.loss_floats
        loss = floats[0] if len(floats) == 1 else math.fsum(floats)
        if not math.isfinite(loss):
            return False
        clip = None
        # (a clip called before backward() read stale gradients: its total is not this step's)
        if window.clip_norm is not None and window.clip_fresh:
            clip = float(window.clip_norm)
            if not math.isfinite(clip):
                return False
        clipped = self._clipped_norm(clip, measure) if clip is not None else None
        if clipped is not None:
            g_sq, gnorms = clipped * clipped, None  # the script's own norm said it: finite
        else:
            measured = measure.lean_norms()
            if measured is None:
                return False
            g_sq, gnorms = measured
            if not math.isfinite(g_sq):
                return False
        lr = self._lr()
        record: dict[str, Any] = {"step": step, "loss": loss, "nf_loss": 0}
        if lr is not None:
            record["lr"] = lr
        grad_norm = math.sqrt(g_sq)
        record["grad_norm"] = grad_norm
        record["nf_grads"] = 0
        records = self.records
        if gnorms is not None:
            records.keep_norms(step, gnorms)
        prev_grad = self._lean_grad
        self._lean_grad = grad_norm
        prev_loss = records.sample_if_wanted(step, record, full=False)
        # judged now, not with the batch: a climb (:data:`CLIMB_RISES`) and a jump of the loss
        # or the gradient (a spike's batch rows)
        first = records.first_loss
        urgent = records.rises >= CLIMB_RISES or (
            prev_loss is not None and loss - prev_loss > 3.0 * abs(prev_loss)
        ) or (prev_grad is not None and grad_norm > 10.0 * prev_grad) or (
            first is not None and first > 0 and loss > FAR * first)  # fmt: skip
        if clip is not None or len(floats) > 1:
            extra: dict[str, Any] = {}
            step_extra(record, extra, pre_clip=clip, micro=len(floats))
            record["extra"] = extra
        if self._extra:
            self._take_extra(record)
        batched = self._batched
        if len(batched) >= 3:
            batched[-3][2] = None  # the Monitor keeps the last three batches: so do we
        batched.append([step, record, window.refs()])
        window.reset()
        # a finite update is never replayed: its loss module's arguments are not kept, nor the
        # loss and the output (their graph: _drop_graph)
        window.loss_args, window.loss_args_live = (), False
        window.last_loss = window.output = None
        now = time.monotonic()
        if len(batched) == 1:
            self._batched_since = now
        if urgent or len(batched) >= BATCH_RECORDS or now - self._batched_since >= BATCH_SECONDS:
            self.drain_batched()
        return True

    def _clipped_norm(self, pre: float | None, measure: Any) -> float | None:
        """The gradient norm the optimizer sees after ``clip_grad_norm_``, from that call alone:
        its pre-clip total (finite) is the 2-norm over every one of this optimizer's parameters,
        and clipping scales it by ``min(1, max_norm / (total + 1e-6))``, torch's own factor.
        None when the call does not cover them all, used another norm or cannot be read."""
        call = self.window.clip_call
        if pre is None or call is None:
            return None
        params, max_norm, norm_type = call
        try:
            if float(norm_type) != 2.0:
                return None
            limit = float(max_norm)
        except (TypeError, ValueError, RuntimeError):
            return None
        if not math.isfinite(limit) or limit < 0:
            return None
        clipped_ids = {id(p) for p in params}
        if not all(id(p) in clipped_ids for p in measure.params):
            return None
        return pre * min(1.0, limit / (pre + 1e-6))

    def drain_batched(self, *, stop: bool = True) -> None:
        """Show the detectors the finite records the lean check holds, in order; the Monitor
        calls it before the trace is read. An alarm stops the fit as at its own update; the
        updates after it ran too and are written to the trace. ``stop=False`` (a read of the
        trace): the stop is raised at the next update's check instead of here."""
        if self._draining or not self._batched:
            return
        if not stop:
            try:
                self.drain_batched()
            except DivergenceError as exc:
                self._stop_error = exc
            return
        self._draining = True
        items, self._batched = self._batched, []
        try:
            for k, (step, record, refs) in enumerate(items):
                # (None, None, None): this update's batch is not known any more, not an older one
                batch = StepWindow.batch_of(refs) if refs is not None else (None, None, None)
                self._failing = {"step": step, "late": False}
                try:
                    self._observe(record, what="loss", batch=batch)
                except DivergenceError:
                    # the updates after the alarm ran too (it was judged with its batch)
                    for _, later, _ in items[k + 1 :]:
                        self.monitor.write(later)
                        self.monitor.trace.append(later)
                    self.records.backfill_grad_norms(self.monitor.trace.records)
                    raise
        finally:
            self._draining = False

    def _process(
        self, step: int, values: list[float], ctx: dict[str, Any], *, batch: Any, late: bool = False
    ) -> None:
        record, what, scale = self.records.unpack(step, values, ctx, batch=batch, late=late)
        if scale is not None:
            self.precision.note_scale(scale)
        self._take_extra(record)
        self._failing = {"step": step, "late": late}
        self._observe(record, what=what, batch=batch)

    def _take_extra(self, record: dict[str, Any]) -> None:
        """The fields :meth:`add_extra` gave go into this record (its own win a clash)."""
        if self._extra:
            record["extra"] = {**self._extra, **record.get("extra", {})}
            self._extra = {}

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
        self.guard.run("grad norms", self.records.backfill_grad_norms, monitor.trace.records)
        notes = self.last_good.save(self.model, self.params(), self._failing, alarm, self.deferred)
        self._note(notes)
        failure = self._make_failure(alarm)
        self.failure = failure
        torch_ev: dict[str, Any] = {"step": failure.step, "what": failure.what}
        if self.notes:
            torch_ev["notes"] = list(self.notes)
        if self.precision.scale_history:
            torch_ev["scale_history"] = list(self.precision.scale_history)[-16:]
        if self.guard.faults or _hooks.GUARD.faults:
            torch_ev["hook_faults"] = {**_hooks.GUARD.faults, **self.guard.faults}
        evidence["torch"] = torch_ev
        self._for_replay(failure, monitor, alarm)
        if alarm.data.get("shape") not in ("departure", "explosion"):
            # (a finite plateau or jump: no op produced a non-finite value to locate)
            try:
                from nanscope.probes.locate import locate
            except ImportError:
                return evidence
            found = locate(failure)
            if found:
                evidence.update(found)
        if not self._replayed:
            self._replayed = True  # one decisive experiment per watcher
            from nanscope.probes.replay import experiments

            entries = experiments(failure, evidence)
            if entries:
                evidence["confirmation"] = [*(evidence.get("confirmation") or []), *entries]
        return evidence

    def _hold(self, monitor: Monitor, alarm: Alarm) -> str | None:
        """A departure whose frozen pre-jump weights give the same high loss on the batches after
        the jump is the data's step, not a divergence (probes/replay.py): not stopped."""
        if not self._observing or alarm.data.get("shape") != "departure":
            return None
        from nanscope.probes.replay import data_step

        failure = self._make_failure(alarm)
        self._for_replay(failure, monitor, alarm)
        return data_step(failure, dict(alarm.data))

    def _for_replay(self, failure: TorchFailure, monitor: Monitor, alarm: Alarm) -> None:
        """What the replay needs besides the failure: the history, the recorded losses and
        gradient norms, where the trouble began, the unscaled column."""
        from nanscope.probes.replay import onset_of

        records = monitor.trace.records[-4096:]
        losses = [(int(r["step"]), float(r["loss"])) for r in records
                  if isinstance(r.get("loss"), (int, float))]  # fmt: skip
        failure.extra["history"] = self.history
        failure.extra["losses"] = losses
        failure.extra["grad_norms"] = [(int(r["step"]), float(r["grad_norm"])) for r in records
                                       if isinstance(r.get("grad_norm"), (int, float))]
        failure.extra["onset"] = onset_of(losses, dict(alarm.data), int(failure.step or 1))
        rows = [{"step": r.get("step"), **row} for r in records[-64:] for row in
                r.get("rows") or [] if isinstance(row, dict)]  # fmt: skip
        failure.extra["rows"] = rows
        for record in records[:8]:
            ratio = record.get("input_scale_ratio")
            if isinstance(ratio, (int, float)) and ratio >= UNSCALED_RATIO:
                failure.extra["unscaled_column"] = record.get("input_scale_column")
                break

    def _make_failure(self, alarm: Alarm) -> TorchFailure:
        step = int(self._failing.get("step") or alarm.step)
        extra: dict[str, Any] = {"alarm": alarm.kind}
        if self._failing.get("late"):
            extra["replay_from"] = self.deferred.replay_from()
        # a replay of a sharded model would run its collectives on this rank alone
        model = None if sharded.is_sharded(self.model) else _eager(self.model)
        return self.window.failure(
            model, step, str(self._failing.get("what", "loss")),
            kept=self.deferred.batch_at(step), current=step == self.step,
            scaler=self.precision.scaler, scale_history=list(self.precision.scale_history),
            extra=extra,
        )  # fmt: skip

    def _rollback(self, monitor: Monitor, alarm: Alarm) -> bool:
        """Policy ``rollback`` (:meth:`nanscope.torch.rollback.LastGood.rollback`)."""
        if not self._observing:
            return False
        done = self.last_good.rollback(self.optimizer, self.params(), self._failing, alarm)
        if done:
            self.records.reset_history()
        return done

    # ------------------------------------------------------------------ helpers

    def _lr(self) -> float | None:
        try:
            lr = self.optimizer.param_groups[0].get("lr")
        except (AttributeError, IndexError):
            return None
        if type(lr) is float:  # the common case first: it is read on every update
            return lr
        if isinstance(lr, torch.Tensor):
            return float(lr.detach().cpu())
        return float(lr) if isinstance(lr, (int, float)) else None

    def _note(self, notes: list[str]) -> None:
        for note in notes:
            if note not in self.notes:
                self.notes.append(note)
                warnings.warn(f"nanscope: {note}", RuntimeWarning, stacklevel=4)
