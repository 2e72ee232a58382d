"""Watch every optimizer a script creates, with no change to the script (``nanscope run``).

:func:`arm` is called by ``nanscope run`` before the script starts:

* if torch is already imported, the global hooks are enabled now;
* otherwise a ``sys.meta_path`` finder waits for the script's own ``import torch`` and enables them
  right after torch finished importing. A script that never imports torch never imports it.

The global hooks (all guarded: a fault inside nanscope warns once and switches that hook off):

* ``torch.optim.optimizer.register_optimizer_step_pre_hook`` / post hook: the first step of any
  optimizer creates its :class:`~nanscope.torch.watch.Watcher` (and Monitor), so optimizers created
  inside ``Trainer.fit`` (Lightning) or ``Trainer.train`` (Hugging Face) are found too;
* ``register_module_forward_pre_hook`` / ``register_module_forward_hook`` (``with_kwargs``,
  ``always_call``) track the call depth: the outermost module called between two steps whose
  parameters the optimizer holds is the model; its arguments (also keyword arguments, as Hugging
  Face models take them) are the batch. Loss modules are seen through the loss-module patch;
* the backward patch of :mod:`nanscope.torch._hooks` (the loss).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["arm", "disarm", "enable", "enabled", "on_watcher", "watchers"]

_LOCK = threading.Lock()
_ENABLED = False
_FINDER: _TorchImportHook | None = None
_HANDLES: list[Any] = []
_WATCHERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_STATE = threading.local()
#: outermost modules called since the last optimizer step: id -> (weakref, args, kwargs, output)
_SEEN: dict[int, tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = {}
#: models bound to a watcher: id(module) -> watchers
_BOUND: dict[int, list[Any]] = {}
#: called with each Watcher right after it is made for an optimizer (e.g. by
#: ``nanscope.torch.distributed.arm``); a fault in one warns once and never stops training
on_watcher: list[Callable[[Any], None]] = []


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
        for handle in _HANDLES:
            with contextlib.suppress(Exception):
                handle.remove()
        _HANDLES.clear()
        for watcher in list(_WATCHERS.values()):
            watcher.close()
        _WATCHERS.clear()
        _SEEN.clear()
        _BOUND.clear()
        _ENABLED = False


def enabled() -> bool:
    return _ENABLED


def watchers() -> list[Any]:
    """The watchers created so far (one per optimizer that stepped)."""
    return list(_WATCHERS.values())


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of ``torch`` to enable the hooks after it ran."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
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
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optimizer_mod

    import torch
    from nanscope.torch import _hooks

    _hooks.install()
    _hooks.register(_COLLECTOR)
    _HANDLES.append(optimizer_mod.register_optimizer_step_pre_hook(_step_pre))
    _HANDLES.append(optimizer_mod.register_optimizer_step_post_hook(_step_post))
    _HANDLES.append(module_mod.register_module_forward_pre_hook(_forward_pre))
    _HANDLES.append(
        module_mod.register_module_forward_hook(_forward_post, with_kwargs=True, always_call=True)
    )
    del torch
    from nanscope.probes.producer import LIVE  # producer: check the ops of the first update

    LIVE.start()
    try:  # dataset rows of each batch, when the DataLoader's sampler tells them
        from nanscope.probes import rows

        rows.install()
    except Exception:
        pass


# ---------------------------------------------------------------------- global hooks


def _guard() -> Any:
    from nanscope.torch._hooks import GUARD

    return GUARD


def _forward_pre(module: Any, args: Any) -> None:
    _STATE.depth = getattr(_STATE, "depth", 0) + 1


def _forward_post(module: Any, args: Any, kwargs: Any, output: Any) -> None:
    depth = getattr(_STATE, "depth", 1) - 1
    _STATE.depth = max(depth, 0)
    if depth > 0:
        return
    _guard().run("autowatch forward", _outermost, module, args, kwargs, output)


def _outermost(module: Any, args: Any, kwargs: Any, output: Any) -> None:
    from torch.nn.modules.loss import _Loss

    if isinstance(module, _Loss):
        return
    bound = _BOUND.get(id(module))
    if bound:
        for watcher in bound:
            watcher.on_forward(tuple(args), dict(kwargs or {}), output)
        return
    if len(_SEEN) > 32:
        _SEEN.clear()
    _SEEN[id(module)] = (weakref.ref(module), tuple(args), dict(kwargs or {}), output)


class _Collector:
    """Keeps what happens before an optimizer's first step, when no Watcher exists for it yet."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.losses: list[tuple[Any, Any]] = []
        self.loss_module: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None
        self.clip: Any = None

    def owns(self, optimizer: Any) -> bool:
        return False

    def close(self) -> None:
        self.reset()

    def on_backward(self, tensor: Any, site: Any) -> None:
        if len(self.losses) < 64:
            self.losses.append((tensor, site))

    def on_loss_module(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.loss_module = (module, args, kwargs)

    def on_clip(self, total: Any) -> None:
        self.clip = total

    def hand_over(self, watcher: Any) -> None:
        for tensor, site in self.losses:
            watcher.on_backward(tensor, site)
        if self.loss_module is not None:
            watcher.on_loss_module(*self.loss_module)
        if self.clip is not None:
            watcher.on_clip(self.clip)


_COLLECTOR = _Collector()


def _step_pre(optimizer: Any, args: Any, kwargs: Any) -> Any:
    watcher = _guard().run("autowatch step", _watcher_for, optimizer)
    _COLLECTOR.reset()
    if watcher is None:
        return None
    return watcher.step_pre(optimizer, args, kwargs)


def _step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
    watcher = _WATCHERS.get(optimizer)
    if watcher is not None:
        watcher.step_post(optimizer, args, kwargs)


def _watcher_for(optimizer: Any) -> Any:
    watcher = _WATCHERS.get(optimizer)
    if watcher is not None:
        if watcher.model is None:
            _bind(watcher)
        return watcher
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and inner is not optimizer and hasattr(inner, "param_groups"):
        return None  # a wrapper (accelerate, Lightning): the inner optimizer is the one watched
    from nanscope.torch.watch import Watcher

    watcher = Watcher(None, optimizer, hook_optimizer=False)
    watcher.monitor.meta["source"] = "torch (nanscope run)"
    _WATCHERS[optimizer] = watcher
    _bind(watcher)
    _COLLECTOR.hand_over(watcher)
    for callback in list(on_watcher):
        _guard().run("autowatch on_watcher", callback, watcher)
    return watcher


def _bind(watcher: Any) -> None:
    """Pick the model: the outermost module seen whose parameters the optimizer holds most of."""
    ids = {id(p) for p in watcher.params()}
    best: tuple[int, Any, tuple[Any, ...], dict[str, Any], Any] | None = None
    for ref, args, kwargs, output in list(_SEEN.values()):
        module = ref()
        if module is None:
            continue
        try:
            overlap = sum(1 for p in module.parameters() if id(p) in ids)
        except Exception:
            continue
        if overlap and (best is None or overlap > best[0]):
            best = (overlap, module, args, kwargs, output)
    if best is None:
        return
    _, module, args, kwargs, output = best
    watcher.bind_model(module, hook=False)
    watcher.on_forward(args, kwargs, output)
    _BOUND.setdefault(id(module), []).append(watcher)
    _SEEN.pop(id(module), None)
