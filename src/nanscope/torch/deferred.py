"""Deferred reads on accelerators: read the device-side measures every ``sync_every`` updates.

On CPU each update's small measure vector is read at once (the read is free). On an accelerator a
read is a host-device synchronisation, so :class:`DeferredReads` keeps the vectors on the device
and reads them in one burst every ``sync_every`` updates (default 16): detection is then up to
``sync_every - 1`` updates late, but each update is still judged on its own values, so the failing
update is found exactly. To give the weights back after a late stop, every clean burst ends with a
snapshot of the weights (``verified``, taken on the device, no read), and the batches since it are
kept (``recent``) so the replay can start from the snapshot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ACCELERATOR_SYNC_EVERY", "DeferredReads"]

#: updates between two reads when the parameters are on an accelerator (``sync_every`` default)
ACCELERATOR_SYNC_EVERY = 16

#: what a burst hands back for each update: (step, values, ctx, batch, late)
Process = Callable[..., None]


class DeferredReads:
    """The device vectors not read yet, the last verified weights, and the batches since them.

    sync_every: fixed interval, or None for the default (1 on CPU, 16 on an accelerator).
    """

    def __init__(self, sync_every: int | None = None) -> None:
        self.sync_every = sync_every
        self.pending: deque[tuple[int, Any, dict[str, Any], Any]] = deque()
        self.recent: deque[tuple[int, tuple[Any, ...], dict[str, Any], Any]] = deque(maxlen=64)
        self.verified: list[torch.Tensor] | None = None
        self.verified_step = 0

    def interval(self, device: torch.device) -> int:
        """Updates between two reads for measures that live on ``device``."""
        if self.sync_every is not None:
            return self.sync_every
        return 1 if device.type in ("cpu", "meta") else ACCELERATOR_SYNC_EVERY

    def remember(self, step: int, args: Any, kwargs: Any, targets: Any, interval: int) -> None:
        """Keep this update's batch for a replay (only the last one when reading every update)."""
        if interval <= 1:
            self.recent.clear()
        self.recent.append((step, args, kwargs, targets))

    def batch_at(self, step: int) -> tuple[Any, Any, Any] | None:
        """``(args, kwargs, targets)`` of update ``step``, when still kept."""
        for s, a, k, t in reversed(self.recent):
            if s == step:
                return a, k, t
        return None

    def replay_from(self) -> dict[str, Any]:
        """Where a replay of a late stop starts: the verified step and the batches after it."""
        return {
            "step": self.verified_step,
            "batches": [(s, a, k) for s, a, k, _ in self.recent if s > self.verified_step],
        }

    def push(self, step: int, vec: torch.Tensor, ctx: dict[str, Any], batch: Any) -> bool:
        """Hold one update's device vector; True when a read is due (``interval`` reached)."""
        self.pending.append((step, vec, ctx, batch))
        return len(self.pending) >= int(ctx.get("interval", 1))

    def drain(self, process: Process, params: list[torch.Tensor], *, allow_raise: bool) -> None:
        """Read the pending vectors (one sync), ``process`` them in order, snapshot if clean.

        ``process(step, values, ctx, batch=..., late=...)`` may raise to stop the fit; with
        ``allow_raise=False`` (closing) that ends the burst quietly.
        """
        if not self.pending:
            return
        items = list(self.pending)
        self.pending.clear()
        last = items[-1][0]
        stacked = torch.cat([item[1] for item in items]).tolist()
        pos = 0
        for step, vec, ctx, batch in items:
            values = stacked[pos : pos + vec.numel()]
            pos += vec.numel()
            try:
                process(step, values, ctx, batch=batch, late=step != last)
            except Exception:
                if allow_raise:
                    raise
                return
        # every update up to now was clean: the current weights are verified good
        if params and params[0].device.type != "meta":
            with torch.no_grad():
                if self.verified is None or len(self.verified) != len(params):
                    self.verified = [p.detach().clone() for p in params]
                else:
                    torch._foreach_copy_(self.verified, [p.detach() for p in params])
            self.verified_step = last

    def restore(self, params: list[torch.Tensor]) -> bool:
        """Copy the verified weights back into ``params``; False when there are none."""
        if self.verified is None:
            return False
        with torch.no_grad():
            for p, saved in zip(params, self.verified):
                p.copy_(saved)
        return True
