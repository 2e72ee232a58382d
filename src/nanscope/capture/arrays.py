"""Cheap per-update measures on numpy arrays (or anything with ``__array__``).

The Monitor calls these on every update, so each one is written to touch every element as few
times as possible:

* the norms of weights and gradients take one pass each; a finite sum of squares proves every
  element finite, so the exact non-finite count is only taken when it is not.
* a fixed strided sample of at most ``SAMPLE`` coordinates per tensor (weights now and before,
  gradient now and before) goes into a four-row buffer; one small matrix product of that buffer
  with itself yields the update, its cosines with the gradients, the gradient reversal and (by
  sign) the flips. No full copy of the model is kept: the previous weights are referenced only
  when the caller hands in a new array each update (``w = w - lr * g``).
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

#: coordinates per tensor kept for the update/cosine/sign-flip measures
SAMPLE = 4096
#: large weight tensors get an exact norm and finiteness pass every this many updates
FULL_EVERY = 16
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
    """Samples for one named tensor: rows 0/1 hold weights (now/before), rows 2/3 gradients.

    Tensors up to ``SAMPLE`` elements are kept whole (exact measures); larger ones through a fixed
    strided sample, so the cost of the update and cosine measures does not grow with the model.
    """

    __slots__ = ("buffer", "g_now", "has_prev_grad", "has_prev_param", "shape", "size", "stride",
                 "w_now")  # fmt: skip

    def __init__(self, size: int, shape: tuple[int, ...]) -> None:
        self.size = size
        self.shape = shape
        self.stride = max(1, -(-size // SAMPLE))
        count = len(range(0, size, self.stride))
        self.buffer = np.zeros((4, count), dtype=np.float64)
        self.has_prev_param = False
        self.has_prev_grad = False
        # which buffer row holds "now"; the other of the pair holds "before" (swapped, not copied)
        self.w_now = 0
        self.g_now = 2


def _sum_sq(flat: np.ndarray) -> float:
    if flat.dtype.kind == "c":
        return float(np.vdot(flat, flat).real)
    if flat.dtype.kind != "f" or flat.dtype.itemsize < 4:
        flat = flat.astype(np.float64)
    return float(np.dot(flat, flat))


class ParamTracker:
    """Keeps a sample of the previous weights and gradient, and measures each update against them.

    Gradient norms are exact (one pass each: a NaN anywhere in a gradient is caught before the
    step). Weight norms of large tensors are read off the sample, with an exact pass every
    ``FULL_EVERY`` updates. The applied update, its cosine
    with the gradient, the gradient reversal and the sign flips are measured on at most ``SAMPLE``
    fixed coordinates per tensor (all of them for smaller tensors); the update norm of a sampled
    tensor is scaled up from its sample.
    """

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self._last: dict[str, np.ndarray] = {}
        self._before: dict[str, np.ndarray] = {}
        self._count = 0
        self.keep_weights = True

    def measure(
        self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]
    ) -> dict[str, Any]:
        names = list(params) if params else list(grads)
        self._count += 1
        if params and grads and set(params) != set(grads):
            missing = sorted(set(params) ^ set(grads))
            raise UsageError(f"params and grads must have the same names; differ in {missing}")
        w_sq = g_sq = 0.0
        # sample-based sums: update.update, update.prev_grad, update.grad, grad.prev_grad, ...
        s_uu = s_upg = s_ug = s_gpg = s_pgpg = s_gg = 0.0
        u_sq_scaled = 0.0
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
                flat_w = w.reshape(-1)
                slot.w_now = 1 - slot.w_now
                sample = buf[slot.w_now]
                np.copyto(sample, flat_w[:: slot.stride].real)
                if slot.stride == 1 or self._count % FULL_EVERY == 0:
                    ww = _sum_sq(flat_w)
                    if not math.isfinite(ww):
                        nf = _count_nonfinite(w)
                        nf_params += nf
                        if nf == 0:  # finite but the sum of squares overflowed
                            ww = _sum_sq(flat_w.astype(np.float64))
                else:
                    # weights change by small steps: their norm is read off the sample; a NaN
                    # reaching them shows in the sample, in the loss, or at the next full pass
                    ww = float(np.dot(sample, sample)) * (slot.size / sample.size)
                    if not math.isfinite(ww):
                        nf_params += _count_nonfinite(w)
                w_sq += ww
                if self.keep_weights:
                    if name in self._last:
                        self._before[name] = self._last[name]
                    self._last[name] = w
            if g is not None:
                flat_g = g.reshape(-1)
                gg = _sum_sq(flat_g)
                if not math.isfinite(gg):
                    nf = _count_nonfinite(g)
                    nf_grads += nf
                    if nf == 0:
                        gg = _sum_sq(flat_g.astype(np.float64))
                g_sq += gg
                grad_norms[name] = math.sqrt(gg) if gg >= 0 else math.nan
                slot.g_now = 5 - slot.g_now
                np.copyto(buf[slot.g_now], flat_g[:: slot.stride].real)
            gram = buf @ buf.T
            wn, wp, gn, gp = slot.w_now, 1 - slot.w_now, slot.g_now, 5 - slot.g_now
            scale = slot.size / buf.shape[1]
            if w is not None and slot.has_prev_param:
                uu = float(gram[wn, wn]) - 2.0 * float(gram[wn, wp]) + float(gram[wp, wp])
                s_uu += max(uu, 0.0)
                u_sq_scaled += max(uu, 0.0) * scale
                if slot.has_prev_grad:
                    s_upg += float(gram[wn, gp]) - float(gram[wp, gp])
                    s_pgpg += float(gram[gp, gp])
                if g is not None:
                    s_ug += float(gram[wn, gn]) - float(gram[wp, gn])
                    s_gg += float(gram[gn, gn])
                now, before = buf[wn], buf[wp]
                flips += int(np.count_nonzero((now * before) < 0.0))
                flip_total += int(np.count_nonzero(before))
            elif w is not None or params:
                have_update = False
            if g is not None and slot.has_prev_grad:
                s_gpg += float(gram[gn, gp])
                if not (w is not None and slot.has_prev_param):
                    s_pgpg += float(gram[gp, gp])
                    s_gg += float(gram[gn, gn])
            elif g is not None:
                have_prev_grad = False
            if w is not None:
                slot.has_prev_param = True
            if g is not None:
                slot.has_prev_grad = True
        out: dict[str, Any] = {}
        if params:
            out["weight_norm"] = math.sqrt(w_sq) if w_sq >= 0 else math.nan
            out["nf_params"] = nf_params
        if grads:
            out["grad_norm"] = math.sqrt(g_sq) if g_sq >= 0 else math.nan
            out["nf_grads"] = nf_grads
            if len(grad_norms) > 1:
                out["grad_norms"] = grad_norms
        if params and have_update:
            out["update_norm"] = math.sqrt(u_sq_scaled)
            u_norm = math.sqrt(s_uu)
            if grads and u_norm > 0:
                if have_prev_grad and s_pgpg > 0:
                    out["update_cos"] = _clip_cos(s_upg / (u_norm * math.sqrt(s_pgpg)))
                if s_gg > 0:
                    out["update_cos_same"] = _clip_cos(s_ug / (u_norm * math.sqrt(s_gg)))
            if flip_total:
                out["flip_frac"] = flips / flip_total
        if grads and have_prev_grad and s_pgpg > 0 and s_gg > 0:
            out["grad_cos"] = _clip_cos(s_gpg / math.sqrt(s_gg * s_pgpg))
        return out

    def snapshot_previous(self) -> dict[str, np.ndarray]:
        """The weights as they were one update ago (copies), when the caller gave new arrays."""
        return {k: np.array(v, copy=True) for k, v in self._before.items()}

    def snapshot_current(self) -> dict[str, np.ndarray]:
        """The weights seen at the latest update (copies)."""
        return {k: np.array(v, copy=True) for k, v in self._last.items()}


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
        if self._ring and self._ring[-1].shape != col_max.shape:
            # batches of another width (variable sequence length): start a new history
            self._ring.clear()
            self._reference = None
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
