"""``NanscopeCallback`` for Lightning (``lightning.pytorch``): checks every step before it is taken.

::

    from nanscope.integrations.lightning import NanscopeCallback

    trainer = lightning.Trainer(callbacks=[NanscopeCallback()])
    trainer.fit(model, loader)      # raises nanscope.DivergenceError with the diagnosis

Hooks used:

* ``on_train_batch_start`` keeps a reference to the batch (inputs and targets are read only when
  a step is checked);
* ``on_before_backward`` keeps the loss Lightning is about to backpropagate (under gradient
  accumulation each micro-batch's loss is already divided by ``accumulate_grad_batches``, so their
  sum is the step's mean loss);
* ``on_before_optimizer_step`` measures the gradients and weights (per-parameter norms fused with
  ``torch._foreach_norm``), reads the learning rate from the optimizer's param groups and hands the
  record to the :class:`nanscope.Monitor`. Lightning calls it after the closure's backward and
  before gradient clipping and ``optimizer.step``, so the check sees the raw gradient and a NaN
  never reaches the weights.

How it stops: under the ``raise`` policy the hook raises :class:`nanscope.DivergenceError`.
Lightning handles an exception from a callback by running every callback's ``on_exception``,
tearing the trainer down and re-raising the same exception from ``trainer.fit``, so the caller
gets the error with its ``.diagnosis``. ``trainer.should_stop`` is set too, for code that looks at
the trainer afterwards. Under ``warn`` the fit goes on. The trace, ``diagnosis.json`` and the last
good weights (``last_good.pt``, the model's ``state_dict``) are written to ``run_dir``.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl

from nanscope.integrations import TorchSteps, split_batch
from nanscope.monitor import Monitor

__all__ = ["NanscopeCallback"]


class NanscopeCallback(pl.Callback):
    """Watch a Lightning fit with a :class:`nanscope.Monitor`; ``.monitor`` and ``.diagnosis``.

    policy: ``"raise"`` (the default, unless ``nanscope run --policy`` or ``NANSCOPE_POLICY`` says
        otherwise) or ``"warn"``; run_dir: where the trace and diagnosis go; monitor: feed an
        existing Monitor instead.
    """

    def __init__(
        self,
        policy: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        monitor: Monitor | None = None,
    ) -> None:
        self.monitor = monitor or Monitor(policy=policy, run_dir=run_dir, name="lightning",
                                          meta={"source": "lightning"})  # fmt: skip
        self.steps = TorchSteps(self.monitor)
        self._batch: Any = None
        self._losses: list[Any] = []

    @property
    def diagnosis(self) -> Any:
        return self.monitor.diagnosis

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.steps.model = pl_module
        self.monitor.meta.setdefault("framework", f"lightning {pl.__version__}")

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch = batch

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any
    ) -> None:
        self._losses.append(loss.detach())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        loss = sum(self._losses) if self._losses else None
        self._losses = []
        inputs, targets = split_batch(self._batch)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        try:
            self.steps.record(optimizer, loss=loss, inputs=inputs, targets=targets, scaler=scaler)
        except BaseException:
            trainer.should_stop = True
            raise

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.monitor.close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.monitor.close()
