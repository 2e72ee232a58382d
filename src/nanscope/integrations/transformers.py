"""``NanscopeCallback`` for the Hugging Face ``transformers.Trainer``: checks each step before it.

::

    from nanscope.integrations.transformers import NanscopeCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[NanscopeCallback()])
    trainer.train()                 # raises nanscope.DivergenceError with the diagnosis

Hooks used:

* ``on_train_begin`` puts a forward pre-hook and a forward hook on the model: they keep the batch
  the Trainer feeds it (``model(**inputs)``) and the ``loss`` of its output, in training mode only.
  That is the real loss of each micro-batch, NaN included: the Trainer's own logs filter it (see
  below);
* ``on_pre_optimizer_step`` (the Trainer calls it after backward and gradient clipping, right before
  ``optimizer.step()``) measures gradients and weights with fused per-parameter norms, reads the
  learning rate from the optimizer and hands the record to the :class:`nanscope.Monitor`. When
  ``max_grad_norm > 0`` the gradients it sees are the clipped ones; the Trainer's pre-clip norm is
  in its logs (``grad_norm``), which this callback keeps next to the trace
  (``extra.logged`` of the next update);
* ``on_log`` keeps ``loss``, ``grad_norm`` and ``learning_rate`` as the Trainer logged them.

How it stops: under the ``raise`` policy the callback sets ``control.should_training_stop`` and
raises :class:`nanscope.DivergenceError` out of ``trainer.train()``. It raises from
``on_pre_optimizer_step``, so ``optimizer.step()`` never runs with a NaN gradient and the model
keeps the weights of the last good update (also saved as ``run_dir/last_good.pt``).

``logging_nan_inf_filter`` (a ``TrainingArguments`` field, default ``True``): when a micro-batch's
loss is NaN or inf, the Trainer does not add it to the loss it logs; it adds the mean of the losses
accumulated since the last log instead. Right after a log (``logging_steps=1``, or the first step
after each log) that accumulator is zero, so the logged loss is exactly ``0.0``; the logged
``grad_norm`` is not filtered and shows ``nan``. The filter touches only the logs: the gradient and
the update still come from the NaN loss. This callback reads the loss from the model's output, so
it sees the NaN whatever the filter says.
"""

from __future__ import annotations

import math
import os
from typing import Any

import transformers

from nanscope.errors import UsageError
from nanscope.integrations import TorchSteps, split_batch
from nanscope.monitor import Monitor

__all__ = ["NanscopeCallback"]

_LOGGED = ("loss", "grad_norm", "learning_rate")


class NanscopeCallback(transformers.TrainerCallback):
    """Watch a ``Trainer`` fit with a :class:`nanscope.Monitor`; ``.monitor`` and ``.diagnosis``.

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
        if not hasattr(transformers.TrainerCallback, "on_pre_optimizer_step"):
            raise UsageError(
                f"transformers {transformers.__version__} has no on_pre_optimizer_step event, "
                "which NanscopeCallback needs to check a step before it is taken; upgrade "
                "transformers"
            )
        self.monitor = monitor or Monitor(policy=policy, run_dir=run_dir, name="transformers",
                                          meta={"source": "transformers"})  # fmt: skip
        self.steps = TorchSteps(self.monitor)
        self._handles: list[Any] = []
        self._batch: Any = None
        self._losses: list[Any] = []
        self._logged: dict[str, float] = {}

    @property
    def diagnosis(self) -> Any:
        return self.monitor.diagnosis

    # ------------------------------------------------------------------ model hooks

    def _keep_batch(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if module.training:
            self._batch = kwargs if kwargs else args

    def _keep_loss(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not module.training:
            return
        loss = output.get("loss") if hasattr(output, "get") else getattr(output, "loss", None)
        if loss is not None and hasattr(loss, "detach"):
            self._losses.append(loss.detach())

    def _unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------------ trainer events

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        self.steps.model = model
        self._unhook()
        if model is not None:
            self._handles = [
                model.register_forward_pre_hook(self._keep_batch, with_kwargs=True),
                model.register_forward_hook(self._keep_loss, with_kwargs=True),
            ]
        self.monitor.meta.setdefault("framework", f"transformers {transformers.__version__}")
        self.monitor.meta["logging_nan_inf_filter"] = bool(
            getattr(args, "logging_nan_inf_filter", True)
        )

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        optimizer = kwargs.get("optimizer")
        losses, self._losses = self._losses, []
        loss = sum(losses) / len(losses) if losses else None
        inputs, targets = split_batch(self._batch)
        extra = {"logged": self._logged} if self._logged else None
        self._logged = {}
        try:
            self.steps.record(optimizer, loss=loss, inputs=inputs, targets=targets,
                              scaler=getattr(optimizer, "scaler", None), extra=extra)  # fmt: skip
        except BaseException:
            control.should_training_stop = True
            self._unhook()
            self.monitor.close()
            raise

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        logs = kwargs.get("logs") or {}
        for key in _LOGGED:
            value = logs.get(key)
            if isinstance(value, (int, float)):
                self._logged[key] = float(value)
        loss = self._logged.get("loss")
        grad = self._logged.get("grad_norm")
        if loss == 0.0 and grad is not None and not math.isfinite(grad):
            self._logged["hidden_nan_loss"] = 1.0  # the filter's 0.0 next to a NaN grad norm

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unhook()
        self.monitor.close()
