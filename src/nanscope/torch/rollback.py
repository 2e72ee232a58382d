"""Last good weights and the rollback policy for one torch optimizer.

The check runs before ``optimizer.step``, so when a detector fires the model still holds the weights
of the last good update: :meth:`LastGood.save` writes them to ``run_dir/last_good.pt`` (after a
late stop on an accelerator it first puts back the last verified snapshot, see
:mod:`nanscope.torch.deferred`). Under ``policy="rollback"`` :meth:`LastGood.rollback` skips the
offending update instead: its gradients are dropped, so the model, the optimizer state, the scaler
and the scheduler stay those of the last good update, and -- unless the Monitor diagnosed a bad row
in the batch, which only needs the batch skipped -- the learning rate is cut by
:data:`ROLLBACK_LR_FACTOR`. After :data:`ROLLBACK_LIMIT` lr cuts (or :data:`ROW_SKIP_LIMIT` skipped
batches) the next failure stops the fit. The Monitor prints one line per recovery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from nanscope.detectors import Alarm
from nanscope.monitor import Monitor
from nanscope.torch import sharded
from nanscope.torch.deferred import DeferredReads

__all__ = ["ROLLBACK_LIMIT", "ROLLBACK_LR_FACTOR", "ROW_SKIP_LIMIT", "LastGood", "nonfinite"]

#: what the rollback policy multiplies the learning rate by
ROLLBACK_LR_FACTOR = 0.1
#: how many lr cuts the rollback policy makes before giving up
ROLLBACK_LIMIT = 3
#: how many batches holding a bad row it skips before giving up (the data needs fixing)
ROW_SKIP_LIMIT = 100


class LastGood:
    """Saves the last good weights of one model and makes the rollbacks of its optimizer.

    ``path``: where the weights were saved (None until a stop); ``rollbacks``: how many lr cuts
    so far, ``skips``: how many batches skipped for a bad row.
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.path: Path | None = None
        self.rollbacks = 0
        self.skips = 0

    def save(
        self,
        model: Any,
        params: list[torch.Tensor],
        failing: dict[str, Any],
        alarm: Alarm,
        deferred: DeferredReads,
    ) -> list[str]:
        """Write the model's last good ``state_dict``; returns notes on what could not be saved.

        ``failing``: ``{"step", "late", "nf_params"}`` of the update that fired.
        """
        if model is None:
            return []
        if sharded.is_sharded(model):  # each rank its own shards, nothing gathered
            step = int(failing.get("step", alarm.step))
            return self._save_shards(model, params, deferred, bool(failing.get("late")), step)
        meta = self.monitor.meta
        restored = False
        if failing.get("late") and deferred.restore(params):
            restored = True
            meta["last_good_step"] = deferred.verified_step
        elif failing.get("nf_params") or any(nonfinite(p) for p in params):
            return ["the weights were already non-finite: no last good weights to save"]
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
                 if isinstance(v, torch.Tensor) and v.device.type != "meta"}  # fmt: skip
        if not state:
            return []
        if self.monitor.writes:
            path = self.monitor.run_dir / "last_good.pt"
            self.monitor.run_dir.mkdir(parents=True, exist_ok=True)
            torch.save(state, path)
            self.path = path
            meta["last_good"] = str(path)
        meta.setdefault("last_good_step", failing.get("step", alarm.step) - 1)
        if restored:
            meta["last_good_restored"] = True
        return []

    def _save_shards(
        self, model: Any, params: list[torch.Tensor], deferred: DeferredReads, late: bool, step: int
    ) -> list[str]:
        """A sharded model: each rank writes its own shards (``nanscope.local_shards/1``), the
        verified ones after a ``late`` stop, else those from before the failing ``step``."""
        restored = late and deferred.verified is not None
        if restored:
            sharded.restore_shards(params, deferred.verified or [])
        step = deferred.verified_step if restored else step - 1
        path, notes = sharded.save_shards(model, self.monitor, step=step, restored=restored)
        self.path = path or self.path
        return notes

    def rollback(
        self, optimizer: Any, params: list[torch.Tensor], failing: dict[str, Any], alarm: Alarm
    ) -> bool:
        """Skip the offending update and, unless ``alarm.data["lr_factor"]`` is 1 (the Monitor
        diagnosed a bad row: only the batch is skipped), cut the learning rate by that factor
        (default :data:`ROLLBACK_LR_FACTOR`); False when it cannot.

        It cannot after a late stop (the weights moved on), when the weights are already
        non-finite, after :data:`ROLLBACK_LIMIT` lr cuts or :data:`ROW_SKIP_LIMIT` skipped batches.
        The lr before and after go into ``alarm.data`` (``lr_before``, ``lr_after``).
        """
        if failing.get("late") or failing.get("nf_params"):
            return False
        factor = alarm.data.get("lr_factor")
        factor = ROLLBACK_LR_FACTOR if factor is None else float(factor)
        if factor == 1.0:
            self.skips += 1
            if self.skips > ROW_SKIP_LIMIT:
                return False
        else:
            self.rollbacks += 1
            if self.rollbacks > ROLLBACK_LIMIT:
                return False
        for p in params:
            p.grad = None
        if factor == 1.0:
            return True
        for i, group in enumerate(optimizer.param_groups):
            if isinstance(group.get("lr"), (int, float)):
                if i == 0:
                    alarm.data["lr_before"] = float(group["lr"])
                group["lr"] = group["lr"] * factor
                if i == 0:
                    alarm.data["lr_after"] = float(group["lr"])
            if isinstance(group.get("initial_lr"), (int, float)):
                group["initial_lr"] = group["initial_lr"] * factor
        return True


def nonfinite(p: torch.Tensor) -> bool:
    """Whether the tensor holds an inf/NaN (a meta or empty tensor holds none)."""
    if p.device.type == "meta" or p.numel() == 0:
        return False
    return not bool(torch.isfinite(p.detach()).all())
