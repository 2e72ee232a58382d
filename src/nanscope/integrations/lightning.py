"""``NanscopeCallback`` for Lightning (``lightning.pytorch``): checks every step before it is taken.

::

    from nanscope.integrations.lightning import NanscopeCallback

    trainer = lightning.Trainer(callbacks=[NanscopeCallback()])
    trainer.fit(model, loader)      # raises nanscope.DivergenceError with the diagnosis

The callback puts the same :class:`nanscope.torch.watch.Watcher` as ``nanscope.watch`` on each of
the trainer's optimizers (``on_fit_start``/``on_train_start``), so a Lightning fit is diagnosed from
the same records as a plain loop (:mod:`nanscope.torch.records`): the watcher's step hook runs
inside Lightning's ``optimizer.step(closure)``, right after the closure's backward (and after
``on_before_optimizer_step`` and gradient clipping, whose pre-clip norm it records) and before the
optimizer uses the gradient, so a NaN never reaches the weights. With 16-bit mixed precision the
GradScaler's skipped steps and a collapsing loss scale are recorded as for any loop.
``on_train_batch_start`` names the batch (inputs and targets are read only when a step is checked).

How it stops: under the ``raise`` policy the step raises :class:`nanscope.DivergenceError`.
Lightning handles an exception raised during the fit by running every callback's ``on_exception``,
tearing the trainer down and re-raising the same exception from ``trainer.fit``, so the caller
gets the error with its ``.diagnosis``. ``trainer.should_stop`` is set too, for code that looks at
the trainer afterwards. Under ``warn`` the fit goes on. The trace, ``diagnosis.json`` and the last
good weights (``last_good.pt``, the model's ``state_dict``) are written to ``run_dir``.
"""

from __future__ import annotations

from typing import Any

from nanscope._extras import needs

with needs("nanscope.integrations.lightning"):
    import lightning.pytorch as pl

from nanscope.integrations import MonitorCallback, TorchSteps, split_batch
from nanscope.monitor import Monitor

__all__ = ["NanscopeCallback"]


class NanscopeCallback(MonitorCallback, pl.Callback):
    """Watch a Lightning fit with a :class:`nanscope.Monitor`; ``.monitor`` and ``.diagnosis``
    (the options: :class:`~nanscope.integrations.MonitorCallback`)."""

    SOURCE = "lightning"

    def _attach(self) -> None:
        self.steps = TorchSteps(self.monitor)
        self._trainer: Any = None
        self.monitor.on_stop.append(self._on_stop)

    def _on_stop(self, monitor: Monitor, alarm: Any) -> None:
        if monitor.policy != "warn" and self._trainer is not None:
            self._trainer.should_stop = True

    def _watch(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        self.steps.model = pl_module
        for optimizer in getattr(trainer, "optimizers", None) or ():
            self.steps.watch(optimizer)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.monitor.meta.setdefault("framework", f"lightning {pl.__version__}")
        self._watch(trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._watch(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.steps.batch(*split_batch(batch))

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self.steps.watch(optimizer)  # an optimizer the trainer did not list at the start

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.steps.close()
        self.monitor.close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.steps.close()
        self.monitor.close()
