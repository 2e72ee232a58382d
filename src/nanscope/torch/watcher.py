"""The :class:`Watcher`: one optimizer (and its model) hooked into a :class:`nanscope.Monitor`.

It is an adapter: it wires torch's hooks to parts that each do one job and are tested alone --
:mod:`~nanscope.torch.window` (what happened since the last step), :mod:`~nanscope.torch.records`
(the record builder every torch entry point uses), :mod:`~nanscope.torch.lean` (the lean check
of a CPU update and the batched judging of its records), :mod:`~nanscope.torch.deferred` (late
reads on accelerators), :mod:`~nanscope.torch.closure` (``step(closure)``),
:mod:`~nanscope.torch.precision` (the GradScaler), :mod:`~nanscope.torch.rollback` (last good
weights, the rollback policy) and :mod:`~nanscope.torch.failing` (what a stop hands the probes).

:func:`nanscope.watch` (:mod:`nanscope.torch.watch`) makes one for a script; ``nanscope run``
(:mod:`nanscope.torch.autowatch`) and the trainer callbacks (:mod:`nanscope.integrations`) make
theirs. A fault inside the hooks never stops training: one warning, that hook off, training goes
on.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from nanscope.errors import DivergenceError, UsageError
from nanscope.monitor import Monitor
from nanscope.probes import producer as _producer
from nanscope.probes.failure import CallSite, TorchFailure
from nanscope.torch import _hooks, first_update, sharded
from nanscope.torch.closure import ClosureSteps
from nanscope.torch.deferred import DeferredReads
from nanscope.torch.failing import AlarmHandlers
from nanscope.torch.history import History
from nanscope.torch.lean import LeanCheck
from nanscope.torch.measure import ParamMeasure, param_names
from nanscope.torch.precision import Precision, unscale_tensor
from nanscope.torch.records import FULL_EVERY, RecordBuilder, read_lr
from nanscope.torch.rollback import LastGood
from nanscope.torch.window import StepWindow

__all__ = ["Watcher"]


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
    ``records.every``), ``lean`` (the lean check and the records it holds), ``deferred`` (late
    reads: ``deferred.sync_every``), ``closures`` (``step(closure)``), ``precision`` (the
    GradScaler: ``precision.scaler``, ``precision.scale_history``), ``last_good`` and
    ``history`` (the decisive experiment's snapshots).

    meta: entries for the Monitor's ``meta`` that this watcher's maker knows better (``source``,
    ``optimizer``), set over the defaults.
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
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        every = FULL_EVERY if every is None else every
        _positive("every", every)
        _positive("sync_every", sync_every, optional=True)
        self.monitor = _monitor_for(model, optimizer, monitor, policy=policy, run_dir=run_dir)
        self._owns_monitor = monitor is None
        self.guard = _hooks.Guard()
        # the hooks' faults, in the run's meta and the trace's (a rank says why it saw nothing)
        faults = self.monitor.meta.setdefault("hook_faults", {})
        self.guard.faults = self.monitor.trace.meta.setdefault("hook_faults", faults)
        self.optimizer = optimizer
        self.model: Any = None
        #: no model calls this optimizer's weights (a loop on bare tensors): the batch is read
        #: off each loss's graph at its backward (set by ``nanscope run``)
        self.graph_inputs = False
        #: the model's forward hooks are this watcher's own (not ``nanscope run``'s global ones)
        self.model_hooked = False
        self.step = 0
        self.notes: list[str] = []
        self.window = StepWindow()
        self.records = RecordBuilder(every)
        self.deferred = DeferredReads(sync_every)
        self.precision = Precision()
        self.last_good = LastGood(self.monitor)
        self.lean = LeanCheck(self.monitor, self.window, self.records, self.deferred,
                              self.precision, self._observe_batched)  # fmt: skip
        self.closures = ClosureSteps(self.guard, self.window)
        self.alarms = AlarmHandlers(self)
        #: snapshots and recent update inputs for the decisive experiment (probes/replay.py)
        self.history = History(model, optimizer)
        self._handles: list[Any] = []
        self._closed = False
        self._model_sites = _hooks.CallerSites()  # the user's line that calls the model
        self._training: bool | None = None  # the model's mode at the last forward
        self._connect(model, hook_model=hook_model, hook_optimizer=hook_optimizer)
        self.monitor.meta.update(meta or {})

    def _connect(self, model: Any, *, hook_model: bool, hook_optimizer: bool) -> None:
        """Register with the Monitor and the hooks; describe the optimizer in the run's meta."""
        monitor, optimizer = self.monitor, self.optimizer
        monitor.pending.append(self.drain_batched)
        if model is not None:
            self.bind_model(model, hook=hook_model)
        self.alarms.connect(monitor)
        _producer.FIRST_UPDATE_WATCH.start()  # every op of the first update (probes/producer.py)
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

    @property
    def failure(self) -> TorchFailure | None:
        """The :class:`~nanscope.probes.failure.TorchFailure` of the stop, once one happened."""
        return self.alarms.failure

    def bind_model(self, model: Any, *, hook: bool = True) -> None:
        """Attach the model (its names and, with ``hook``, its forward hooks)."""
        if model is self.model:
            return
        self.model = model
        self.model_hooked = False
        self.history.bind(model)
        self.records.rename(param_names(model))
        self.guard.run("initial weight scale", _initial_scale, self)
        if hook:
            self.hook_model()
        self.monitor.meta["model"] = self.monitor.meta.get("model") or type(model).__name__

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
        self.records.add_extra(extra)

    def first_update(self, loss: float | None, measured: dict[str, Any] | None = None) -> None:
        """Update 1 happened before this watcher existed (``nanscope run`` finds a loop that
        updates by hand at its second): its loss is recorded with what was ``measured`` of it at
        its backward (batch, gradient; :mod:`nanscope.torch.first_update`)."""
        if loss is not None:
            record = {"step": 1, "loss": loss, "nf_loss": 0 if math.isfinite(loss) else 1}
            # (probed and replayed like any failure; late: its weights are the step's by now)
            self.alarms.observe({**(measured or {}), **record}, what="loss", late=True)
        self.step = 1

    def close(self) -> Any:
        """Remove every hook; close the monitor if this watcher made it (returns its diagnosis)."""
        if self._closed:
            return self.monitor.diagnosis
        self._closed = True
        _producer.FIRST_UPDATE_WATCH.stop()
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
            # torch.compile traces this hook into the model's graph: only references
            self.window.on_traced_forward(args, kwargs)
            return
        if "forward pre" in self.guard.off or _hooks.aside():
            return  # (a transform's or a checkpoint's call: not this update's batch)
        try:
            self.on_forward(args, kwargs)
        except Exception as exc:
            self.guard.fault("forward pre", exc)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if _hooks.compiling():
            self.window.on_output(output)
            return
        if _hooks.aside():
            return
        window = self.window
        window.on_output(output)
        if not (window.want_output_grad or window.rng_probing):
            return
        if window.want_output_grad:
            self.guard.run("output gradient", window.keep_output_grad, output)
        if window.rng_probing:
            self.guard.run("rng probe", window.probe_rng)

    def on_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any = None, *,
                   scope: dict[str, Any] | None = None) -> None:  # fmt: skip
        """The model's forward was called with ``args``/``kwargs`` (and returned ``output``);
        ``scope``: for a forward made before this watcher existed, a copy of the namespace of
        the user's frame that called it (the frame itself has moved on)."""
        # the forward of every full update (the next one is update step + 1), and the first
        # after a train/eval switch, says whether the forward draws from the RNG
        training = getattr(self.model, "training", None)
        probe = self.records.full.due(self.step + 1) or training is not self._training
        self._training = training
        try:
            # the user's line that called the model (None when called late, not from a forward)
            site = self._model_sites.get(2, skip_from="_bind")
        except Exception:
            site = None
        # (an earlier forward's RNG state is gone: the state now is not the one it drew from)
        self.window.on_forward(args, kwargs, output, rng=self.failure is None and scope is None,
                               probe=probe, site=site)  # fmt: skip
        if self.history.off is None:
            try:
                self.history.on_forward(args, kwargs, scope=scope)
            except Exception as exc:  # the replay is lost, never the forward hook
                self.history.off = f"the history of updates failed ({type(exc).__name__}: {exc})"

    def on_batch(self, inputs: Any, targets: Any) -> None:
        """A trainer callback names this step's batch (read where the forward's arguments fail)."""
        self.window.on_batch(inputs, targets)

    def on_backward(
        self, tensor: torch.Tensor, site: CallSite | None, value: torch.Tensor | None = None
    ) -> None:
        """``backward()`` was called on ``tensor``; ``value``: its loss before a static scale,
        when it was read at the backward (a Watcher made later is handed earlier backwards)."""
        # a backward that cannot reach this optimizer's params is someone else's (GAN, 2 models)
        if "backward" in self.guard.off or not tensor.requires_grad:
            return
        scaler = _hooks.scaled_by(tensor)
        if scaler is not None:
            self.precision.scaler = scaler
        self.window.on_backward(tensor, site, scaler, self._inspect_live_graph, value)
        if self.graph_inputs and self.model is None:
            self.guard.run("graph inputs", _batch_from_graph, self, tensor)

    def _inspect_live_graph(
        self, tensor: torch.Tensor, site: CallSite | None
    ) -> dict[str, Any] | None:
        def inspect() -> dict[str, Any]:
            from nanscope.probes.locate import inspect_graph

            return inspect_graph(tensor, output=self.window.output, site=site) or {}

        return self.guard.run("live graph", inspect)

    def on_loss_module(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.window.on_loss_module(module, args, kwargs)

    def on_clip(self, total: Any) -> None:
        call = _hooks.CLIP_CALL
        self.window.on_clip(total, (call["params"], call["max_norm"], call["norm_type"])
                            if call else None)  # fmt: skip

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
        if _producer.FIRST_UPDATE_WATCH.pushed:  # (every later step: nothing to stop)
            _producer.FIRST_UPDATE_WATCH.stop()
        self.precision.on_step()
        self.closures.step_done(self.monitor, self.step, self.history)
        window = self.window
        if window.loss_args_live or window.output is not None or window.last_loss is not None:
            window.drop_graph()  # (a lean check dropped it already)

    def _wrap_closure(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        # LBFGS changes the weights between closure calls: this update's start is kept
        lbfgs = isinstance(self.optimizer, torch.optim.LBFGS)
        return self.closures.wrap(closure, self.params(), check=self.check,
                                  recheck=self._check_inner, keeps_start=lbfgs)  # fmt: skip

    def _check_inner(self, loss: torch.Tensor) -> None:
        """A later closure call inside one LBFGS step: a NaN here restores the step's start."""
        if self.closures.restore_start(self.params(), loss):
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
        record = Precision.skipped_record(self.step, value, read_lr(self.optimizer), skip)
        self.records.reset_history()
        self.alarms.observe(record, what="grad" if skip["collapsed"] else "loss")
        self.window.reset()

    # ------------------------------------------------------------------ the check

    def check(self, closure_loss: Any = None) -> None:
        """Measure this update and hand it to the Monitor (raises to stop the step)."""
        self.lean.raise_held()  # a stop found while the trace was read between two steps
        self.step += 1
        step = self.step
        if self.history.off is None and not self.closures.depth:
            try:
                self.history.on_check(step, 1, self.window.model_site)
            except Exception as exc:  # the replay is lost, never the run
                self.history.off = f"the history of updates failed ({type(exc).__name__}: {exc})"
        measure = self._measure()
        if (closure_loss is None and measure.lean and self.lean.applies(step)
                and self.lean.check(step, measure, read_lr(self.optimizer))):  # fmt: skip
            return
        window = self.window
        self.drain_batched()  # the records before this one first
        loss = window.loss(closure_loss, unscale_tensor(window.scaled_by))
        weight = measure.weight if measure.weight is not None else loss
        interval = self.deferred.interval(
            weight.device if isinstance(weight, torch.Tensor) else torch.device("cpu")
        )
        lr = read_lr(self.optimizer)
        vec, ctx, batch = self.records.pack(step, window, loss, self.precision.scale_tensor(),
                                            interval=interval, lr=lr)  # fmt: skip
        self.deferred.remember(step, window.args, window.kwargs, batch[1], interval)
        if interval <= 1 or vec is None:
            self._process(step, vec.tolist() if vec is not None else [], ctx, batch=batch)
        elif self.deferred.push(step, vec, ctx, batch):
            shards = sharded.local_shards(self.params())
            self.deferred.drain(self._process, shards, allow_raise=True)
        window.reset()
        window.drop_graph()

    def _measure(self) -> ParamMeasure:
        """The measure of the optimizer's parameters (made anew when they changed)."""
        records = self.records
        measure = records.measure
        if measure is None or records.params_changed(self.optimizer):
            measure = records.measure_for(self.optimizer, self.params())
            if measure.notes:
                self.note(measure.notes)
        return measure

    def drain_batched(self, *, stop: bool = True) -> None:
        """Show the detectors the records the lean check holds (:meth:`LeanCheck.drain`)."""
        self.lean.drain(stop=stop)

    def _observe_batched(self, step: int, record: dict[str, Any], batch: Any) -> None:
        self.alarms.observe(record, what="loss", batch=batch, step=step)

    def _process(
        self, step: int, values: list[float], ctx: dict[str, Any], *, batch: Any, late: bool = False
    ) -> None:
        record, what, scale = self.records.unpack(step, values, ctx, batch=batch, late=late)
        if scale is not None:
            self.precision.note_scale(scale)
        self.records.take_extra(record)
        self.alarms.observe(record, what=what, batch=batch, step=step, late=late)

    # ------------------------------------------------------------------ helpers

    def note(self, notes: list[str]) -> None:
        """Say once (a warning, and ``notes``) what is skipped and why."""
        for note in notes:
            if note not in self.notes:
                self.notes.append(note)
                warnings.warn(f"nanscope: {note}", RuntimeWarning, stacklevel=4)


def _monitor_for(
    model: Any,
    optimizer: Any,
    monitor: Monitor | None,
    *,
    policy: str | None,
    run_dir: str | os.PathLike[str] | None,
) -> Monitor:
    """The Monitor a watcher feeds: ``monitor`` (its policy must agree), else a new one."""
    if monitor is not None and not isinstance(monitor, Monitor):
        raise UsageError(f"monitor must be a nanscope.Monitor, got {type(monitor).__name__}")
    if monitor is None:
        name = type(model).__name__ if model is not None else type(optimizer).__name__
        return Monitor(policy=policy, run_dir=run_dir, name=name, meta={"source": "torch"})
    if policy is not None and policy != monitor.policy:
        raise UsageError(
            f"policy={policy!r} conflicts with the monitor's policy {monitor.policy!r}"
        )
    return monitor


def _initial_scale(watcher: Watcher) -> None:
    """A model bound before its first update has its initial weights: their scale is evidence
    about the initialisation."""
    evidence = watcher.monitor.evidence
    if watcher.step != 0 or watcher.model is None or "initial_weight_scale" in evidence:
        return
    scale = first_update.linear_weight_scale(watcher.model)
    if scale:
        evidence["initial_weight_scale"] = scale


def _batch_from_graph(watcher: Watcher, tensor: torch.Tensor) -> None:
    """The data this loss applied the watcher's weights to (``xb`` of ``xb @ w``), as the batch
    of a loop that calls no model."""
    from nanscope.probes._tensors import weighted_inputs

    if tensor.grad_fn is not None:
        inputs = weighted_inputs(tensor.grad_fn, watcher.params())
        if inputs:
            watcher.on_forward(inputs, {})
