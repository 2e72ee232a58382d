"""Cheap per-update measures on numpy arrays (or anything with ``__array__``).

The Monitor calls these on every update, so each one is written to touch every element as few
times as possible:

* the norms of gradients take one pass each; a finite sum of squares proves every element
  finite, so the exact non-finite count is only taken when it is not.
* a fixed sample of at most ``SAMPLE`` coordinates per tensor, in ``CHUNKS`` contiguous runs
  (weights now and before, gradient now and before), goes into one shared four-row buffer; one
  small matrix product of that buffer with itself yields the update, its cosines with the
  gradients, the gradient reversal, the norms of large weight tensors and (by sign) the flips.
  No full copy of the model is kept: the previous weights are referenced only when the caller
  hands in a new array each update (``w = w - lr * g``).
* an input batch costs one read-only pass (a finite sum proves every value finite); every
  ``COLUMN_EVERY`` batches a column-wise max and min give ``input_absmax`` and the jump trigger.
  Row-level robust z-scores are computed only when a column's maximum jumps far beyond its
  history, on the first batch, or when a value is non-finite; the failure probe recomputes them
  on the last batches anyway.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from nanscope.errors import UsageError

__all__ = ["BatchChecker", "ParamTracker", "as_array", "as_named", "nonfinite_rows", "robust_rows"]

#: coordinates per tensor kept for the update/cosine/sign-flip measures
SAMPLE = 1024
#: the sample of a large tensor is taken in this many contiguous runs
CHUNKS = 8
#: large weight tensors get an exact norm and finiteness pass every this many updates
FULL_EVERY = 16
#: a row is "extreme" when one of its values lies this many robust standard deviations out
EXTREME_Z = 20.0
#: a column max this many times its recent typical max triggers the row analysis
COLUMN_JUMP = 8.0
#: column maxima (absmax, the jump trigger) every this many batches; a finiteness pass always
COLUMN_EVERY = 4
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
        out: dict[str, np.ndarray] = {}
        for k, v in value.items():
            # numpy arrays pass straight through; only other types pay for a name in messages
            out[k if isinstance(k, str) else str(k)] = (
                v if type(v) is np.ndarray else as_array(v, f"{name}[{k!r}]")
            )
        return out
    if isinstance(value, (list, tuple)):
        return {str(i): as_array(v, f"{name}[{i}]") for i, v in enumerate(value)}
    return {"0": as_array(value, name)}


def _count_nonfinite(array: np.ndarray) -> int:
    return int(array.size - np.count_nonzero(np.isfinite(array)))


class _Layout:
    """Where each named tensor's sample sits in the shared buffer.

    Tensors up to ``SAMPLE`` elements are kept whole (exact measures); larger ones through a fixed
    chunked sample whose columns weigh ``size / sample`` in the product, so that sums over the
    buffer estimate sums over the whole tensor. One buffer for all tensors means one small matrix
    product per update.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = dict(shapes)
        # name -> (its slice of the buffer, sample indices or None for "all", scale)
        self.slices: dict[str, tuple[slice, np.ndarray | None, float]] = {}
        offset = 0
        for name, shape in shapes.items():
            size = int(np.prod(shape)) if shape else 1
            picks = _sample_indices(size)
            count = size if picks is None else picks.size
            self.slices[name] = (slice(offset, offset + count), picks, math.sqrt(size / count))
            offset += count
        # rows: 0/1 weights (now/before), 2/3 gradients (now/before); roles swap, data stays
        self.buffer = np.zeros((4, max(offset, 1)), dtype=np.float64)
        self.weights = np.ones(max(offset, 1), dtype=np.float64)
        self.scratch = np.empty_like(self.buffer)
        for where, _, scale in self.slices.values():
            self.weights[where] = scale * scale
        self.w_now, self.g_now = 0, 2
        self.has_param = self.has_grad = False
        self.exact_weights = all(picks is None for _, picks, _ in self.slices.values())


def _sample_indices(size: int) -> np.ndarray | None:
    """``SAMPLE`` coordinates in ``CHUNKS`` contiguous runs spread evenly over a large tensor.

    Contiguous runs touch few cache lines, so a sample costs a small fraction of a full pass;
    spreading them covers every part of the tensor (every layer row block, every bias).
    """
    if size <= SAMPLE:
        return None
    run = SAMPLE // CHUNKS
    starts = np.linspace(0, size - run, CHUNKS).astype(np.int64)
    return (starts[:, None] + np.arange(run)[None, :]).reshape(-1)


