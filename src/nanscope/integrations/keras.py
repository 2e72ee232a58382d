"""``NanscopeCallback`` for Keras 3 (any backend): a check after every training batch.

::

    from nanscope.integrations.keras import NanscopeCallback

    model.fit(x, y, callbacks=[NanscopeCallback()])   # raises nanscope.DivergenceError at the end

What it reads, each batch (``on_train_batch_end``):

* the loss of *this* batch. Keras puts a running mean over the epoch in ``logs["loss"]``, so the
  callback takes the difference of the model's loss tracker (``total`` and ``count``, weighted by
  batch size) between two batches. Without a tracker it inverts the running mean:
  ``loss_k = k * mean_k - (k - 1) * mean_(k-1)`` for the ``k``-th batch of the epoch, exact for
  equal-sized batches (the last, smaller batch of an epoch is then off), and in float32 subject
  to the cancellation of two large products late in a long epoch;
* the weights, ``model.trainable_weights`` converted to numpy (a copy per batch: this adapter is
  meant for the models Keras users train on CPU and single GPUs);
* the learning rate, ``model.optimizer.learning_rate``;
* the batch: ``model.train_step`` is wrapped for the fit to keep a reference to its ``data``
  (eager backends only; under ``jit_compile`` the batch is a traced value and is left out).

Gradients are not exposed to Keras callbacks, so the record has no gradient norm and the check
runs after the optimizer has applied the batch: a NaN batch has already reached the weights when
the callback sees it (the previous weights are ``run_dir/last_good.npz``). Without the gradient
there is no update-direction check (``update_cos``: the sign-error rule cannot confirm an ascent);
successive weights still give the update norm and the sign-flip fraction, which with the loss
growth is what the step-size rule needs.

How it stops: when the Monitor fires, the callback sets ``model.stop_training = True`` (Keras
ends the epoch there, as ``TerminateOnNaN`` does) and raises :class:`nanscope.DivergenceError`
from ``on_train_end``, so ``fit`` raises after the other callbacks have closed their epoch. Under
``warn`` it warns and the fit goes on.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from nanscope._extras import needs

with needs("nanscope.integrations.keras"):
    import keras

from nanscope.errors import DivergenceError
from nanscope.integrations import MonitorCallback, split_batch

__all__ = ["NanscopeCallback"]


class NanscopeCallback(MonitorCallback, keras.callbacks.Callback):
    """Watch a Keras fit with a :class:`nanscope.Monitor`; ``.monitor``, ``.diagnosis``, ``.error``
    (the options: :class:`~nanscope.integrations.MonitorCallback`)."""

    SOURCE = "keras"

    def _attach(self) -> None:
        self.error: DivergenceError | None = None
        self._step = 0
        self._seen = (0.0, 0.0)  # loss tracker (total, count), or (k - 1, mean_(k-1))
        self._data: Any = None
        self._wrapped = False

    def on_train_begin(self, logs: Any = None) -> None:
        self.monitor.meta.setdefault(
            "framework", f"keras {keras.__version__} ({keras.backend.backend()})"
        )
        original = self.model.train_step

        def train_step(*args: Any) -> Any:
            self._data = args[-1]  # (state, data) on jax, (data,) elsewhere
            return original(*args)

        self.model.train_step = train_step
        self._wrapped = True

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._seen = (0.0, 0.0)  # Keras resets its metrics before each epoch

    def _batch_loss(self, logs: dict[str, Any]) -> float:
        tracker = getattr(self.model, "_loss_tracker", None)
        if tracker is not None and hasattr(tracker, "total") and hasattr(tracker, "count"):
            total = _number(tracker.total)
            count = _number(tracker.count)
            old_total, old_count = self._seen
            self._seen = (total, count)
            if count > old_count:
                return (total - old_total) / (count - old_count)
        mean = float(logs.get("loss", np.nan))
        k_before, mean_before = self._seen
        self._seen = (k_before + 1, mean)
        return (k_before + 1) * mean - k_before * mean_before

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._step += 1
        loss = self._batch_loss(dict(logs or {}))
        weights = {  # copies: the tracker compares each batch's weights with the last ones
            str(getattr(v, "path", None) or f"{i}:{v.name}"): np.array(_numpy(v))
            for i, v in enumerate(self.model.trainable_weights)
        }
        lr = None
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            try:
                lr = _number(optimizer.learning_rate)
            except Exception:
                lr = None
        inputs, targets = split_batch(self._data)
        if not _concrete(inputs):
            inputs = targets = None
        try:
            self.monitor.update(loss, params=weights, lr=lr, inputs=inputs, targets=targets,
                                step=self._step)  # fmt: skip
        except DivergenceError as exc:
            self.error = exc
            self.model.stop_training = True

    def on_train_end(self, logs: Any = None) -> None:
        if self._wrapped:
            self._wrapped = False
            with contextlib.suppress(AttributeError):
                del self.model.train_step  # the instance attribute: the class's method is back
        self._data = None
        self.monitor.close()
        if self.error is not None:
            raise self.error


def _numpy(value: Any) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value))


def _number(value: Any) -> float:
    return float(_numpy(value))


def _concrete(value: Any) -> bool:
    """True for a batch that holds values (not a symbolic tensor inside a compiled function)."""
    if value is None:
        return False
    try:
        np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)
    except Exception:
        return False
    return True
