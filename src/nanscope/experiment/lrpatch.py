"""Scale every optimizer's learning rate at construction, in the sweep's child process.

Two ways a fit takes the factor of a sweep:

* **PyTorch**: :func:`install` puts a post-import hook on ``sys.meta_path``. When (and only
  when) the script imports ``torch``, the hook wraps ``torch.optim.Optimizer.__init__`` and
  ``add_param_group`` so that the default ``lr`` and every explicit per-group ``lr`` are multiplied
  by the factor (and so is every lr the script's own code writes into a param group later, as
  loops with a hand-written warm-up/cosine schedule do before each step; a torch or library
  scheduler derives its lr from the scaled one and is left alone: :class:`ScaledGroup`),
  registers a global optimizer step post hook (that is how the child counts updates),
  captures the scalar loss each ``backward()`` is called on, and seeds torch. A numpy-only script
  never imports torch.
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

__all__ = ["ENV_FACTOR", "ScaledGroup", "install", "lr_factor", "scale_lr"]

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


def _written_by_library(filename: str) -> bool:
    return (
        filename.startswith(_LIBRARY_DIRS)
        or "site-packages" in filename
        or "dist-packages" in filename
        or filename.startswith("<frozen")
    )


_LIBRARY_DIRS: tuple[str, ...] = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)


class ScaledGroup(dict):  # type: ignore[type-arg]
    """An optimizer param group whose ``lr``, when the script's own code assigns it, is scaled.

    The script's code writes the learning rate of its schedule (nanoGPT-style loops call
    ``param_group["lr"] = get_lr(it)`` before every step): that value is the unscaled one and
    takes the factor. A scheduler in torch or another library computes its lr from the lr the
    group already holds (scaled at construction), so its writes are kept as they are.
    """

    def __init__(self, group: dict[str, Any], factor: float) -> None:
        super().__init__(group)
        self._factor = factor
        #: how many lr assignments from the script's own code were scaled
        self.scaled_writes = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        if key == "lr" and not _written_by_library(sys._getframe(1).f_code.co_filename):
            value = scale_lr(value, self._factor)
            self.scaled_writes += 1
        super().__setitem__(key, value)

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled / deep-copied as a plain dict
        return (dict, (dict(self),))


class TorchEvents:
    """What the patched torch reports to the child harness (callbacks, set by the child)."""

    def __init__(self) -> None:
        self.on_optimizer: Callable[[Any, Any], None] | None = None
        self.on_step: Callable[[Any], None] | None = None
        self.on_backward: Callable[[float], None] | None = None


def _patch_torch(torch: ModuleType, factor: float, seed: int | None, events: TorchEvents) -> None:
    optim_mod = importlib.import_module("torch.optim.optimizer")
    optimizer_cls = optim_mod.Optimizer
    if getattr(optimizer_cls, "_nanscope_patched", False):
        return
    original_init = optimizer_cls.__init__
    original_add = optimizer_cls.add_param_group

    def __init__(self: Any, params: Any, defaults: Any, *args: Any, **kwargs: Any) -> None:
        base = None
        if isinstance(defaults, dict) and "lr" in defaults:
            base = defaults["lr"]
            defaults = dict(defaults)
            defaults["lr"] = scale_lr(defaults["lr"], factor)
        original_init(self, params, defaults, *args, **kwargs)
        if events.on_optimizer is not None:
            events.on_optimizer(self, base)

    def add_param_group(self: Any, param_group: Any) -> None:
        if isinstance(param_group, dict) and "lr" in param_group:
            param_group = dict(param_group)
            param_group["lr"] = scale_lr(param_group["lr"], factor)
        original_add(self, param_group)
        groups = getattr(self, "param_groups", None)
        if groups and type(groups[-1]) is dict:
            # a script that sets the lr itself every step (a warm-up/cosine loop writing
            # param_group["lr"] = get_lr(it)) would undo the scaling done here
            groups[-1] = ScaledGroup(groups[-1], factor)

    optimizer_cls.__init__ = __init__
    optimizer_cls.add_param_group = add_param_group
    optimizer_cls._nanscope_patched = True

    def step_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        if events.on_step is not None:
            events.on_step(optimizer)

    optim_mod.register_optimizer_step_post_hook(step_hook)

    autograd = torch.autograd
    original_backward = autograd.backward

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if events.on_backward is not None:
            try:
                if hasattr(tensors, "numel") and tensors.numel() == 1:
                    events.on_backward(float(tensors.detach().reshape(()).item()))
            except Exception:
                pass
        return original_backward(tensors, *args, **kwargs)

    autograd.backward = backward
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
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy = False
        if spec.loader is None:
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
