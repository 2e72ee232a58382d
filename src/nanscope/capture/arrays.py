"""Cheap per-update measures on numpy arrays (or anything with ``__array__``).

The Monitor calls these on every update, so each one is written to touch every element as few
times as possible:

* the norms of gradients take one pass each; a finite sum of squares proves every element
  finite, so the exact non-finite count is only taken when it is not.
* a fixed sample of at most ``SAMPLE`` coordinates per tensor, in ``CHUNKS`` contiguous runs
  (weights now and before, gradient now and before), goes into one shared four-row buffer; a
  few dot products of its rows yield the gradient reversal (every update) and, where the
  detectors read them (a rising loss) and on a schedule, the update, its cosines with the
  gradients, the norms of large weight tensors and (by sign) the flips.
  No full copy of the model is kept: the previous weights are referenced only when the caller
  hands in a new array each update (``w = w - lr * g``).
* an input batch is checked every ``CHECK_EVERY`` updates (:data:`BATCH_CHECKS`), and always
  when the update went non-finite: one read-only pass (a finite sum proves every value
  finite), or, every ``COLUMN_EVERY`` batches, a column-wise max and min that give
  ``input_absmax`` and the jump trigger. The Monitor keeps the last batches, and its failure
  probe examines them row by row.
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
from nanscope.numerics import OUTLIER_Z, RAW_UNITS
from nanscope.schedule import Every, Rises

__all__ = ["BatchChecker", "ParamTracker", "as_array", "as_named", "nonfinite_rows", "robust_rows",
           "typo_rows"]  # fmt: skip

#: coordinates per tensor kept for the update/cosine/sign-flip measures
SAMPLE = 1024
#: the sample of a large tensor is taken in this many contiguous runs
CHUNKS = 8
#: large weight tensors get an exact norm and finiteness pass every this many updates
EXACT_WEIGHTS_EVERY = 16
#: the exact weight pass: the first update of every ``EXACT_WEIGHTS_EVERY``
EXACT_WEIGHTS = Every(EXACT_WEIGHTS_EVERY, offset=1)
#: the weight sample on the schedule (a point for the plots and the rules): the first two updates
#: of every ``EXACT_WEIGHTS_EVERY`` (ParamTracker.measure writes it out: a test pins the two)
WEIGHT_SAMPLES = Every(EXACT_WEIGHTS_EVERY, offset=1, span=2)
#: a row is "extreme" when one of its values lies this many robust standard deviations out
EXTREME_Z = 20.0
#: a column max this many times its recent typical max triggers the row analysis
COLUMN_JUMP = 8.0
#: a batch is checked every this many updates (and always when the update went non-finite)
CHECK_EVERY = 8
#: of those, column maxima (absmax, the jump trigger) every this many batches; else a sum pass
COLUMN_EVERY = 4 * CHECK_EVERY
#: the batches checked (counted from 0), and those of them whose column maxima are taken
BATCH_CHECKS = Every(CHECK_EVERY)
COLUMN_CHECKS = Every(COLUMN_EVERY)
#: rows described at most per array by :func:`nonfinite_rows` and :func:`robust_rows`
ROWS_DESCRIBED = 5

_F64 = np.dtype(np.float64)
_F32 = np.dtype(np.float32)


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
    if type(value) is dict:
        # the common case, {str: ndarray}, is used as it is (nanscope never changes it)
        for k, v in value.items():
            if type(k) is not str or type(v) is not np.ndarray:
                break
        else:
            return value
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
    chunked sample whose values are scaled by ``sqrt(size / sample)`` as they are written, so that
    sums of products over the buffer estimate sums over the whole tensor (the signs, and so the
    flips, are those of the weights). One buffer for all tensors: the measures are a few short
    dot products of its rows.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = dict(shapes)
        offset = 0
        spans: list[tuple[str, slice, np.ndarray | None, float, tuple[int, ...]]] = []
        for name, shape in shapes.items():
            size = int(np.prod(shape)) if shape else 1
            picks = _sample_indices(size)
            count = size if picks is None else picks.size
            spans.append((name, slice(offset, offset + count), picks, math.sqrt(size / count),
                          shape))  # fmt: skip
            offset += count
        width = max(offset, 1)
        # rows: 0/1 weights (now/before), 2/3 gradients (now/before); roles swap, data stays
        self.buffer = np.zeros((4, width), dtype=np.float64)
        self.scale = np.ones(width, dtype=np.float64)
        self.scratch = np.empty(width, dtype=np.float64)
        self.rows = list(self.buffer)  # each row's view, made once
        #: name -> (shape, sample indices or None for "all", its view of each buffer row: the
        #: tensor's shape when whole, flat when sampled)
        self.slices: dict[str, tuple[tuple[int, ...], np.ndarray | None, list[np.ndarray]]] = {}
        for name, where, picks, scale, shape in spans:
            self.scale[where] = scale
            # a whole tensor's views have its shape: copied in without a reshape
            views = [self.buffer[r, where] for r in range(4)]
            if picks is None:
                views = [v.reshape(shape) for v in views]
            self.slices[name] = (shape, picks, views)
        self.w_now, self.g_now = 0, 2
        self.has_param = False  # the other weight row holds the previous update's sample
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
    elif flat.dtype == out.dtype:
        flat.take(picks, out=out, mode="clip")
    else:  # take writes only its own dtype: float32 and friends go through a small temporary
        out[...] = flat.take(picks, mode="clip")


def _sum_sq(array: np.ndarray) -> float:
    """Sum of squares of any array, one pass (``vdot`` flattens it and never warns: an overflow
    is the answer, inf)."""
    kind = array.dtype.kind
    if kind == "c":
        return float(np.vdot(array, array).real)
    if kind != "f" or array.dtype.itemsize < 4:
        array = array.astype(np.float64)
    return float(np.vdot(array, array))


class _Changed(Exception):
    """A tensor's name or shape is not the layout's: validate and lay the buffer out again."""


class ParamTracker:
    """Keeps a sample of the previous weights and gradient, and measures each update against them.

    Every update: the exact gradient norms, one pass per tensor (a NaN anywhere in a gradient is
    caught before the step), the gradient's fixed sample into the shared buffer and its cosine
    with the previous one (the reversal). Where a detector reads them (a rising loss, see
    :meth:`wants_sample`) and on the schedule, the weights' sample too, and from a few short dot
    products of the buffer's rows (exact for tensors of at most ``SAMPLE`` elements): the applied
    update, its cosines with the gradients, the sign flips and the weights' norm and finiteness.
    The exact weight norm and finiteness pass every ``EXACT_WEIGHTS_EVERY`` updates
    (:data:`EXACT_WEIGHTS`) and when a gradient is non-finite.
    """

    def __init__(self) -> None:
        self._layout: _Layout | None = None
        self._last: dict[str, np.ndarray] = {}
        self._before: dict[str, np.ndarray] = {}
        self._count = 0
        self._nonzero_now = 0  # non-zero entries of the newest weight sample: the next "before"
        self._gg_sample = math.nan  # squared norm of the newest gradient sample
        self._gg_before = math.nan  # and of the one before it
        self._sampled_last = False  # the previous update's weight sample is in the buffer
        self._grads_seen = False  # a previous gradient sample is in the buffer
        self._rises = Rises()  # the loss's rises in a row
        #: take the sample on every update (the tests compare the detectors' decisions both ways)
        self.every_update = False

    def _relayout(
        self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]
    ) -> _Layout:
        """Check names and shapes (a clear error), and lay out the buffer for them: the history
        starts again."""
        if params and grads and params.keys() != grads.keys():
            missing = sorted(set(params) ^ set(grads))
            raise UsageError(f"params and grads must have the same names; differ in {missing}")
        if params and grads:
            for name, w in params.items():
                if grads[name].shape != w.shape:
                    raise UsageError(
                        f"params[{name!r}] has shape {w.shape} but grads[{name!r}] has "
                        f"{grads[name].shape}"
                    )
        ref = params or grads
        shapes = {name: tuple(array.shape) for name, array in ref.items()}
        layout = self._layout
        if layout is None or layout.shapes != shapes:
            layout = self._layout = _Layout(shapes)
            # the history starts again with the new buffer
            self._sampled_last = self._grads_seen = False
            self._gg_sample = self._gg_before = math.nan
            self._nonzero_now = 0
        return layout

    def measure(
        self,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        loss: float | None = None,
    ) -> dict[str, Any]:
        """This update's measures. With ``loss``, the weight sample (the update, its cosines,
        the flips) is taken only where a detector reads it (see :meth:`wants_sample`); without,
        on every update. The gradient's is taken every update: it is in cache after its norm."""
        layout = self._layout
        ref = params or grads
        if (
            layout is None
            or len(ref) != len(layout.slices)
            or (params and grads and len(params) != len(grads))
        ):
            layout = self._relayout(params, grads)
        self._count += 1
        if loss is None or self.every_update:
            sample = True
        else:  # wants_sample, inline: it runs on every update (WEIGHT_SAMPLES written out)
            sample = (
                self._rises.see(loss) >= 2
                or (self._count - 1) % EXACT_WEIGHTS_EVERY < 2
                or loss - loss != 0.0  # inf or NaN
            )
        out: dict[str, Any] = {}
        try:
            sample = self._fill(layout, params, grads, out, sample)
        except _Changed:  # a name or a shape changed: validated, laid out again, from scratch
            layout = self._relayout(params, grads)
            out = {}
            sample = self._fill(layout, params, grads, out, sample)
        self._sampled_last = sample
        if params:
            # references, not copies: the caller's step makes new arrays or mutates these
            self._before, self._last = self._last, dict(params)
        return out

    def wants_sample(self, loss: float) -> bool:
        """Whether this update's weight sample is read: the divergence and ascent detectors read
        the update's cosines and the flips only over a run of rising losses (the divergence
        detector from the fourth rise, the ascent detector from the fifth), so it is taken from
        the second rise in a row on (the measures, which need the previous sample, from the
        third), at a non-finite loss, and on :data:`WEIGHT_SAMPLES` (a point for the plots and
        the rules). A noisy loss rises twice in a row about one update in four. The gradient
        reversal needs no weights: it is measured every update."""
        rises = self._rises.see(loss)
        return rises >= 2 or WEIGHT_SAMPLES.due(self._count) or not math.isfinite(loss)
        # (measure inlines this: keep the two the same)

    def _fill(
        self,
        layout: _Layout,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        out: dict[str, Any],
        sample: bool,
    ) -> bool:
        """The gradients, then the weights when they are wanted; whether the weights were
        sampled."""
        broken = self._grads(layout, grads, out, sample) if grads else False
        if not params or not (sample or broken or EXACT_WEIGHTS.due(self._count)):
            return False
        # overflow and inf - inf here are answers, not warnings
        with np.errstate(over="ignore", invalid="ignore"):
            self._weights(layout, params, out, sample, broken)
        return sample

    def _grads(
        self, layout: _Layout, grads: Mapping[str, np.ndarray], out: dict[str, Any], sample: bool
    ) -> bool:
        """Every update: each gradient's norm (one BLAS pass; a finite sum of squares proves
        every element finite) and its sample into the buffer. True when one is non-finite.
        The per-tensor norms go into the record with the weight sample and when one is not
        finite (the layer that broke), not on every update.

        Written flat (no helper call per tensor): it runs on every update, for every tensor."""
        slices = layout.slices
        gn = 5 - layout.g_now
        nf_grads = 0
        g_sq = 0.0
        grad_norms: dict[str, float] = {}
        for name, g in grads.items():
            entry = slices.get(name)
            if entry is None or entry[0] != g.shape:
                raise _Changed
            dtype = g.dtype
            # vdot flattens any layout in one call, and an overflow is inf, not a warning
            gg = float(np.vdot(g, g)) if dtype is _F64 or dtype is _F32 else _sum_sq(g)
            if not gg < math.inf:  # inf or NaN
                nf = _count_nonfinite(g)
                nf_grads += nf
                if nf == 0:  # finite but the sum of squares overflowed
                    gg = _sum_sq(g.astype(np.float64))
            g_sq += gg
            grad_norms[name] = math.sqrt(gg) if gg >= 0 else math.nan
            picks, view = entry[1], entry[2][gn]  # sampled while it is in cache
            if picks is None:
                np.copyto(view, g, casting="unsafe")
            elif dtype is _F64:
                g.take(picks, out=view, mode="clip")  # flat indices into any layout
            else:
                _sample_into(g.reshape(-1), picks, view)
        layout.g_now = gn
        row = layout.rows[gn]
        if not layout.exact_weights:
            if g_sq < math.inf:  # every value below 1e154: scaled, it cannot overflow
                np.multiply(row, layout.scale, out=row)
            else:
                with np.errstate(over="ignore", invalid="ignore"):
                    np.multiply(row, layout.scale, out=row)
        out["grad_norm"] = math.sqrt(g_sq) if g_sq >= 0 else math.nan
        out["nf_grads"] = nf_grads
        if len(grad_norms) > 1 and (sample or not g_sq < math.inf):
            out["grad_norms"] = grad_norms
        # the gradient's cosine with the previous one (its reversal), every update; the weight
        # measures (after this) still read the previous sample's norm, so it is kept aside
        gg_now = float(np.vdot(row, row))  # vdot, not dot: it never warns on inf or NaN
        gg_before = self._gg_before = self._gg_sample
        self._gg_sample = gg_now
        if self._grads_seen and gg_now > 0 and gg_before > 0:
            reversal = float(np.vdot(row, layout.rows[5 - gn])) / math.sqrt(gg_now * gg_before)
            # in range, as nearly always: no call (it runs every update)
            out["grad_cos"] = reversal if -1.0 <= reversal <= 1.0 else _clip_cos(reversal)
        self._grads_seen = True
        return nf_grads > 0

    def _weights(
        self,
        layout: _Layout,
        params: Mapping[str, np.ndarray],
        out: dict[str, Any],
        sample: bool,
        broken: bool,
    ) -> None:
        """The weight sample (when wanted) with the update measures against the previous one,
        and the weight norm and finiteness: exact on the schedule and when the update broke (a
        sample of small tensors only is exact already), else estimated from the sample."""
        slices = layout.slices
        exact_pass = (broken or EXACT_WEIGHTS.due(self._count)) and not (
            sample and layout.exact_weights
        )
        wn = 1 - layout.w_now
        nf_params = 0
        w_exact = 0.0
        for name, w in params.items():
            entry = slices.get(name)
            if entry is None or entry[0] != w.shape:
                raise _Changed
            if sample:
                picks, view = entry[1], entry[2][wn]
                if picks is None:
                    np.copyto(view, w, casting="unsafe")
                elif w.dtype is _F64:
                    w.take(picks, out=view, mode="clip")
                else:
                    _sample_into(w.reshape(-1), picks, view)
            if exact_pass:
                ww = _sum_sq(w)
                if not ww < math.inf:
                    nf_params += _count_nonfinite(w)
                w_exact += ww
        if sample:
            layout.w_now = wn
            row = layout.buffer[wn]
            if not layout.exact_weights:
                np.multiply(row, layout.scale, out=row)
            if not self._sampled_last:  # the other weight row holds an older update
                layout.has_param = False
            self._update(layout, out, row, bool(out.get("grad_norm") is not None))
            layout.has_param = True
        if exact_pass:
            ww = w_exact
        else:
            ww = float(np.vdot(row, row))
            if not ww < math.inf:
                nf_params = sum(_count_nonfinite(w) for w in params.values())
        out["weight_norm"] = math.sqrt(ww) if ww >= 0 else math.nan
        out["nf_params"] = nf_params

    def _update(self, layout: _Layout, out: dict[str, Any], w_now: np.ndarray, grads: bool) -> None:
        """The applied update against the previous weight sample: its norm, its cosines with the
        previous gradient (the one it was made from) and the current one, the sign flips. From
        the buffer's rows, already scaled: sums over them estimate sums over the whole tensors."""
        buf = layout.buffer
        nonzero_before = self._nonzero_now
        self._nonzero_now = int(np.count_nonzero(w_now))
        if not layout.has_param:
            return
        w_before = buf[1 - layout.w_now]
        update = np.subtract(w_now, w_before, out=layout.scratch)
        u_norm = math.sqrt(float(np.vdot(update, update)))
        out["update_norm"] = u_norm
        if grads and u_norm > 0:
            # the gradient rows: this update's was written already, the previous one's is the other
            gg_now, gg_before = self._gg_sample, self._gg_before
            if gg_before > 0:
                u_pg = float(np.vdot(update, buf[5 - layout.g_now]))
                out["update_cos"] = _clip_cos(u_pg / (u_norm * math.sqrt(gg_before)))
            if gg_now > 0:
                u_g = float(np.vdot(update, buf[layout.g_now]))
                out["update_cos_same"] = _clip_cos(u_g / (u_norm * math.sqrt(gg_now)))
        if nonzero_before:
            product = np.multiply(w_now, w_before, out=layout.scratch)
            out["flip_frac"] = int(np.count_nonzero(product < 0.0)) / nonzero_before

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
    array: np.ndarray, source: str, index: np.ndarray | None = None, limit: int = ROWS_DESCRIBED
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
    limit: int = ROWS_DESCRIBED,
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


