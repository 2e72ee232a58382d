"""Mixed precision: the GradScaler's loss scale, the steps it skips, and when its scale collapsed.

A dynamic ``torch.amp.GradScaler`` skips ``optimizer.step`` when the (scaled) gradients hold an
inf/NaN and halves its scale. One skip is routine; a scale that keeps falling is fp16 overflow
that scaling cannot fix. :class:`Precision` follows the scaler of one optimizer:

* :meth:`Precision.step_begin` / :meth:`Precision.step_end` wrap ``scaler.step(optimizer)`` (the
  process-wide patch in :mod:`nanscope.torch._hooks` calls them); ``step_end`` returns the record
  of a skipped step (:meth:`Precision.skipped_record`) or None;
* a skipped step is recorded with the event ``skipped_step``; a scale below :data:`SCALE_FLOOR` or
  :data:`SKIP_LIMIT` skips in a row adds ``loss_scale_collapse`` and ``nf_grads`` (the gradients
  are non-finite at every scale tried): that is the fp16 evidence the rules read;
* :meth:`Precision.scale_tensor` is the scale as a device tensor, read with the other measures.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

__all__ = ["SCALE_FLOOR", "SKIP_LIMIT", "Precision", "scale_of"]

#: a loss scale below this is a collapse: fp16 overflow that scaling cannot fix
SCALE_FLOOR = 1e-4
#: this many consecutive skipped steps is a collapse too
SKIP_LIMIT = 25


class Precision:
    """The GradScaler of one optimizer: ``scaler``, ``skips`` in a row, ``scale_history``."""

    def __init__(self) -> None:
        self.scaler: Any = None
        self.stepping = False
        self.stepped = False
        self.skips = 0
        self.scale_history: deque[float] = deque(maxlen=64)

    def scale_tensor(self) -> torch.Tensor | None:
        """The enabled scaler's current scale (a device tensor, not read here), or None."""
        scaler = self.scaler
        if scaler is None or not _enabled(scaler):
            return None
        scale = getattr(scaler, "_scale", None)
        return scale if isinstance(scale, torch.Tensor) else None

    def step_begin(self, scaler: Any) -> None:
        self.scaler = scaler
        self.stepping = True
        self.stepped = False

    def on_step(self) -> None:
        """``optimizer.step`` ran (the scaler did not skip it)."""
        self.stepped = True

    def step_end(self, scaler: Any) -> dict[str, Any] | None:
        """After ``scaler.step``: None when the step ran, else what the skip says.

        ``{"scale", "skips", "collapsed"}``; record it with :meth:`skipped_record`.
        """
        self.stepping = False
        if self.stepped:
            self.skips = 0
            return None
        # the scaler found inf/NaN in the (scaled) gradients and skipped optimizer.step
        self.skips += 1
        scale = scale_of(scaler)
        self.scale_history.append(scale)
        collapsed = scale < SCALE_FLOOR or self.skips >= SKIP_LIMIT
        return {"scale": scale, "skips": self.skips, "collapsed": collapsed}

    def note_scale(self, scale: float) -> None:
        self.scale_history.append(scale)

    @staticmethod
    def skipped_record(step: int, loss: float, lr: float | None, skip: dict[str, Any]) -> dict:
        """The record of a step the scaler skipped (``skip`` from :meth:`step_end`)."""
        scale, skips = skip["scale"], skip["skips"]
        record: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "nf_loss": 0 if math.isfinite(loss) else 1,
            "events": ["skipped_step"],
            "extra": {"loss_scale": scale, "skipped_step": True, "consecutive_skips": skips},
        }
        if lr is not None:
            record["lr"] = lr
        if skip["collapsed"]:
            record["events"].append("loss_scale_collapse")
            record["nf_grads"] = 1  # the gradients are non-finite at every scale tried
            record["extra"]["fp16_story"] = (
                f"the loss scale fell to {scale:.3g} after {skips} consecutive skipped "
                "steps: the gradients overflow float16 even unscaled"
            )
        return record


def _enabled(scaler: Any) -> bool:
    try:
        return bool(scaler.is_enabled())
    except Exception:
        return False


def unscale_tensor(scaled_by: Any) -> torch.Tensor | None:
    """The scale a loss made by ``scaled_by.scale(loss)`` was multiplied by (a tensor), or None."""
    if scaled_by is None:
        return None
    scale = getattr(scaled_by, "_scale", None)
    return scale if isinstance(scale, torch.Tensor) else None


def scale_of(scaler: Any) -> float:
    """The scaler's current scale as a float (NaN when it has none yet)."""
    scale = getattr(scaler, "_scale", None)
    if isinstance(scale, torch.Tensor):
        return float(scale.detach().cpu().reshape(-1)[0])
    return math.nan
