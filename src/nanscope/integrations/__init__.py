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
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanscope.integrations.keras import NanscopeCallback as KerasCallback
    from nanscope.integrations.lightning import NanscopeCallback as LightningCallback
    from nanscope.integrations.transformers import NanscopeCallback as TransformersCallback
    from nanscope.monitor import Monitor

__all__ = ["KerasCallback", "LightningCallback", "TransformersCallback"]

_LAZY = {
    "LightningCallback": "nanscope.integrations.lightning",
    "TransformersCallback": "nanscope.integrations.transformers",
    "KerasCallback": "nanscope.integrations.keras",
}

#: batch keys (a dict batch) read as inputs and as targets, first match wins
INPUT_KEYS = ("x", "input", "inputs", "input_ids", "pixel_values", "inputs_embeds", "features")
TARGET_KEYS = ("y", "labels", "label", "target", "targets")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(_LAZY[name]).NanscopeCallback
    raise AttributeError(f"module 'nanscope.integrations' has no attribute {name!r}")


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
    """The glue the torch-based callbacks share: one record per optimizer step, checked before it.

    Gradient and weight norms come from :class:`nanscope.torch.measure.ParamMeasure` (per-parameter
    norms fused with ``torch._foreach_norm``, plus a fixed sample for the update cosine and sign
    flips); the batch goes through the Monitor's own :class:`~nanscope.capture.arrays.BatchChecker`.
    When a detector fires, the model's weights (untouched by the failing step) are saved to
    ``run_dir/last_good.pt``.
    """

    def __init__(self, monitor: Monitor) -> None:
        from nanscope.capture.arrays import BatchChecker

        self.monitor = monitor
        self.model: Any = None
        self._measures: dict[int, Any] = {}
        self._inputs = BatchChecker("inputs")
        self._targets = BatchChecker("targets")
        monitor.probes.append(self._save_last_good)

    def record(
        self,
        optimizer: Any,
        *,
        loss: Any,
        inputs: Any = None,
        targets: Any = None,
        scaler: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Measure this step and hand it to the Monitor (raises DivergenceError to stop it).

        scaler: an enabled ``torch.amp.GradScaler``. It skips a step whose (unscaled) gradients
        overflow and lowers its scale, so such a step is recorded as skipped, not as a failure.
        """
        from nanscope.torch.measure import ParamMeasure, param_names

        record: dict[str, Any] = {}
        if loss is not None:
            value = float(loss.detach().float().mean()) if hasattr(loss, "detach") else float(loss)
            record["loss"] = value
            record["nf_loss"] = 0 if math.isfinite(value) else 1
        groups = list(getattr(optimizer, "param_groups", None) or ())
        if groups and groups[0].get("lr") is not None:
            record["lr"] = float(groups[0]["lr"])
        params = [p for g in groups for p in g["params"] if p.requires_grad]
        if params:
            key = (len(params), sum(id(p) for p in params))
            measure = self._measures.get(id(optimizer))
            if measure is None or measure.key != key:
                measure = ParamMeasure(params, param_names(self.model))
                self._measures[id(optimizer)] = measure
            vec, layout = measure.device_vector(True)
            if vec is not None:
                record.update(measure.record(vec.tolist(), layout))
        for checker, batch in ((self._inputs, inputs), (self._targets, targets)):
            if batch is None or not hasattr(batch, "shape"):
                continue
            try:
                found = checker.check(batch, None)
            except Exception:  # a batch nanscope cannot read never stops the fit
                continue
            for k, v in found.items():
                if k == "rows":
                    record.setdefault("rows", []).extend(v)
                else:
                    record[k] = v
        info = dict(extra or {})
        if scaler is not None and getattr(scaler, "is_enabled", lambda: False)():
            info["loss_scale"] = float(scaler.get_scale())
            if record.get("nf_grads") and record.get("nf_loss") == 0:
                record["events"] = ["skipped_step"]
                info["skipped_step"] = True
                info["nonfinite_grads"] = record.pop("nf_grads")
                record.pop("grad_norm", None)
                record.pop("grad_norms", None)
        if info:
            record["extra"] = info
        return self.monitor.observe(record, batch=(inputs, targets, None))

    def _save_last_good(self, monitor: Monitor, alarm: Any) -> dict[str, Any]:
        last = monitor.trace.records[-1] if monitor.trace.records else {}
        if self.model is None or last.get("nf_params") or not monitor.writes:
            return {}
        import torch

        path = monitor.run_dir / "last_good.pt"
        monitor.run_dir.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, path)
        monitor.meta["last_good"] = str(path)
        return {}
