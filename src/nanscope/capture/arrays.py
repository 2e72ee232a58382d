"""Cheap per-update measures on numpy arrays (or anything with ``__array__``).

The Monitor calls these on every update, so each one is written to touch every element as few
times as possible:

* parameters and gradients are copied once into a float64 buffer of four rows per tensor (weights
  now, weights before, gradient now, gradient before); one small matrix product of that buffer with
  itself yields every norm, dot product and cosine the detectors need. A finite sum of squares
  proves every element finite, so the exact non-finite count is only taken when it is not.
* sign flips are counted on a fixed strided sample of at most ``FLIP_SAMPLE`` weights.
* an input batch costs one column-wise max and min; row-level robust z-scores are computed only
  when a column's maximum jumps far beyond its history, on the first batch, or when a value is
  non-finite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from nanscope.errors import UsageError

__all__ = ["BatchChecker", "ParamTracker", "as_array", "as_named", "nonfinite_rows", "robust_rows"]

FLIP_SAMPLE = 4096
#: a row is "extreme" when one of its values lies this many robust standard deviations out
EXTREME_Z = 20.0
#: a column max this many times its recent typical max triggers the row analysis
COLUMN_JUMP = 8.0
MAX_ROWS = 5


def as_array(value: Any, name: str) -> np.ndarray:
    """A numpy view of ``value`` without importing any framework (torch tensors are detached)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (str, bytes)):
        raise UsageError(f"{name} must be a number or an array, not {type(value).__name__}")
    detach = getattr(value, "detach", None)
    if callable(detach):
        value = detach()
        cpu = getattr(value, "cpu", None)
        if callable(cpu):
            value = cpu()
    try:
        array = np.asarray(value)
    except Exception as exc:  # pragma: no cover - exotic array types
        raise UsageError(f"{name} cannot be read as an array: {exc}") from None
    if array.dtype.kind not in "biufc":
        raise UsageError(f"{name} must be numeric, got dtype {array.dtype}")
    return array


