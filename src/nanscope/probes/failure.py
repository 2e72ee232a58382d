"""What a framework adapter hands the probes when a detector fired on a PyTorch update.

The adapter (``nanscope.torch``) fills a :class:`TorchFailure` at the moment it stops an update,
before the weights change; the localisation probe (``nanscope.probes.locate``) replays and inspects
it. Everything is kept by reference and only touched after something fired, so a healthy run pays
nothing for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CallSite", "TorchFailure"]


@dataclass
class CallSite:
    """Where in the user's code something happened (e.g. the ``loss.backward()`` call)."""

    file: str
    line: int
    function: str = ""


@dataclass
class TorchFailure:
    """The state of the failing update.

    model: the watched ``nn.Module`` (its parameters are still those of the failing update).
    args, kwargs: what the model's forward received (captured by a forward pre-hook).
    output: what the model's forward returned on that update (may hold the non-finite value).
    loss: the tensor on which ``backward()`` was called (its autograd graph may be freed).
    loss_module: the ``nn.Module`` loss (e.g. ``nn.BCELoss``) that produced it, when one did.
    loss_args: what that loss module received (output, target).
    targets: the targets, when known.
    backward_site: the user's ``loss.backward()`` line; the loss was computed in that function.
    step: the update number; what: which detector fired ("loss", "grad", "weight").
    autocast: the autocast dtype active at the forward, if any (``torch.float16`` ...).
    grad_scaler: the ``torch.amp.GradScaler`` in use, if any; scale_history: its recent scales.
    batch_index: dataset row numbers of the batch rows, when the DataLoader's sampler tells them.
    """

    model: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    loss: Any = None
    loss_module: Any = None
    loss_args: tuple[Any, ...] = ()
    targets: Any = None
    backward_site: CallSite | None = None
    step: int | None = None
    what: str = "loss"
    autocast: Any = None
    grad_scaler: Any = None
    scale_history: list[float] = field(default_factory=list)
    batch_index: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def loss_finite_before_step(self) -> float | None:
        """The failing update's own loss (its first record: a closure's first evaluation) when
        that loss was finite and the non-finite value is a loss all the same: it came within the
        step (a later evaluation of LBFGS's closure, at weights the step moved). Else None."""
        if self.what != "loss":
            return None
        own = next((v for s, v in self.extra.get("losses") or [] if s == self.step), None)
        return own if own is not None and math.isfinite(own) else None
