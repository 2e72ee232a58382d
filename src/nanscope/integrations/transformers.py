"""``NanscopeCallback`` for the Hugging Face ``transformers.Trainer``: checks each step before it.

::

    from nanscope.integrations.transformers import NanscopeCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[NanscopeCallback()])
    trainer.train()                 # raises nanscope.DivergenceError with the diagnosis

How it watches: ``on_train_begin`` puts the same :class:`nanscope.torch.watch.Watcher` as
``nanscope.watch`` on the model and on the torch optimizer inside the Trainer's (accelerate's)
wrapper, so a Trainer fit is diagnosed from the same records as a plain loop
(:mod:`nanscope.torch.records`). The watcher's forward hooks keep the batch the Trainer feeds the
model (``model(**inputs)``); the backward hook keeps the real loss of each micro-batch, NaN
included (the Trainer's own logs filter it, see below); the optimizer's step pre-hook (after
backward and gradient clipping, whose pre-clip norm it records, right before the weights change)
measures the step. With fp16 the GradScaler's skipped steps and a collapsing loss scale are
recorded as for any loop. ``on_log`` keeps ``loss``, ``grad_norm`` and ``learning_rate`` as the
Trainer logged them, next to the trace (``extra.logged`` of the next update).

How it stops: under the ``raise`` policy the callback sets ``control.should_training_stop`` and
:class:`nanscope.DivergenceError` comes out of ``trainer.train()``. It is raised before
``optimizer.step()`` changes the weights, so the model keeps the weights of the last good update
(also saved as ``run_dir/last_good.pt``).

``logging_nan_inf_filter`` (a ``TrainingArguments`` field, default ``True``): when a micro-batch's
loss is NaN or inf, the Trainer does not add it to the loss it logs; it adds the mean of the losses
accumulated since the last log instead. Right after a log (``logging_steps=1``, or the first step
after each log) that accumulator is zero, so the logged loss is exactly ``0.0``; the logged
``grad_norm`` is not filtered and shows ``nan``. The filter touches only the logs: the gradient and
the update still come from the NaN loss. This callback reads the loss that is backpropagated, so
it sees the NaN whatever the filter says.
"""

from __future__ import annotations

import math
from typing import Any

from nanscope._extras import needs

with needs("nanscope.integrations.transformers"):
    import transformers

from nanscope.errors import UsageError
from nanscope.integrations import MonitorCallback, TorchSteps
from nanscope.monitor import Monitor

__all__ = ["NanscopeCallback"]

_LOGGED = ("loss", "grad_norm", "learning_rate")


class NanscopeCallback(MonitorCallback, transformers.TrainerCallback):
    """Watch a ``Trainer`` fit with a :class:`nanscope.Monitor`; ``.monitor`` and ``.diagnosis``
    (the options: :class:`~nanscope.integrations.MonitorCallback`)."""

    SOURCE = "transformers"

    def _require(self) -> None:
        if not hasattr(transformers.TrainerCallback, "on_pre_optimizer_step"):
            raise UsageError(
                f"transformers {transformers.__version__} has no on_pre_optimizer_step event, "
                "which NanscopeCallback needs to check a step before it is taken; upgrade "
                "transformers"
            )

    def _attach(self) -> None:
        self.steps = TorchSteps(self.monitor)
        self._control: Any = None
        self._logged: dict[str, float] = {}
        self.monitor.on_stop.append(self._on_stop)

    def _on_stop(self, monitor: Monitor, alarm: Any) -> None:
        if monitor.policy != "warn" and self._control is not None:
            self._control.should_training_stop = True

    # ------------------------------------------------------------------ trainer events

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._control = control
        self.steps.model = kwargs.get("model")
        if kwargs.get("optimizer") is not None:
            self.steps.watch(kwargs["optimizer"])
        self.monitor.meta.setdefault("framework", f"transformers {transformers.__version__}")
        self.monitor.meta["logging_nan_inf_filter"] = bool(
            getattr(args, "logging_nan_inf_filter", True)
        )

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._control = control
        optimizer = kwargs.get("optimizer")
        self.steps.watch(optimizer)  # an optimizer the Trainer did not hand over at the start
        if self._logged:
            self.steps.add_extra(optimizer, {"logged": self._logged})
        self._logged = {}

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
        self.steps.close()
        self.monitor.close()