def as_named(value: Any, name: str) -> dict[str, np.ndarray]:
    """Params or grads as ``{name: array}``: a mapping, a sequence of arrays, or one array."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): as_array(v, f"{name}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return {str(i): as_array(v, f"{name}[{i}]") for i, v in enumerate(value)}
    return {"0": as_array(value, name)}


def _count_nonfinite(array: np.ndarray) -> int:
    return int(array.size - np.count_nonzero(np.isfinite(array)))


class _Slot:
    """Buffers for one named tensor: rows 0/1 hold weights (now/before), rows 2/3 gradients."""

    __slots__ = (
        "buffer",
        "flip_prev",
        "g_now",
        "has_prev_grad",
        "has_prev_param",
        "shape",
        "stride",
        "w_now",
    )

    def __init__(self, size: int, shape: tuple[int, ...]) -> None:
        self.buffer = np.zeros((4, size), dtype=np.float64)
        self.shape = shape
        self.stride = max(1, size // FLIP_SAMPLE)
        self.flip_prev: np.ndarray | None = None
        self.has_prev_param = False
        self.has_prev_grad = False
        # which buffer row holds "now"; the other of the pair holds "before" (swapped, not copied)
        self.w_now = 0
        self.g_now = 2


class ParamTracker:
    """Keeps the previous weights and gradient, and measures each update against them."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self.last_good: dict[str, np.ndarray] = {}

    def measure(
        self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]
    ) -> dict[str, Any]:
        names = list(params) if params else list(grads)
        if params and grads and set(params) != set(grads):
            missing = sorted(set(params) ^ set(grads))
            raise UsageError(f"params and grads must have the same names; differ in {missing}")
        out: dict[str, Any] = {}
        w_sq = g_sq = u_sq = u_dot_pg = u_dot_g = g_dot_pg = 0.0
        pg_sq = 0.0
        have_update = have_prev_grad = bool(names)
        flips = flip_total = 0
        nf_params = nf_grads = 0
        grad_norms: dict[str, float] = {}
        for name in names:
            w = params.get(name) if params else None
            g = grads.get(name) if grads else None
            if w is not None and g is not None and w.shape != g.shape:
                raise UsageError(
                    f"params[{name!r}] has shape {w.shape} but grads[{name!r}] has {g.shape}"
                )
            ref = w if w is not None else g
            assert ref is not None
            slot = self._slots.get(name)
            if slot is None or slot.shape != ref.shape:
                slot = self._slots[name] = _Slot(ref.size, ref.shape)
            buf = slot.buffer
            if w is not None:
                slot.w_now = 1 - slot.w_now
                np.copyto(buf[slot.w_now], w.reshape(-1))
            if g is not None:
                slot.g_now = 5 - slot.g_now
                np.copyto(buf[slot.g_now], g.reshape(-1))
            gram = buf @ buf.T
            wn, wp, gn, gp = slot.w_now, 1 - slot.w_now, slot.g_now, 5 - slot.g_now
            if w is not None:
                ww = float(gram[wn, wn])
                if not math.isfinite(ww):
                    nf = _count_nonfinite(w)
                    nf_params += nf
                    if nf == 0:
                        ww = float(np.dot(buf[wn], buf[wn]))
                w_sq += ww
                if slot.has_prev_param:
                    uu = ww - 2.0 * float(gram[wn, wp]) + float(gram[wp, wp])
                    u_sq += max(uu, 0.0)
                    if slot.has_prev_grad:
                        u_dot_pg += float(gram[wn, gp]) - float(gram[wp, gp])
                    if g is not None:
                        u_dot_g += float(gram[wn, gn]) - float(gram[wp, gn])
                    sample = buf[wn, :: slot.stride]
                    if slot.flip_prev is not None:
                        prev = slot.flip_prev
                        nonzero = prev != 0.0
                        flips += int(np.count_nonzero((sample * prev) < 0.0))
                        flip_total += int(np.count_nonzero(nonzero))
                else:
                    have_update = False
                slot.flip_prev = buf[wn, :: slot.stride].copy()
                slot.has_prev_param = True
            else:
                have_update = False
            if g is not None:
                gg = float(gram[gn, gn])
                if not math.isfinite(gg):
                    nf = _count_nonfinite(g)
                    nf_grads += nf
                    if nf == 0:
                        gg = float(np.dot(buf[gn], buf[gn]))
                g_sq += gg
                grad_norms[name] = math.sqrt(gg) if gg >= 0 else math.nan
                if slot.has_prev_grad:
                    g_dot_pg += float(gram[gn, gp])
                    pg_sq += float(gram[gp, gp])
                else:
                    have_prev_grad = False
                slot.has_prev_grad = True
            else:
                have_prev_grad = False
        if params:
            out["weight_norm"] = math.sqrt(w_sq) if w_sq >= 0 else math.nan
            out["nf_params"] = nf_params
        if grads:
            out["grad_norm"] = math.sqrt(g_sq) if g_sq >= 0 else math.nan
            out["nf_grads"] = nf_grads
            if len(grad_norms) > 1:
                out["grad_norms"] = grad_norms
        if params and have_update:
            u_norm = math.sqrt(u_sq)
            out["update_norm"] = u_norm
            if grads and u_norm > 0:
                if have_prev_grad and pg_sq > 0:
                    out["update_cos"] = _clip_cos(u_dot_pg / (u_norm * math.sqrt(pg_sq)))
                if g_sq > 0:
                    out["update_cos_same"] = _clip_cos(u_dot_g / (u_norm * math.sqrt(g_sq)))
            if flip_total:
                out["flip_frac"] = flips / flip_total
        if grads and have_prev_grad and pg_sq > 0 and g_sq > 0:
            out["grad_cos"] = _clip_cos(g_dot_pg / math.sqrt(g_sq * pg_sq))
        return out

    def snapshot_previous(self) -> dict[str, np.ndarray]:
        """The weights as they were one update ago (copies, original shapes)."""
        return {
            name: slot.buffer[1 - slot.w_now].reshape(slot.shape).copy()
            for name, slot in self._slots.items()
            if slot.has_prev_param
        }

    def snapshot_current(self) -> dict[str, np.ndarray]:
        """The weights seen at the latest update (copies, original shapes)."""
        return {
            name: slot.buffer[slot.w_now].reshape(slot.shape).copy()
            for name, slot in self._slots.items()
            if slot.has_prev_param
        }


def _clip_cos(value: float) -> float:
    if not math.isfinite(value):
        return math.nan
    return max(-1.0, min(1.0, value))


def _as_rows(array: np.ndarray) -> np.ndarray | None:
    if array.ndim == 0 or array.size == 0:
        return None
    if array.ndim == 1:
        return array.reshape(-1, 1)
    return array.reshape(array.shape[0], -1)


def nonfinite_rows(
    array: np.ndarray, source: str, index: np.ndarray | None = None, limit: int = MAX_ROWS
) -> tuple[int, list[dict[str, Any]]]:
    """Count non-finite values and describe the first rows holding them."""
    rows2d = _as_rows(array)
    if rows2d is None:
        count = _count_nonfinite(array)
        return count, []
    finite = np.isfinite(rows2d)
    count = int(finite.size - np.count_nonzero(finite))
    out: list[dict[str, Any]] = []
    if count:
        bad_rows = np.flatnonzero(~finite.all(axis=1))[:limit]
        for r in bad_rows:
            col = int(np.flatnonzero(~finite[r])[0])
            value = float(rows2d[r, col])
            entry: dict[str, Any] = {
                "source": source,
                "batch_row": int(r),
                "column": col,
                "value": value,
                "why": "nan" if math.isnan(value) else "inf",
            }
            if index is not None and r < len(index):
                entry["dataset_row"] = int(index[r])
            out.append(entry)
    return count, out