def typo_rows(array: np.ndarray, source: str) -> list[dict[str, Any]]:
    """The rows of a batch holding a finite value past ``RAW_UNITS`` that is ``OUTLIER_Z``
    robust standard deviations from its column's median: a typo, 5e7 among values of order one
    (every row it flags, largest first; :func:`robust_rows`)."""
    _, rows = robust_rows(array, source, threshold=OUTLIER_Z, limit=max(1, len(array)))
    return [r for r in rows if abs(r["value"]) > RAW_UNITS]


class BatchChecker:
    """Per-update check of one stream of batches (inputs or targets)."""

    HISTORY = 16

    def __init__(self, source: str) -> None:
        self.source = source
        self._last: Any = None
        self._last_result: dict[str, Any] = {}
        self._ring: list[np.ndarray] = []
        self._inverse: np.ndarray | None = None  # 1 / typical column max (0 where none)
        self._seen = 0  # batches offered
        self._columns = 0  # column checks made
        self.scale_ratio: float | None = None

    def check(
        self, batch: Any, index: np.ndarray | None, *, force: bool = False
    ) -> dict[str, Any]:
        """Check one batch on the schedule (every ``CHECK_EVERY``-th batch: a finiteness pass,
        every second of those the column maxima too), or fully now with ``force`` (the update
        went non-finite: its batch is the evidence). An unchecked batch gives ``{}``."""
        if batch is self._last and index is None and not force:
            return self._last_result  # the same full batch again: nothing new to learn
        seen = self._seen
        self._seen = seen + 1
        if seen % CHECK_EVERY and not force:  # BATCH_CHECKS, written out: every update
            return {}  # the kept recent batches are examined when the fit breaks
        array = as_array(batch, self.source)
        result: dict[str, Any] = {}
        rows2d = _as_rows(array)
        prefix = "input" if self.source == "inputs" else "target"
        if rows2d is None:
            nf = _count_nonfinite(array)
            result[f"nf_{self.source}"] = nf
            self._remember(batch, result)
            return result
        columns = force or COLUMN_CHECKS.due(seen)
        if rows2d.dtype.kind in "iub":
            # integers (class labels) cannot be NaN or inf and have no rows to call extreme
            result[f"nf_{self.source}"] = 0
            if columns and rows2d.size:
                result[f"{prefix}_absmax"] = float(max(int(rows2d.max()), -int(rows2d.min())))
            self._remember(batch, result)
            return result
        if not columns:
            # one read-only pass: a finite sum proves every value finite
            total = float(np.add.reduce(rows2d, axis=None))
            if math.isfinite(total):
                result[f"nf_{self.source}"] = 0
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
            analyse = seen == 0
            if self._inverse is not None:
                analyse = analyse or float(np.max(col_max * self._inverse)) >= COLUMN_JUMP
            if analyse:
                top, rows = robust_rows(array, self.source, index)
                if math.isfinite(top):
                    result["row_z"] = top
            if seen == 0 and self.source == "inputs" and col_max.size > 1:
                positive = col_max[col_max > 0]
                if positive.size > 1:
                    self.scale_ratio = float(positive.max() / np.median(positive))
                    result["input_scale_ratio"] = self.scale_ratio
                    result["input_scale_column"] = int(np.argmax(col_max))
            self._ring.append(col_max)
            if len(self._ring) > self.HISTORY:
                self._ring.pop(0)
            self._columns += 1
            if self._inverse is None or self._columns % 8 == 0:
                reference = np.median(np.stack(self._ring), axis=0)
                with np.errstate(divide="ignore"):
                    self._inverse = np.where(reference > 0, 1.0 / reference, 0.0)
        result[f"{prefix}_absmax"] = absmax
        if rows:
            result["rows"] = rows
        self._remember(batch, result)
        return result

    def _remember(self, batch: Any, result: dict[str, Any]) -> None:
        self._last = batch
        self._last_result = result
