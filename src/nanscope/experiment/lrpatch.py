"""Scale every optimizer's learning rate at construction, in the sweep's child process.

Two ways a fit takes the factor of a sweep:

* **PyTorch**: :func:`install` puts a post-import hook on ``sys.meta_path``. When (and only
  when) the script imports ``torch``, the hook wraps ``torch.optim.Optimizer.__init__`` (to
  learn the base lr), registers global optimizer step pre and post hooks that multiply every
  group's ``lr`` by the
  factor for the step and put it back after it (so the lr a script writes into
  ``param_group["lr"]`` from its own schedule every update is cut too; the post hook is also how
  the child counts updates),
  captures the scalar loss each ``backward()`` is called on, and seeds torch. A numpy-only script
  never imports torch.
* **PyTorch without torch.optim** (``p.data.add_(p.grad, alpha=-lr)``, ``p -= lr * p.grad`` under
  ``no_grad``): there is no lr to patch, so :class:`_ManualScale` scales what the script's update
  reads instead. After each ``backward()`` the gradient that backward added to every parameter
  it reached (and no torch optimizer holds) is multiplied by the factor, and
  ``clip_grad_norm_`` clips the unscaled gradient (it is unscaled for the call, scaled again
  after), so the script's own update moves the weights by factor x what it would have: the lr
  cut, exactly, for any update linear in the gradient (SGD, momentum, clipped SGD), and no cut at
  all for one that normalises it (a hand-written Adam). An update is the parameters changing
  between two ``backward()`` calls; the lr the script applies is read off the change and the
  gradient (``-<dw, g> / <g, g>``), so the child reports what the cut really was.
* **Anything else**: the child sets ``NANSCOPE_LR_FACTOR``; the fit multiplies its own learning
  rate by :func:`lr_factor` (``1.0`` outside a sweep): ``lr = 0.5 * experiment.lr_factor()``.

Nothing here is imported by ``import nanscope``; :func:`install` is only ever called by the child.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import math
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from nanscope._meta_path import spec_elsewhere

__all__ = ["ENV_FACTOR", "install", "lr_factor", "scale_lr"]

#: the environment variable the sweep's child sets to the factor of its run
ENV_FACTOR = "NANSCOPE_LR_FACTOR"

#: set when the running fit read :func:`lr_factor` (the child reports it)
_FACTOR_READ = False


def lr_factor() -> float:
    """The learning-rate factor of the sweep this process runs under (``1.0`` when none).

    A framework-free fit multiplies its learning rate by it, which is all it takes to be swept by
    ``nanscope sweep``; PyTorch optimizers are scaled automatically and need no change.
    """
    global _FACTOR_READ
    _FACTOR_READ = True
    text = os.environ.get(ENV_FACTOR)
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        return 1.0
    return value if math.isfinite(value) and value > 0 else 1.0


def factor_was_read() -> bool:
    return _FACTOR_READ


def scale_lr(lr: Any, factor: float) -> Any:
    """``lr * factor`` for a float or a tensor lr; anything else is returned unchanged."""
    if isinstance(lr, bool):
        return lr
    try:
        return lr * factor
    except TypeError:
        return lr


class TorchEvents:
    """What the patched torch reports to the child harness (callbacks, set by the child)."""

    def __init__(self) -> None:
        self.on_optimizer: Callable[[Any, Any], None] | None = None
        self.on_step: Callable[[Any], None] | None = None
        self.on_backward: Callable[[float], None] | None = None
        #: a hand-made update happened (its lr as read off the change, before the factor)
        self.on_manual_update: Callable[[float | None], None] | None = None
        #: True while an optimizer's ``step`` runs (a backward then is a closure evaluation)
        self.in_step = False


class _ManualScale:
    """Scales, by the factor, each gradient a ``backward()`` adds to parameters no torch optimizer
    holds, and counts the hand-made updates (see the module doc)."""

    #: elements per parameter compared between backward calls to see an update
    SAMPLE = 4096

    def __init__(self, factor: float, events: TorchEvents) -> None:
        self.factor = factor
        self.events = events
        self.owned: set[int] = set()  # ids of parameters some torch optimizer holds
        self.params: list[Any] = []
        self._sample: list[Any] | None = None  # weights after the last backward
        self._grads: list[Any] | None = None  # the gradients (unscaled) of the last backward
        self.scaled: set[int] = set()  # parameters whose .grad is scaled right now
        self.updates = 0
        self._looked = False

    def add_optimizer(self, optimizer: Any) -> None:
        for group in getattr(optimizer, "param_groups", []):
            self.owned.update(id(p) for p in group.get("params", []))
        self.params = [p for p in self.params if id(p) not in self.owned]

    def before(self, tensor: Any) -> list[Any]:
        """At a backward call: see whether the weights moved since the last one (an update),
        and keep the gradients it will add to."""
        import torch

        grad_fn = getattr(tensor, "grad_fn", None)
        if grad_fn is None:
            return []
        if not self._looked:
            from nanscope.torch.graph import leaves

            self._looked = True
            self.params = [p for p in leaves(grad_fn) if id(p) not in self.owned]
        with torch.no_grad():
            now = [p.detach().reshape(-1)[: self.SAMPLE].clone() for p in self.params]
            if self._sample is not None and any(
                a.shape != b.shape or not torch.equal(a, b) for a, b in zip(self._sample, now)
            ):
                self.updates += 1
                if self.events.on_manual_update is not None:
                    self.events.on_manual_update(self._lr(now))
            self._sample = None
            return [None if p.grad is None else p.grad.detach().clone() for p in self.params]

    def after(self, before: list[Any]) -> None:
        """After the backward: scale what it added, ``g = g_before + factor * (g - g_before)``."""
        import torch

        if not self.params:
            return
        with torch.no_grad():
            grads: list[Any] = []
            for p, old in zip(self.params, before):
                if p.grad is None:
                    grads.append(None)
                    continue
                if self.factor != 1.0:
                    p.grad.mul_(self.factor)
                    if old is not None:
                        p.grad.add_(old, alpha=1.0 - self.factor)
                    self.scaled.add(id(p))
                grads.append(p.grad.detach().reshape(-1)[: self.SAMPLE].clone() / self.factor)
            self._grads = grads
            self._sample = [p.detach().reshape(-1)[: self.SAMPLE].clone() for p in self.params]

    def _lr(self, now: list[Any]) -> float | None:
        """``-<w_now - w_before, g> / <g, g>`` with the unscaled gradient: the lr the update
        applied (the script's lr times the factor for an update linear in the gradient)."""
        if self._sample is None or self._grads is None:
            return None
        num = den = 0.0
        for before, g, after in zip(self._sample, self._grads, now):
            if g is None or before.shape != after.shape:
                continue
            g = g.double()
            num -= float(((after.double() - before.double()) * g).sum())
            den += float((g * g).sum())
        value = num / den if den > 0 else math.nan
        return value if math.isfinite(value) and value > 0 else None

    def clip(self, original: Callable[..., Any], parameters: Any, *args: Any, **kw: Any) -> Any:
        """``clip_grad_norm_`` on the unscaled gradients, scaled again after: clip, then cut."""
        import torch

        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        mine = [p for p in params if id(p) in self.scaled and p.grad is not None]
        if not mine or self.factor == 1.0:
            return original(params, *args, **kw)
        with torch.no_grad():
            for p in mine:
                p.grad.div_(self.factor)  # type: ignore[union-attr]
        try:
            return original(params, *args, **kw)
        finally:
            with torch.no_grad():
                for p in mine:
                    p.grad.mul_(self.factor)  # type: ignore[union-attr]


def _patch_torch(torch: ModuleType, factor: float, seed: int | None, events: TorchEvents) -> None:
    optim_mod = importlib.import_module("torch.optim.optimizer")
    optimizer_cls = optim_mod.Optimizer
    if getattr(optimizer_cls, "_nanscope_patched", False):
        return
    original_init = optimizer_cls.__init__

    def __init__(self: Any, params: Any, defaults: Any, *args: Any, **kwargs: Any) -> None:
        base = defaults.get("lr") if isinstance(defaults, dict) else None
        original_init(self, params, defaults, *args, **kwargs)
        manual.add_optimizer(self)
        if events.on_optimizer is not None:
            events.on_optimizer(self, base)

    manual = _ManualScale(factor, events)
    optimizer_cls.__init__ = __init__
    optimizer_cls._nanscope_patched = True

    # the lr is scaled for the step itself and put back after it: a script that writes its own
    # schedule into param_group["lr"] every update (nanoGPT's warm-up and cosine decay), or a
    # torch scheduler reading the lr it set, still steps at factor x its lr
    saved: dict[int, list[Any]] = {}

    def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        events.in_step = True
        if factor == 1.0:
            return
        groups = optimizer.param_groups
        saved[id(optimizer)] = [g.get("lr") for g in groups]
        for group in groups:
            if "lr" in group:
                group["lr"] = scale_lr(group["lr"], factor)

    def step_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        events.in_step = False
        lrs = saved.pop(id(optimizer), None)
        if lrs is not None:
            for group, lr in zip(optimizer.param_groups, lrs):
                if lr is not None:
                    group["lr"] = lr
        if events.on_step is not None:
            events.on_step(optimizer)

    optim_mod.register_optimizer_step_pre_hook(pre_hook)
    optim_mod.register_optimizer_step_post_hook(step_hook)

    autograd = torch.autograd
    original_backward = autograd.backward

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        kept: list[Any] = []
        try:
            kept = manual.before(tensors)
        except Exception as exc:  # never break the user's backward
            print(f"nanscope sweep: cannot watch hand-made updates ({exc})", file=sys.stderr)
        if events.on_backward is not None:
            try:
                if hasattr(tensors, "numel") and tensors.numel() == 1:
                    events.on_backward(float(tensors.detach().reshape(()).item()))
            except Exception:
                pass
        out = original_backward(tensors, *args, **kwargs)
        if kept:
            manual.after(kept)
        return out

    autograd.backward = backward
    import torch.nn.utils as nn_utils
    import torch.nn.utils.clip_grad as clip_mod

    original_clip = nn_utils.clip_grad_norm_

    def clip_grad_norm_(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        return manual.clip(original_clip, parameters, *args, **kwargs)

    nn_utils.clip_grad_norm_ = clip_grad_norm_
    if getattr(clip_mod, "clip_grad_norm_", None) is original_clip:
        clip_mod.clip_grad_norm_ = clip_grad_norm_  # type: ignore[assignment]
    if seed is not None:
        torch.manual_seed(seed)


class _PostImportLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _TorchHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of ``torch`` so that a callback runs after it."""

    def __init__(self, after: Callable[[ModuleType], None]) -> None:
        self._after = after
        self._busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = spec_elsewhere(self, fullname, path, target)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PostImportLoader(spec.loader, self._after)
        return spec


def install(
    factor: float, *, seed: int | None = 0, events: TorchEvents | None = None
) -> TorchEvents:
    """Scale optimizers by ``factor`` from now on in this process (the sweep's child calls it).

    If torch is already imported it is patched at once; otherwise when it gets imported.
    """
    os.environ[ENV_FACTOR] = repr(float(factor))
    events = events or TorchEvents()

    def after(module: ModuleType) -> None:
        try:
            _patch_torch(module, factor, seed, events)
        except Exception as exc:  # never break the user's import of torch
            print(f"nanscope sweep: cannot patch torch optimizers ({exc})", file=sys.stderr)

    if "torch" in sys.modules:
        after(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchHook(after))
    return events
