"""nanscope.integrations: thin callbacks for the trainers people use.

::

    from nanscope.integrations.lightning import NanscopeCallback      # lightning.pytorch
    from nanscope.integrations.transformers import NanscopeCallback   # transformers.Trainer
    from nanscope.integrations.keras import NanscopeCallback          # keras 3, any backend

Each callback turns its framework's hooks into records for one :class:`nanscope.Monitor`, which
runs the detectors, writes ``trace.jsonl`` and ``diagnosis.json`` and raises
:class:`nanscope.DivergenceError`. Importing this package imports no framework: each submodule
imports its own when it is first used (``nanscope.integrations.LightningCallback`` and friends are
loaded lazily too). See ``docs/integrations/``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nanscope.capture import keys
from nanscope.monitor import Monitor

if TYPE_CHECKING:
    from nanscope.integrations.keras import NanscopeCallback as KerasCallback
    from nanscope.integrations.lightning import NanscopeCallback as LightningCallback
    from nanscope.integrations.transformers import NanscopeCallback as TransformersCallback

__all__ = ["KerasCallback", "LightningCallback", "TransformersCallback"]

_LAZY = {
    "LightningCallback": "nanscope.integrations.lightning",
    "TransformersCallback": "nanscope.integrations.transformers",
    "KerasCallback": "nanscope.integrations.keras",
}

#: batch keys (a dict batch) read as inputs and as targets, first match wins (the same tuples as
#: the torch adapter's: :mod:`nanscope.capture.keys`)
INPUT_KEYS = keys.INPUT_KEYS
TARGET_KEYS = keys.TARGET_KEYS


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(_LAZY[name]).NanscopeCallback
    raise AttributeError(f"module 'nanscope.integrations' has no attribute {name!r}")


class MonitorCallback:
    """What every framework's ``NanscopeCallback`` is: a callback feeding one
    :class:`nanscope.Monitor` (``.monitor``), whose diagnosis it shows (``.diagnosis``).

    policy: ``"raise"`` (the default, unless ``nanscope run --policy`` or ``NANSCOPE_POLICY`` says
        otherwise) or ``"warn"``; run_dir: where the trace and diagnosis go; monitor: feed an
        existing Monitor instead.

    A framework's callback derives from this and its framework's ``Callback``; it names its
    framework (:attr:`SOURCE`) and sets up its own state in :meth:`_attach`.
    """

    #: the framework: the Monitor's name and its trace's ``source``
    SOURCE = ""

    def __init__(
        self,
        policy: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        monitor: Monitor | None = None,
    ) -> None:
        self._require()
        super().__init__()  # the framework's own Callback
        self.monitor = monitor or Monitor(policy=policy, run_dir=run_dir, name=self.SOURCE,
                                          meta={"source": self.SOURCE})  # fmt: skip
        self._attach()

    @property
    def diagnosis(self) -> Any:
        return self.monitor.diagnosis

    def _require(self) -> None:
        """Raise :class:`nanscope.UsageError` when the installed framework cannot host the
        callback (before any Monitor is made)."""

    def _attach(self) -> None:
        """Set up the callback's own state, once its Monitor exists."""


def split_batch(batch: Any) -> tuple[Any, Any]:
    """``(inputs, targets)`` of a batch: a tensor, an ``(x, y, ...)`` sequence, or a dict."""
    if batch is None:
        return None, None
    if isinstance(batch, Mapping):
        x = next((batch[k] for k in INPUT_KEYS if batch.get(k) is not None), None)
        y = next((batch[k] for k in TARGET_KEYS if batch.get(k) is not None), None)
        return x, y
    if isinstance(batch, (list, tuple)):
        x = batch[0] if len(batch) > 0 else None
        y = batch[1] if len(batch) > 1 else None
        return x, y
    return batch, None


class TorchSteps:
    """The glue the torch-based callbacks share: the same Watcher as ``nanscope.watch``.

    Each optimizer the trainer steps gets a :class:`nanscope.torch.watch.Watcher` on the callback's
    Monitor (:meth:`watch`), hooked on the optimizer's own step, so every record is built by the
    one torch record builder (:mod:`nanscope.torch.records`): the same measures, the same
    GradScaler handling (skipped steps, loss-scale collapse), the same last good weights
    (``run_dir/last_good.pt``) and the same localisation replay as a plain loop under
    ``nanscope.watch``. The callback only names the model and the batch (:meth:`batch`) and adds
    the trainer's own logged values (:meth:`add_extra`).
    """

    def __init__(self, monitor: Monitor, *, hook_model: bool = True) -> None:
        self.monitor = monitor
        self.model: Any = None
        self.hook_model = hook_model
        self.watchers: dict[int, Any] = {}

    def watch(self, optimizer: Any) -> Any:
        """The Watcher of ``optimizer`` (a trainer's wrapper is unwrapped), made on first use.

        Made before the trainer's first step, it checks every step from the optimizer's step
        hooks (inside ``step(closure)`` right after the closure's backward, as for any loop).
        """
        from nanscope.torch.watch import Watcher

        inner = _torch_optimizer(optimizer)
        if inner is None:
            return None
        watcher = self.watchers.get(id(inner))
        if watcher is None:
            watcher = Watcher(self.model, inner, monitor=self.monitor, hook_model=self.hook_model)
            self.watchers[id(inner)] = watcher
        elif self.model is not None and watcher.model is None:
            watcher.bind_model(self.model, hook=self.hook_model)
        return watcher

    def batch(self, inputs: Any, targets: Any) -> None:
        """This step's batch as the trainer hands it (used where the forward's arguments fail)."""
        for watcher in self.watchers.values():
            watcher.on_batch(inputs, targets)

    def add_extra(self, optimizer: Any, extra: Mapping[str, Any]) -> None:
        """Fields for the ``extra`` of this optimizer's next record."""
        watcher = self.watch(optimizer)
        if watcher is not None and extra:
            watcher.add_extra(extra)

    def close(self) -> None:
        for watcher in list(self.watchers.values()):
            watcher.close()
        self.watchers.clear()


def _torch_optimizer(optimizer: Any) -> Any:
    """The ``torch.optim.Optimizer`` inside a trainer's optimizer wrapper (or the optimizer)."""
    seen = 0
    while optimizer is not None and seen < 4:
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer or not hasattr(inner, "param_groups"):
            break
        optimizer, seen = inner, seen + 1
    if optimizer is None or not hasattr(optimizer, "register_step_pre_hook"):
        return None
    return optimizer