def robust_rows(
    array: np.ndarray,
    source: str,
    index: np.ndarray | None = None,
    threshold: float = EXTREME_Z,
    limit: int = MAX_ROWS,
) -> tuple[float, list[dict[str, Any]]]:
    """Robust z-score of each row (median / MAD per column, std where MAD is 0).

    Returns the largest row score and the rows at or above ``threshold``, largest first.
    """
    rows2d = _as_rows(array)
    if rows2d is None or rows2d.shape[0] < 3:
        return math.nan, []
    data = rows2d.astype(np.float64, copy=False)
    finite = np.isfinite(data)
    if not finite.all():
        data = np.where(finite, data, np.nan)
    with np.errstate(all="ignore"):
        med = np.nanmedian(data, axis=0)
        dev = np.abs(data - med)
        scale = 1.4826 * np.nanmedian(dev, axis=0)
        fallback = np.nanstd(data, axis=0)
        scale = np.where(scale > 0, scale, fallback)
        scale = np.where(scale > 0, scale, np.inf)
        z = dev / scale
    z = np.where(np.isfinite(z), z, 0.0)
    row_score = z.max(axis=1)
    top = float(row_score.max()) if row_score.size else math.nan
    flagged = np.flatnonzero(row_score >= threshold)
    flagged = flagged[np.argsort(-row_score[flagged])][:limit]
    out: list[dict[str, Any]] = []
    for r in flagged:
        col = int(np.argmax(z[r]))
        entry: dict[str, Any] = {
            "source": source,
            "batch_row": int(r),
            "column": col,
            "value": float(data[r, col]),
            "why": "extreme",
            "z": float(row_score[r]),
        }
        if index is not None and r < len(index):
            entry["dataset_row"] = int(index[r])
        out.append(entry)
    return top, out


class BatchChecker:
    """Per-update check of one stream of batches (inputs or targets)."""

    HISTORY = 16

    def __init__(self, source: str) -> None:
        self.source = source
        self._last: Any = None
        self._last_result: dict[str, Any] = {}
        self._ring: list[np.ndarray] = []
        self._reference: np.ndarray | None = None
        self._seen = 0
        self.scale_ratio: float | None = None

    def check(self, batch: Any, index: np.ndarray | None) -> dict[str, Any]:
        if batch is self._last and index is None:
            return self._last_result  # the same full batch again: nothing new to learn
        array = as_array(batch, self.source)
        result: dict[str, Any] = {}
        rows2d = _as_rows(array)
        prefix = "input" if self.source == "inputs" else "target"
        if rows2d is None:
            nf = _count_nonfinite(array)
            result[f"nf_{self.source}"] = nf
            self._remember(batch, result)
            return result
        if rows2d.dtype.kind in "iub":
            col_max = np.abs(rows2d).max(axis=0).astype(np.float64)
        else:
            col_max = np.maximum(rows2d.max(axis=0), -rows2d.min(axis=0)).astype(np.float64)
        absmax = float(col_max.max()) if col_max.size else 0.0
        rows: list[dict[str, Any]] = []
        if not math.isfinite(absmax) or not np.isfinite(col_max).all():
            nf, rows = nonfinite_rows(array, self.source, index)
            result[f"nf_{self.source}"] = nf
            finite_cols = col_max[np.isfinite(col_max)]
            absmax = float(finite_cols.max()) if finite_cols.size else math.nan
        else:
            result[f"nf_{self.source}"] = 0
            analyse = self._seen == 0
            if self._reference is not None:
                with np.errstate(all="ignore"):
                    jump = np.max(col_max / np.maximum(self._reference, 1e-300))
                analyse = analyse or bool(jump >= COLUMN_JUMP)
            if analyse:
                top, rows = robust_rows(array, self.source, index)
                if math.isfinite(top):
                    result["row_z"] = top
            if self._seen == 0 and self.source == "inputs" and col_max.size > 1:
                positive = col_max[col_max > 0]
                if positive.size > 1:
                    self.scale_ratio = float(positive.max() / np.median(positive))
                    result["input_scale_ratio"] = self.scale_ratio
                    result["input_scale_column"] = int(np.argmax(col_max))
            self._ring.append(col_max)
            if len(self._ring) > self.HISTORY:
                self._ring.pop(0)
            if self._reference is None or self._seen % 8 == 0:
                self._reference = np.median(np.stack(self._ring), axis=0)
        result[f"{prefix}_absmax"] = absmax
        if rows:
            result["rows"] = rows
        self._seen += 1
        self._remember(batch, result)
        return result

    def _remember(self, batch: Any, result: dict[str, Any]) -> None:
        self._last = batch
        self._last_result = result