def _sample_into(flat: np.ndarray, picks: np.ndarray | None, out: np.ndarray) -> None:
    if flat.dtype.kind == "c":
        flat = flat.real
    if picks is None:
        np.copyto(out, flat, casting="unsafe")
    else:
        np.take(flat, picks, out=out, mode="clip")


def _sum_sq(flat: np.ndarray) -> float:
    if flat.dtype.kind == "c":
        return float(np.vdot(flat, flat).real)
    if flat.dtype.kind != "f" or flat.dtype.itemsize < 4:
        flat = flat.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the answer, not a warning
        return float(np.dot(flat, flat))


class ParamTracker:
    """Keeps a sample of the previous weights and gradient, and measures each update against them.

    Gradient norms are exact, one pass per tensor: a NaN anywhere in a gradient is caught before
    the step. The applied update, its cosine with the gradient, the gradient reversal, the sign
    flips and the norms of large weight tensors are measured on the shared sample (exact for
    tensors of at most ``SAMPLE`` elements), with an exact weight pass every ``FULL_EVERY``
    updates.
    """

    def __init__(self) -> None:
        self._layout: _Layout | None = None
        self._last: dict[str, np.ndarray] = {}
        self._before: dict[str, np.ndarray] = {}
        self._count = 0

    def measure(
        self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]
    ) -> dict[str, Any]:
        if params and grads and params.keys() != grads.keys():
            missing = sorted(set(params) ^ set(grads))
            raise UsageError(f"params and grads must have the same names; differ in {missing}")
        ref = params or grads
        shapes = {name: tuple(array.shape) for name, array in ref.items()}
        if params and grads:
            for name, w in params.items():
                if grads[name].shape != w.shape:
                    raise UsageError(
                        f"params[{name!r}] has shape {w.shape} but grads[{name!r}] has "
                        f"{grads[name].shape}"
                    )
        layout = self._layout
        if layout is None or layout.shapes != shapes:
            layout = self._layout = _Layout(shapes)  # new model shape: history starts again
        self._count += 1
        buf = layout.buffer
        out: dict[str, Any] = {}
        full = layout.exact_weights or self._count % FULL_EVERY == 1
        if params:
            layout.w_now = 1 - layout.w_now
            row = buf[layout.w_now]
            nf_params = 0
            w_exact = 0.0
            for name, w in params.items():
                where, picks, _ = layout.slices[name]
                flat = w.reshape(-1)
                _sample_into(flat, picks, row[where])
                if full and picks is not None:
                    ww = _sum_sq(flat)
                    if not math.isfinite(ww):
                        nf_params += _count_nonfinite(w)
                    w_exact += ww
                # references, not copies: the caller's step makes new arrays or mutates these
                if name in self._last:
                    self._before[name] = self._last[name]
                self._last[name] = w
        if grads:
            layout.g_now = 5 - layout.g_now
            row = buf[layout.g_now]
            nf_grads = 0
            g_sq = 0.0
            grad_norms: dict[str, float] = {}
            for name, g in grads.items():
                where, picks, _ = layout.slices[name]
                flat = g.reshape(-1)
                gg = _sum_sq(flat)
                if not math.isfinite(gg):
                    nf = _count_nonfinite(g)
                    nf_grads += nf
                    if nf == 0:  # finite but the sum of squares overflowed
                        gg = _sum_sq(flat.astype(np.float64))
                g_sq += gg
                grad_norms[name] = math.sqrt(gg) if gg >= 0 else math.nan
                _sample_into(flat, picks, row[where])
        # each column weighted by size/sample of its tensor: sums over the buffer estimate sums
        # over the whole tensors; 16 Python floats are cheaper to index than numpy scalars
        np.multiply(buf, layout.weights, out=layout.scratch)  # preallocated: no page faults
        gram = (layout.scratch @ buf.T).tolist()
        wn, wp, gn, gp = layout.w_now, 1 - layout.w_now, layout.g_now, 5 - layout.g_now
        if params:
            ww = gram[wn][wn]
            if full and not layout.exact_weights:
                small = sum(
                    float(np.dot(buf[wn, sl], buf[wn, sl]))
                    for sl, picks, _ in layout.slices.values()
                    if picks is None
                )  # exact: small tensors are kept whole
                ww = w_exact + small
            elif not math.isfinite(ww):
                nf_params = sum(_count_nonfinite(w) for w in params.values())
            if layout.exact_weights and not math.isfinite(ww):
                nf_params = sum(_count_nonfinite(w) for w in params.values())
            out["weight_norm"] = math.sqrt(ww) if ww >= 0 else math.nan
            out["nf_params"] = nf_params
        if grads:
            out["grad_norm"] = math.sqrt(g_sq) if g_sq >= 0 else math.nan
            out["nf_grads"] = nf_grads
            if len(grad_norms) > 1:
                out["grad_norms"] = grad_norms
        if params and layout.has_param:
            uu = max(gram[wn][wn] - 2.0 * gram[wn][wp] + gram[wp][wp], 0.0)
            u_norm = math.sqrt(uu)
            out["update_norm"] = u_norm
            if grads and u_norm > 0:
                if layout.has_grad and gram[gp][gp] > 0:
                    u_pg = gram[wn][gp] - gram[wp][gp]
                    out["update_cos"] = _clip_cos(u_pg / (u_norm * math.sqrt(gram[gp][gp])))
                if gram[gn][gn] > 0:
                    u_g = gram[wn][gn] - gram[wp][gn]
                    out["update_cos_same"] = _clip_cos(u_g / (u_norm * math.sqrt(gram[gn][gn])))
            before = buf[wp]
            total = int(np.count_nonzero(before))
            if total:
                product = np.multiply(buf[wn], before, out=layout.scratch[0])
                out["flip_frac"] = int(np.count_nonzero(product < 0.0)) / total
        if grads and layout.has_grad and gram[gn][gn] > 0 and gram[gp][gp] > 0:
            reversal = gram[gn][gp] / math.sqrt(gram[gn][gn] * gram[gp][gp])
            out["grad_cos"] = _clip_cos(reversal)
        layout.has_param = layout.has_param or bool(params)
        layout.has_grad = layout.has_grad or bool(grads)
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
        # a column that is mostly one value (padding, one-hot) has a tiny scale: its other values
        # only count as extreme when they are also far out against the whole batch's spread
        overall = 1.4826 * float(np.nanmedian(np.abs(data - np.nanmedian(data))))
        if not overall > 0:
            overall = float(np.nanstd(data))
        if overall > 0:
            z = np.where(dev >= threshold * overall, z, np.minimum(z, dev / overall))
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
        self._inverse: np.ndarray | None = None  # 1 / typical column max (0 where none)
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
            # integers (class labels) cannot be NaN or inf and have no rows to call extreme
            absmax_int = float(max(int(rows2d.max()), -int(rows2d.min()))) if rows2d.size else 0.0
            result[f"nf_{self.source}"] = 0
            result[f"{prefix}_absmax"] = absmax_int
            self._seen += 1
            self._remember(batch, result)
            return result
        if self._seen % COLUMN_EVERY:
            # between column checks one read-only pass: a finite sum proves every value finite
            total = float(np.add.reduce(rows2d, axis=None))
            if math.isfinite(total):
                result[f"nf_{self.source}"] = 0
                self._seen += 1
                self._remember(batch, result)
                return result
        col_max = np.maximum(rows2d.max(axis=0), -rows2d.min(axis=0))
        absmax = float(col_max.max()) if col_max.size else 0.0  # NaN propagates through max
        if self._ring and self._ring[-1].shape != col_max.shape:
            # batches of another width (variable sequence length): start a new history
            self._ring.clear()
            self._inverse = None
        rows: list[dict[str, Any]] = []
        if not math.isfinite(absmax):
            nf, rows = nonfinite_rows(array, self.source, index)
            result[f"nf_{self.source}"] = nf
            finite_cols = col_max[np.isfinite(col_max)]
            absmax = float(finite_cols.max()) if finite_cols.size else math.nan
        else:
            result[f"nf_{self.source}"] = 0
            analyse = self._seen == 0
            if self._inverse is not None:
                analyse = analyse or float(np.max(col_max * self._inverse)) >= COLUMN_JUMP
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
            if self._inverse is None or self._seen % 8 == 0:
                reference = np.median(np.stack(self._ring), axis=0)
                with np.errstate(divide="ignore"):
                    self._inverse = np.where(reference > 0, 1.0 / reference, 0.0)
        result[f"{prefix}_absmax"] = absmax
        if rows:
            result["rows"] = rows
        self._seen += 1
        self._remember(batch, result)
        return result

    def _remember(self, batch: Any, result: dict[str, Any]) -> None:
        self._last = batch
        self._last_result = result
