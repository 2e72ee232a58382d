"""Watch every optimizer a script creates, with no change to the script (``nanscope run``).

:func:`arm` is called by ``nanscope run`` before the script starts:

* if torch is already imported, the global hooks are enabled now;
* otherwise a ``sys.meta_path`` finder waits for the script's own ``import torch`` and enables them
  right after torch finished importing. A script that never imports torch never imports it.

The global hooks (all guarded: a fault inside nanscope warns once and switches that hook off):

* ``torch.optim.optimizer.register_optimizer_step_pre_hook`` / post hook: the first step of any
  optimizer creates its :class:`~nanscope.torch.watcher.Watcher` (and Monitor), so optimizers
  created inside ``Trainer.fit`` (Lightning) or ``Trainer.train`` (Hugging Face) are found too;
* ``register_module_forward_pre_hook`` / ``register_module_forward_hook`` (``with_kwargs``,
  ``always_call``) track the call depth: the outermost module called between two steps whose
  parameters the optimizer holds is the model; its arguments (also keyword arguments, as Hugging
  Face models take them) are the batch. Loss modules are seen through the loss-module patch.
  These run on every submodule call (~100 per forward in a small transformer), so once every
  watcher has its model they are removed and each model gets the watcher's own forward hooks
  (:func:`_narrow`); an optimizer that appears later puts them back until it has its model;
* the backward patch of :mod:`nanscope.torch._hooks` (the loss).

Scripts that update their parameters by hand (``p.data.add_(p.grad, alpha=-lr)``, ``with
torch.no_grad(): p -= lr * p.grad``), with no ``torch.optim`` optimizer, are watched by
:class:`_ManualUpdates`: at the end of each backward (an autograd engine callback) it compares a
sample of the leaves the loss reached with the sample it kept at the end of the previous backward.
When they changed and no optimizer stepped in between, the script updates by hand: from then on
every backward is an update, checked right after it (the gradient fresh, the weights not yet
changed) by a :class:`~nanscope.torch.watcher.Watcher` on a stand-in optimizer
(:class:`ManualUpdate`).
The first update's loss, batch, gradient and initial weights are read at its own backward
(:mod:`nanscope.torch.first_update`), before the script applies it. The learning rate is read
off the update and the gradient before it, ``lr = -<dw, g> / <g, g>`` on the samples, so each
record carries the lr of the update before it. A script that calls ``clip_grad_norm_`` is
checked right after the clip instead (its update applies the clipped gradient; the recorded norm
is the pre-clip one).
With gradient accumulation by hand, an update is recorded at its first micro-batch (a backward
that follows no change of the weights adds to the update already recorded).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nanscope._meta_path import spec_elsewhere
from nanscope.probes._tensors import loss_before_scale, weighted_inputs
from nanscope.torch import first_update, graph
from nanscope.trace import HAND_WRITTEN_SGD

if TYPE_CHECKING:  # (torch is imported by the script, not by arming the hooks)
    from nanscope.torch.watcher import Watcher

__all__ = ["ManualUpdate", "arm", "backwards_without_step", "disarm", "enable", "enabled",
           "on_watcher", "watchers"]

#: the ``source`` of the runs it watches, in the Monitor's meta
RUN_SOURCE = "torch (nanscope run)"
#: the ``optimizer`` of a loop that updates by hand
MANUAL_OPTIMIZER = HAND_WRITTEN_SGD

_LOCK = threading.Lock()
_ENABLED = False
_FINDER: _TorchImportHook | None = None
_HANDLES: list[Any] = []
#: the global module hooks, while they are on (a subset of _HANDLES' job, removed by _narrow)
_MODULE_HANDLES: list[Any] = []
_WATCHERS: weakref.WeakKeyDictionary[Any, Watcher] = weakref.WeakKeyDictionary()
_STATE = threading.local()
#: one forward of a model before its watcher existed: (args, kwargs, output, the namespace of the
#: user's frame that called it, copied then; None when none was found)
_Forward = tuple[tuple[Any, ...], dict[str, Any], Any, dict[str, Any] | None]
#: outermost modules called since the last optimizer step: id -> (weakref, its forwards, oldest
#: first: the micro-batches of an update with gradient accumulation, at most EARLY_FORWARDS)
_SEEN: dict[int, tuple[Any, list[_Forward]]] = {}
#: the forwards kept per module before its watcher exists (a replay of the first update needs
#: each of its micro-batches; only the last keeps its output, which may hold a large tensor)
EARLY_FORWARDS = 16
#: models bound to a watcher: id(module) -> watchers
_BOUND: dict[int, list[Watcher]] = {}
#: called with each Watcher right after it is made for an optimizer (e.g. by
#: ``nanscope.torch.distributed.arm``); a fault in one warns once and never stops training
on_watcher: list[Callable[[Watcher], None]] = []


def arm() -> None:
    """Enable the global hooks now if torch is imported, else as soon as the script imports it."""
    global _FINDER
    if "torch" in sys.modules:
        enable()
        return
    with _LOCK:
        if _FINDER is None:
            _FINDER = _TorchImportHook()
            sys.meta_path.insert(0, _FINDER)


def disarm() -> None:
    """Remove the import hook and the global hooks (watchers already made keep their monitors)."""
    global _FINDER, _ENABLED
    with _LOCK:
        if _FINDER is not None and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        _FINDER = None
        for handle in _HANDLES + _MODULE_HANDLES:
            with contextlib.suppress(Exception):
                handle.remove()
        _HANDLES.clear()
        _MODULE_HANDLES.clear()
        for watcher in list(_WATCHERS.values()):
            watcher.close()
        _WATCHERS.clear()
        _MANUAL.close()
        # a script that never imported torch never registered them (and _hooks imports torch)
        _hooks = sys.modules.get("nanscope.torch._hooks")
        if _hooks is not None:
            _hooks.unregister(_COLLECTOR)  # (else every backward still walks the graph for them)
            _hooks.unregister(_MANUAL)
            with contextlib.suppress(ValueError):
                _hooks.SCALER_STEP.remove(_scaler_step)
        _SEEN.clear()
        _BOUND.clear()
        _ENABLED = False


def enabled() -> bool:
    return _ENABLED


def backwards_without_step() -> int:
    """How many backward() calls the script made while no optimizer had stepped yet."""
    return _COLLECTOR.unstepped


def watchers() -> list[Watcher]:
    """The watchers created so far (one per optimizer that stepped, one for hand updates)."""
    found = list(_WATCHERS.values())
    if _MANUAL.watcher is not None:
        found.append(_MANUAL.watcher)
    return found


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of ``torch`` to enable the hooks after it ran."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        spec = spec_elsewhere(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            with contextlib.suppress(AttributeError):
                del loader.exec_module  # back to the class's own method
            _remove_finder()
            try:
                enable()
            except Exception as exc:  # never break the user's import
                warnings.warn(
                    f"nanscope: could not enable the PyTorch hooks ({type(exc).__name__}: {exc}). "
                    "Please report this.",
                    RuntimeWarning,
                    stacklevel=2,
                )

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _remove_finder() -> None:
    global _FINDER
    with _LOCK:
        if _FINDER is not None and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        _FINDER = None


def enable() -> None:
    """Install the global optimizer and module hooks (idempotent)."""
    global _ENABLED
    with _LOCK:
        if _ENABLED:
            return
        _ENABLED = True
    from torch.optim import optimizer as optimizer_mod

    import torch
    from nanscope.torch import _hooks

    _hooks.install()
    _hooks.register(_COLLECTOR)
    _hooks.register(_MANUAL)
    if _scaler_step not in _hooks.SCALER_STEP:
        _hooks.SCALER_STEP.append(_scaler_step)
    _HANDLES.append(optimizer_mod.register_optimizer_step_pre_hook(_step_pre))
    _HANDLES.append(optimizer_mod.register_optimizer_step_post_hook(_step_post))
    _widen()
    _patch_compile(torch)
    del torch
    from nanscope.probes.producer import (
        FIRST_UPDATE_WATCH,  # producer: check the ops of the first update
    )

    FIRST_UPDATE_WATCH.start()
    try:  # dataset rows of each batch, when the DataLoader's sampler tells them
        from nanscope.probes import rows

        rows.install()
    except Exception:
        pass


#: the functions this module put in torch's place (a second enable leaves them as they are)
_PATCHED: set[Any] = set()


def _patch_compile(torch: Any) -> None:
    """``model.compile()`` compiles the module's call in place, the global module hooks with it
    (they are skipped while the compiler traces): a module compiled in place is a candidate
    model from then on, as one seen in a forward is (its batch comes with the watcher's own
    hooks, which the compiler keeps references of)."""
    compile_ = getattr(torch.nn.Module, "compile", None)
    if compile_ is None or compile_ in _PATCHED:
        return

    @functools.wraps(compile_)
    def compile_in_place(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _ENABLED and len(_SEEN) <= 32:
            with contextlib.suppress(Exception):
                _SEEN.setdefault(id(self), (weakref.ref(self), []))
        return compile_(self, *args, **kwargs)

    _PATCHED.add(compile_in_place)
    torch.nn.Module.compile = compile_in_place


# ---------------------------------------------------------------------- global hooks


def _widen() -> None:
    """Put the global module hooks on: a watcher is looking for its model."""
    from torch.nn.modules import module as module_mod

    if _MODULE_HANDLES or not _ENABLED:
        return
    _STATE.depth = 0
    _MODULE_HANDLES.append(module_mod.register_module_forward_pre_hook(_forward_pre))
    _MODULE_HANDLES.append(
        module_mod.register_module_forward_hook(_forward_post, with_kwargs=True, always_call=True)
    )


def _narrow() -> None:
    """Every watcher has its model: hook those models alone, not every module call."""
    if not _MODULE_HANDLES:
        return
    watchers = list(_WATCHERS.values())
    if _MANUAL.watcher is not None:
        watchers.append(_MANUAL.watcher)
    elif not _MANUAL.off:
        return  # a loop that updates by hand may still be found: it needs the module calls
    if not watchers or any(w.model is None or w.step < 2 for w in watchers):
        return
    for watcher in watchers:
        watcher.hook_model()
    if not all(w.model_hooked for w in watchers):
        return  # a scripted model takes no hooks of its own: the global ones stay
    if _MANUAL.off:  # (for good: an optimizer steps) its backward and loss hooks have no use
        _hooks_module().unregister(_MANUAL)
    for handle in _MODULE_HANDLES:
        with contextlib.suppress(Exception):
            handle.remove()
    _MODULE_HANDLES.clear()
    _SEEN.clear()


def _hooks_module() -> Any:
    """``nanscope.torch._hooks`` (it imports torch, which this module may not import early)."""
    hooks: Any = sys.modules.get("nanscope.torch._hooks")
    if hooks is None:
        from nanscope.torch import _hooks as hooks
    return hooks


def _guard() -> Any:
    return _hooks_module().GUARD


def _producer_watch() -> Any:
    """The first-update op watch (:mod:`nanscope.probes.producer`)."""
    from nanscope.probes.producer import FIRST_UPDATE_WATCH

    return FIRST_UPDATE_WATCH


def _compiling() -> bool:
    """True while ``torch.compile`` traces (torch is imported once these hooks run)."""
    return bool(_hooks_module().compiling())


def _forward_pre(module: Any, args: Any) -> None:
    # while torch.compile traces a model compiled in place these hooks run inside its graph: a
    # depth that changes per call would recompile it each time (an error under fullgraph=True)
    if _compiling():
        return
    _STATE.depth = getattr(_STATE, "depth", 0) + 1


def _forward_post(module: Any, args: Any, *rest: Any) -> None:
    # (kwargs, output); torch calls an always-called hook with (module, args, None) alone when
    # the forward raised: the depth goes back down and the call is no model's
    if _compiling():
        return
    depth = getattr(_STATE, "depth", 1) - 1
    _STATE.depth = max(depth, 0)
    if depth > 0 or len(rest) != 2 or _hooks_module().aside():
        return  # (a transform's or a checkpoint's call is not the model's forward of the update)
    _guard().run("autowatch forward", _outermost, module, args, rest[0], rest[1],
                 sys._getframe(1))  # fmt: skip


def _outermost(module: Any, args: Any, kwargs: Any, output: Any, caller: Any = None) -> None:
    from torch.nn.modules.loss import _Loss

    if isinstance(module, _Loss):
        return
    bound = _BOUND.get(id(module))
    if bound:
        for watcher in bound:
            if not watcher.model_hooked:  # (its own hooks see this call)
                watcher.on_forward(tuple(args), dict(kwargs or {}), output)
        return
    if len(_SEEN) > 32:
        _SEEN.clear()
    entry = _SEEN.get(id(module))
    forwards = entry[1] if entry is not None and entry[0]() is module else []
    if forwards:
        last = forwards[-1]
        forwards[-1] = (last[0], last[1], None, last[3])  # (only the last keeps its output)
        import torch

        if not torch.is_grad_enabled():
            forwards.clear()  # an evaluation is no micro-batch of an update: the last call alone
    forwards.append((tuple(args), dict(kwargs or {}), output, _scope(caller)))
    del forwards[:-EARLY_FORWARDS]
    _SEEN[id(module)] = (weakref.ref(module), forwards)


def _scope(caller: Any) -> dict[str, Any] | None:
    """A copy of the namespace of the user's frame that called the model (read now: the frame
    moves on before a watcher exists to read it)."""
    from nanscope._frames import user_frame

    frame = user_frame(caller) if caller is not None else None
    return dict(frame.f_locals) if frame is not None else None


class _Collector:
    """Keeps what happens before an optimizer's first step, when no Watcher exists for it yet."""

    def __init__(self) -> None:
        #: backward() calls while no optimizer had stepped yet (a step that never comes: the
        #: weights never change, and ``nanscope run`` says so)
        self.unstepped = 0
        self.reset()

    def reset(self) -> None:
        self.losses: list[tuple[Any, Any, Any]] = []
        self.loss_module: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None
        self.clip: Any = None
        #: with no module called: the data the last loss applied its leaves to (its batch)
        self.inputs: tuple[Any, ...] = ()

    def owns(self, optimizer: Any) -> bool:
        return False

    def close(self) -> None:
        self.reset()

    def on_backward(self, tensor: Any, site: Any) -> None:
        # inside a step (a closure's evaluations) the step's own Watcher sees the backward; a
        # loss kept here would keep its graph alive, 20 of them per LBFGS step
        if getattr(_STATE, "stepping", None) is None:
            self.unstepped += 1
            if len(self.losses) < 64:  # (before the scale: its graph is freed by the backward)
                self.losses.append((tensor, site, loss_before_scale(tensor)))
                grad_fn = getattr(tensor, "grad_fn", None)
                if not _SEEN and grad_fn is not None:  # no model: read before the backward
                    self.inputs = weighted_inputs(grad_fn, graph.leaves(grad_fn))

    def on_loss_module(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.loss_module = (module, args, kwargs)

    def on_clip(self, total: Any) -> None:
        self.clip = total

    def scaler_step_begin(self, scaler: Any) -> None:
        pass  # (it owns no optimizer: never called)

    def scaler_step_end(self, scaler: Any) -> None:
        pass

    def hand_over(self, watcher: Watcher) -> None:
        if watcher.model is None and self.inputs:
            # weights on bare tensors: their scale now, before the first step, is the initial
            scale = first_update.initial_weight_scale(watcher.params(), self.inputs)
            if scale:
                watcher.monitor.evidence["initial_weight_scale"] = scale
            watcher.on_forward(self.inputs, {})
        for tensor, site, value in self.losses:
            watcher.on_backward(tensor, site, value)
        if self.loss_module is not None:
            watcher.on_loss_module(*self.loss_module)
        if self.clip is not None:
            watcher.on_clip(self.clip)


_COLLECTOR = _Collector()


def _step_pre(optimizer: Any, args: Any, kwargs: Any) -> Any:
    _MANUAL.optimizer_stepped = True
    _STATE.stepping = optimizer
    watcher = _WATCHERS.get(optimizer)
    if watcher is None or watcher.model is None:  # (every step while it has no model yet)
        watcher = _guard().run("autowatch step", _watcher_for, optimizer)
        for _, forwards in _SEEN.values():
            del forwards[:-1]  # the next update's micro-batches start after this step
    _COLLECTOR.reset()
    if watcher is None:
        return None
    return watcher.step_pre(optimizer, args, kwargs)


def _scaler_step(optimizer: Any) -> None:
    """``scaler.step(optimizer)`` is about to run: the optimizer gets its watcher now, so that a
    step the scaler skips is recorded even when the optimizer has never stepped yet."""
    if not _ENABLED:
        return
    watcher = _WATCHERS.get(optimizer)
    if watcher is None or watcher.model is None:
        _MANUAL.optimizer_stepped = True
        _watcher_for(optimizer)
        for _, forwards in _SEEN.values():
            del forwards[:-1]
        _COLLECTOR.reset()  # (handed over: the step that follows may be skipped)


def _step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
    _STATE.stepping = None
    watcher = _WATCHERS.get(optimizer)
    if watcher is not None:
        watcher.step_post(optimizer, args, kwargs)
        if _MODULE_HANDLES:
            _guard().run("autowatch narrow", _narrow)


def _watcher_for(optimizer: Any) -> Watcher | None:
    watcher = _WATCHERS.get(optimizer)
    if watcher is not None:
        if watcher.model is None:
            _bind(watcher)
            _widen()  # (after a narrowing: the next forward names the model)
        return watcher
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and inner is not optimizer and hasattr(inner, "param_groups"):
        return None  # a wrapper (accelerate, Lightning): the inner optimizer is the one watched
    from nanscope.torch import _hooks
    from nanscope.torch.watcher import Watcher

    for live in _hooks.live_watchers():
        if isinstance(live, Watcher) and live.owns(optimizer) and not live.closed:
            _MANUAL.off = True  # an optimizer steps: not a loop that updates by hand
            return None  # the script watches it itself (nanscope.watch): one watcher, its own

    watcher = Watcher(None, optimizer, hook_optimizer=False, meta={"source": RUN_SOURCE})
    _WATCHERS[optimizer] = watcher
    _bind(watcher)
    if watcher.model is None:
        watcher.graph_inputs = True  # (until a model is found: then its forward gives the batch)
        _widen()
    _COLLECTOR.hand_over(watcher)
    for callback in list(on_watcher):
        _guard().run("autowatch on_watcher", callback, watcher)
    return watcher


def _bind(watcher: Watcher) -> None:
    """Pick the model: the outermost module seen whose parameters the optimizer holds most of."""
    ids = {id(p) for p in watcher.params()}
    best: tuple[int, Any, list[_Forward]] | None = None
    for ref, forwards in list(_SEEN.values()):
        module = ref()
        if module is None:
            continue
        try:
            overlap = sum(1 for p in module.parameters() if id(p) in ids)
        except Exception:
            continue
        if overlap and (best is None or overlap > best[0]):
            best = (overlap, module, forwards)
    if best is None:
        return
    _, module, forwards = best
    watcher.bind_model(module, hook=False)
    for args, kwargs, output, scope in forwards or [((), {}, None, None)]:
        watcher.on_forward(args, kwargs, output, scope=scope)  # (each micro-batch, in order)
    _BOUND.setdefault(id(module), []).append(watcher)
    _SEEN.pop(id(module), None)


# ---------------------------------------------------------------------- updates by hand


class ManualUpdate:
    """Stands in for an optimizer when a script changes its parameters by hand. It holds no
    state (what a hand-written update keeps, a velocity, is the script's): the replay saves and
    loads the learning rate it read, and starts each replayed update from zero gradients."""

    #: the update is the script's own code (the replay scales what it applied: :mod:`replay`)
    by_hand = True

    def __init__(self, params: list[Any]) -> None:
        self.param_groups: list[dict[str, Any]] = [{"params": params, "lr": None}]

    def set_lr(self, lr: float | None) -> None:
        """The learning rate read off the update (what the next record carries)."""
        self.param_groups[0]["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        return {"state": {}, "param_groups": [{"lr": g["lr"]} for g in self.param_groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for group, saved in zip(self.param_groups, state.get("param_groups") or []):
            group["lr"] = saved.get("lr")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero gradients, never None: a hand-written loop zeroes ``p.grad`` in place itself."""
        import torch

        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    else:
                        p.grad.zero_()


class _ManualUpdates:
    """Finds and watches parameter updates made without ``torch.optim`` (see the module doc)."""

    #: elements per parameter compared between backward calls and used to read the lr
    SAMPLE = 4096
    #: backward calls with no hand-made update seen (and no optimizer) before it stops looking
    GIVE_UP = 16

    def __init__(self) -> None:
        self.optimizer_stepped = False
        self.watcher: Watcher | None = None
        self._optimizer: ManualUpdate | None = None
        self.off = False
        self._params: list[Any] = []
        self._weights: list[Any] | None = None
        self._grads: list[Any] | None = None
        self._loss: Any = None
        self._site: Any = None
        #: the data the loss applied the weights to (no model is called: this is the batch)
        self._inputs: tuple[Any, ...] = ()
        self._backwards = 0
        self._first: float | None = None
        #: update 1's record beyond its loss, and its initial weights' scale (first_update)
        self._first_record: dict[str, Any] = {}
        self._initial_scale: dict[str, Any] = {}
        self._lr: float | None = None
        self.clips = False
        self._pending = False
        #: update 1's weights, RNG state, caller's namespace and batch, kept at its backward
        #: (loops that called no model) for the replay's first snapshot
        self._before: tuple[list[Any], Any, dict[str, Any], tuple[Any, ...]] | None = None

    # the hooks of nanscope.torch._hooks call these on every live object
    def owns(self, optimizer: Any) -> bool:
        return False

    def scaler_step_begin(self, scaler: Any) -> None:
        pass  # (it owns no optimizer: never called)

    def scaler_step_end(self, scaler: Any) -> None:
        pass

    def on_loss_module(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.watcher is not None and not self.off and not _WATCHERS:
            self.watcher.on_loss_module(module, args, kwargs)  # (its targets)

    def on_clip(self, total: Any) -> None:
        """The script clips: its update uses the clipped gradient, so the check waits for it."""
        self.clips = True
        if self.off or _WATCHERS:
            return
        if self.watcher is None:
            self._grads = self._grad_sample()
        elif self._pending:
            self._pending = False
            self.watcher.on_clip(total)  # the pre-clip norm, whatever order the hooks run in
            self._check()

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
        self.__init__()  # type: ignore[misc]

    def on_backward(self, tensor: Any, site: Any) -> None:
        if self.off or _WATCHERS:
            self.off = self.off or bool(_WATCHERS)  # torch.optim steps: not a hand-made loop
            self._loss = None  # nor its graph
            self._before = None  # nor update 1's copied weights and namespace
            return
        grad_fn = getattr(tensor, "grad_fn", None)
        if grad_fn is None:
            return
        if self.watcher is None:
            leaves = graph.leaves(grad_fn)
            if not leaves:
                return
            if [id(p) for p in leaves] != [id(p) for p in self._params]:
                self._params, self._weights, self._grads = leaves, None, None
        self._loss, self._site = tensor, site
        # read before the backward frees what the graph saved
        self._inputs = weighted_inputs(grad_fn, self._params)
        grad_fn.register_prehook(self._queue)

    def _queue(self, grad_outputs: Any) -> None:
        from torch.autograd import Variable

        Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        _guard().run("manual updates", self._observe)
        self._loss = None  # read: its graph is not kept past its backward

    def _observe(self) -> None:
        import torch

        if self.off or _WATCHERS:
            return
        if any(_unreadable(p) for p in self._params):
            # FSDP's gathered parameters are freed after backward, DTensors need collectives to
            # read: a sharded run updates through torch.optim, not by hand
            self.off = True
            return
        self._backwards += 1
        with torch.no_grad():
            weights = [p.detach().reshape(-1)[: self.SAMPLE].clone() for p in self._params]
        previous, self._weights = self._weights, weights
        stepped, self.optimizer_stepped = self.optimizer_stepped, False
        changed = previous is not None and any(
            not torch.equal(a, b) for a, b in zip(previous, weights)
        )
        if self.watcher is not None and not changed:
            # the weights did not move since the last backward: another micro-batch of the same
            # update (gradient accumulation), already recorded with its first micro-batch
            self._weights = previous
            return
        self._pending = False
        if self.watcher is None:
            if stepped or not changed:
                if self._backwards >= self.GIVE_UP:
                    self.off = True  # backward calls that never change the weights: not ours
                bare = not _SEEN  # no model called: its first update is read here or nowhere
                if self._first is None:
                    self._first = _loss_value(self._loss)  # update 1, its first micro-batch
                    if bare:
                        self._first_record = {**first_update.batch_record(self._inputs),
                                              **first_update.weight_record(self._params)}
                        self._initial_scale = first_update.initial_weight_scale(
                            self._params, self._inputs)
                        self._before = first_update.state_before(self._params, self._inputs)
                if bare:  # the gradient so far: its last micro-batch's is what update 1 applies
                    self._first_record.update(first_update.gradient_record(self._params))
                self._grads = self._grad_sample()
                return
            self._start()
        self._lr = _read_lr(previous, self._grads, weights)
        if self.clips:
            self._pending = True  # checked once clip_grad_norm_ has clipped this gradient
            return
        self._check()

    def _grad_sample(self) -> list[Any]:
        import torch

        with torch.no_grad():
            return [
                None if p.grad is None else p.grad.detach().reshape(-1)[: self.SAMPLE].clone()
                for p in self._params
            ]

    def _check(self) -> None:
        self._grads = self._grad_sample()  # the gradient this update applies
        watcher, optimizer = self.watcher, self._optimizer
        assert watcher is not None and optimizer is not None
        optimizer.set_lr(self._lr)
        if self._inputs:
            watcher.on_forward(self._inputs, {})  # the batch of this update, for the measures
        watcher.check()
        if _MODULE_HANDLES:
            _guard().run("autowatch narrow", _narrow)

    def _start(self) -> None:
        from nanscope.torch.watcher import Watcher

        optimizer = self._optimizer = ManualUpdate(list(self._params))
        watcher = Watcher(None, optimizer, hook_optimizer=False,
                          meta={"source": RUN_SOURCE, "optimizer": MANUAL_OPTIMIZER})  # fmt: skip
        self.watcher = watcher
        _bind(watcher)
        for callback in list(on_watcher):
            _guard().run("autowatch on_watcher", callback, watcher)
        # the update before this one: its loss is known, its gradient is gone
        # (every backward before the weights first changed belonged to that first update)
        if self._initial_scale:
            watcher.monitor.evidence["initial_weight_scale"] = self._initial_scale
        if self._before is not None:
            before, self._before = self._before, None
            _guard().run("manual updates history", watcher.history.begin_by_hand, *before)
        _guard().run("first-update watch", _producer_watch().end_by_hand)
        watcher.first_update(self._first, self._first_record)
        watcher.on_backward(self._loss, self._site)  # it registered after this backward began


def _unreadable(p: Any) -> bool:
    """A leaf whose values cannot be read here: a DTensor, or one whose storage was freed."""
    if type(p).__name__ == "DTensor":
        return True
    try:
        return p.numel() > 0 and p.untyped_storage().size() == 0
    except Exception:
        return True


def _loss_value(loss: Any) -> float | None:
    try:
        return float(loss.detach().float())
    except Exception:
        return None


def _read_lr(weights: Any, grads: Any, now: list[Any]) -> float | None:
    """``-<w_now - w_before, g_before> / <g_before, g_before>`` over the samples, when positive."""
    if weights is None or grads is None:
        return None
    num = den = 0.0
    for before, g, after in zip(weights, grads, now):
        if g is None or before.shape != after.shape:
            continue
        g = g.double()
        num -= float(((after.double() - before.double()) * g).sum())
        den += float((g * g).sum())
    if not den > 0:
        return None
    lr = num / den
    return lr if lr > 0 and lr == lr and lr != float("inf") else None


_MANUAL = _ManualUpdates()
