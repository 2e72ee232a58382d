"""Fused per-update measures on torch tensors, the torch mirror of :mod:`nanscope.capture.arrays`.

One :class:`ParamMeasure` per optimizer. Each update it costs:

* one pass over the gradients (on CPU a dot product per tensor, the small ones of a model of many
  small layers stacked in a few buffers first; else one ``torch._foreach_norm`` per dtype group);
  a finite norm proves every element finite, so exact non-finite counts are only taken when a
  norm is not finite.
  The weights get the same on full updates (``device_vector(full=True)``);
* when sampled: one ``torch.cat`` of fixed block views of the weights and one of the gradients
  into a 6 x K buffer (64 blocks of :data:`BLOCK` contiguous elements per tensor of more than
  :data:`SAMPLE` elements, smaller tensors whole, at most :data:`MAX_SAMPLED` tensors), one
  ``sign`` and one 6 x 6 weighted Gram product, which give the applied update, its cosine with the
  gradient, the gradient's cosine with the previous one and the sign-flip fraction. Dot products
  are weighted by ``numel / sample size`` of each tensor, so ``update_norm`` and the cosines
  estimate the full-tensor values;
* one host read of the small result vector (``.tolist()``): on CPU that is free; on CUDA the
  vector stays on the device and is read every ``sync_every`` updates (see ``docs/torch.md``).

Parameters the measures cannot use are skipped with a note, never a crash: parameters on the meta
device, without a gradient, complex (norms only, no sample), sparse gradients (norm of the values).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["MAX_NAMES", "MAX_SAMPLED", "SAMPLE", "ParamMeasure", "batch_stats", "param_names"]

#: elements per tensor kept for the update cosine and the sign-flip fraction
SAMPLE = 1024
#: the sample of a large tensor is made of blocks of this many contiguous elements
BLOCK = 16
#: at most this many tensors (the largest) are sampled, so the sample's cost per update is fixed
MAX_SAMPLED = 16
#: above this many parameters, per-name gradient norms are summed per top-level module
MAX_NAMES = 32
#: the lean check copies the gradients of tensors of at most this many elements to a few buffers
LEAN_SMALL = 4096
#: ... when there are at least this many of them (see :func:`_stacks`)
LEAN_FLAT_MIN = 8
#: up to this many tensors, the lean check takes one dot product per tensor, each read at once
#: (on CPU ~35% less than one ``_foreach_norm`` and its ``stack``, ~20% less than a
#: ``vector_norm`` each); above it the fused call
LEAN_EACH_MAX = 16

_dot = torch.dot
#: the argument of ``reshape`` that flattens, repeated for ``map``
_FLAT = itertools.repeat((-1,))

_HALF = (torch.float16, torch.bfloat16)


def _squares(grads: list[Any]) -> list[float]:
    """The squared 2-norm of each gradient, read on the host (CPU tensors).

    A BLAS dot of the flat gradient with itself, the cheapest call that reads every element: it
    sums in the tensor's dtype like ``vector_norm`` and measured closer to a float64 sum; an
    overflow is inf in both, and the full check then counts what is finite. ``reshape`` copies
    only a non-contiguous gradient."""
    if len(grads) <= LEAN_EACH_MAX:
        return [float(_dot(flat, flat)) for flat in map(torch.Tensor.reshape, grads, _FLAT)]
    norms = torch.stack(torch._foreach_norm(grads)).tolist()
    return list(map(operator.mul, norms, norms))


def param_names(model: Any) -> dict[int, str]:
    """``id(parameter) -> qualified name`` from ``model.named_parameters()`` ({} if unknown)."""
    if model is None:
        return {}
    try:
        return {id(p): name for name, p in model.named_parameters()}
    except Exception:
        return {}


def _aggregate_keys(names: list[str]) -> list[str]:
    """Each name's top-level module, a level deeper while that leaves fewer than two keys."""
    depth = 1
    keys = [_aggregate_key(n, depth) for n in names]
    while len(set(keys)) < 2 and depth < 3:
        depth += 1
        keys = [_aggregate_key(n, depth) for n in names]
    return keys


def _aggregate_key(name: str, depth: int) -> str:
    parts = name.split(".")
    return ".".join(parts[:depth]) if len(parts) > depth else name


class ParamMeasure:
    """Measures the parameters of one optimizer, update after update.

    For DTensor parameters (FSDP2's ``fully_shard``, tensor parallel),
    :func:`nanscope.torch.sharded.measure_for` makes a
    :class:`~nanscope.torch.sharded.ShardedMeasure` instead: the same measures on the local
    shards, combined across the ranks with one collective per update.
    """

    #: the lean per-update check applies (set by ``__init__``; never for sharded parameters)
    lean = False

    def __init__(self, params: list[torch.Tensor], names: Mapping[int, str]) -> None:
        self.params = params
        self.notes: list[str] = []
        self.names = [names.get(id(p), f"param{i}") for i, p in enumerate(params)]
        self.key = (len(params), sum(id(p) for p in params))
        self.meta = any(p.device.type == "meta" for p in params)
        if self.meta:
            self.notes.append("parameters on the meta device: gradient and weight measures are off")
        # dense, real, on a real device: these get fused norms and a sample
        self.dense: list[int] = []
        self.other: list[int] = []  # complex (norms only)
        for i, p in enumerate(params):
            if p.device.type == "meta":
                continue
            if p.is_complex():
                self.other.append(i)
            else:
                self.dense.append(i)
        if self.other:
            self.notes.append(
                f"{len(self.other)} complex parameter(s): norms only, no update cosine or flips"
            )
        self.groups = _dtype_groups(params, self.dense)
        # grad-norm aggregation: by name, or by top-level module when there are many params
        self.agg: list[str] = _aggregate_keys(self.names) if len(params) > MAX_NAMES \
            else list(self.names)  # fmt: skip
        self._plan_sample(params)
        self._f32 = all(v.dtype == torch.float32 for v in self._views)
        self._half = 0  # which half holds this update's rows
        self._have_prev = False
        # built once: what each update walks over
        self._order = [i for idx, _ in self.groups for i in idx] + list(self.other)
        self._wlists = [([params[i].detach() for i in idx], dtype) for idx, dtype in self.groups]
        self._nan: torch.Tensor | None = None
        self.count = 0
        #: the lean per-update check applies (:meth:`lean_norms`): dense CPU parameters in
        #: float32/float64, nothing on the meta device, nothing complex
        self.lean = (
            type(self) is ParamMeasure and not self.meta and not self.other and bool(self.dense)
            and all(dtype is None for _, dtype in self.groups)
            and all(params[i].device.type == "cpu" for i in self.dense)
        )  # fmt: skip
        self._plan_lean(params)

    def _plan_sample(self, params: list[torch.Tensor]) -> None:
        """The fixed sample: tensors of more than SAMPLE elements give SAMPLE // BLOCK evenly
        spaced blocks of BLOCK contiguous elements (a cache line each: a strided gather of single
        elements would miss the cache once per element), smaller ones are taken whole."""
        self.sampled: list[int] = []
        eligible = [i for i in self.dense if params[i].numel() and params[i].is_contiguous()]
        if len(eligible) > MAX_SAMPLED:  # a fixed cost per update: the largest tensors
            keep = set(sorted(eligible, key=lambda i: -params[i].numel())[:MAX_SAMPLED])
            eligible = [i for i in eligible if i in keep]
        nb = SAMPLE // BLOCK
        self._large: list[tuple[int, int]] = []  # (param index, block stride)
        self._small: list[int] = []
        for i in eligible:
            n = params[i].numel()
            if n > SAMPLE:
                self._large.append((i, n // nb))
            else:
                self._small.append(i)
        self.sampled = [i for i, _ in self._large] + self._small
        self._views: list[torch.Tensor] = []
        self._lviews = [_blocks(params[i].detach(), stride) for i, stride in self._large]
        self._sviews = [params[i].detach().view(-1) for i in self._small]
        self._views = self._lviews + self._sviews
        self._nlarge = len(self._large) * SAMPLE
        sizes = [SAMPLE] * len(self._large) + [params[i].numel() for i in self._small]
        weights = [params[i].numel() / SAMPLE for i, _ in self._large] + [1.0] * len(self._small)
        self._sizes = sizes
        self.weight: torch.Tensor | None = None
        self._buf: torch.Tensor | None = None
        if self._views:
            dev = self._views[0].device
            if all(v.device == dev for v in self._views):
                self.weight = torch.cat(
                    [torch.full((k,), w, dtype=torch.float32) for k, w in zip(sizes, weights)]
                ).to(dev)
                # one 6 x K buffer: rows [w, g, sign w] of one update and of the one before, in
                # two halves that swap roles every update (the Gram matrix does not care which
                # row is which; ``record`` reads the layout's parity)
                self._buf = torch.zeros(6, sum(sizes), dtype=torch.float32, device=dev)
                self._zl = torch.zeros(nb, BLOCK, dtype=torch.float32, device=dev)
                # the views each sample writes through and reads, made once (each is a call):
                # every row whole, and split into its blocks and its small tensors
                self._rows = list(self._buf)
                self._parts = [(row[: self._nlarge].view(-1, BLOCK), row[self._nlarge :])
                               for row in self._rows]  # fmt: skip
                self._buf_t = self._buf.t()
                self._gram = torch.empty(6, 6, dtype=torch.float32, device=dev)
                self._gram_flat = self._gram.view(-1)
            else:
                self.notes.append("parameters on several devices: update cosine off")
                self._views = self._lviews = self._sviews = []
                self._large, self._small, self.sampled = [], [], []

    def _plan_lean(self, params: list[torch.Tensor]) -> None:
        """What the lean check's norms walk: the tensors of each dtype group, in the layout's
        order, and the stacked buffers of many small ones."""
        self._lean_groups = [[params[i] for i in idx] for idx, _ in self.groups]
        # many small tensors (a model of many small layers): one norm call each costs more than
        # copying them into a few buffers and taking a dot product of each; their per-tensor
        # norms are then left to the full updates
        small = [i for i in self.dense if params[i].numel() <= LEAN_SMALL and params[i].dim()]
        self._lean_stacked: tuple[list[torch.Tensor], list[_Stack]] | None = None
        if self.lean and len(small) >= LEAN_FLAT_MIN:  # (buffers only where the check runs)
            keep = set(small)
            self._lean_stacked = ([params[i] for i in self.dense if i not in keep],
                                  _stacks([params[i] for i in small]))  # fmt: skip

    # ------------------------------------------------------------------ per update

    def _device(self) -> torch.device:
        if self.weight is not None:
            return self.weight.device
        if self.dense:
            return self.params[self.dense[0]].device
        return torch.device("cpu")

    def _nan_scalar(self) -> torch.Tensor:
        if self._nan is None:
            self._nan = torch.full((1,), math.nan, dtype=torch.float32, device=self._device())
        return self._nan

    def device_vector(
        self, full: bool, *, sample: bool = True
    ) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """Every measure of this update as one float32 vector (on the params' device), plus layout.

        Layout: ``[grad norm per param (NaN = no grad)] [weight norm per param, when full]
        [gram, when sampled]``, params in the order of :attr:`_order` (dtype groups, then complex);
        gram is the flat 6 x 6 matrix of :meth:`_sample_stats`. ``full`` also asks
        :meth:`record` for the per-name gradient norms (a dict: only every few updates).
        """
        if self.meta or not self.params:
            return None, {}
        params = self.params
        grads = [p.grad for p in params]
        parts: list[torch.Tensor] = []
        missing = False
        for idx, dtype in self.groups:
            tensors = [grads[i] for i in idx]
            if any(g is None or g.is_sparse for g in tensors):
                parts.append(self._group_grad_norms(idx, dtype, grads))
                missing = True
                continue
            norms = (
                torch._foreach_norm(tensors, 2, dtype=dtype)  # type: ignore[arg-type]
                if dtype is not None
                else torch._foreach_norm(tensors)  # type: ignore[arg-type]
            )
            parts.append(torch.stack(norms))
        for i in self.other:
            g = grads[i]
            parts.append(
                torch.linalg.vector_norm(g).float().reshape(1) if g is not None
                else self._nan_scalar()
            )  # fmt: skip
            missing = missing or g is None
        layout: dict[str, Any] = {"n": len(self._order), "stats": False, "names": full}
        if missing:
            layout["has"] = [k for k, i in enumerate(self._order) if grads[i] is not None]
        if full:
            parts.extend(self._weight_parts())
            layout["weights"] = True
        if sample:
            stats = self._sample_stats(grads)
            if stats is not None:
                parts.append(stats)
                layout["stats"] = True
                layout["half"] = self._half ^ 1  # the half that held this update (now swapped)
        parts = [t if t.dtype == torch.float32 else t.float() for t in parts]
        return (torch.cat(parts) if len(parts) > 1 else parts[0]), layout

    def lean_norms(self) -> tuple[float, list[float] | None] | None:
        """This update's squared gradient norm, read now, and the per-parameter norms (in the
        layout's order) when they came with it: one fused norm call per dtype group, or for a
        model of many small tensors a dot product per large one and one over each stack of
        small ones (:func:`_stacks`; no per-parameter norms then). None when a
        gradient is missing or sparse: :meth:`device_vector` then says which."""
        try:
            if self._lean_stacked is not None:
                large, stacks = self._lean_stacked
                g_sq = sum(_squares([p.grad for p in large])) if large else 0.0
                for stacked, out, flat in stacks:
                    torch.cat([p.grad for p in stacked], out=out)  # type: ignore[misc]
                    g_sq += float(_dot(flat, flat))
                return g_sq, None
            groups = self._lean_groups
            squares = _squares([p.grad for p in groups[0]])
            for group in groups[1:]:
                squares += _squares([p.grad for p in group])
        except (TypeError, RuntimeError, NotImplementedError):
            return None  # a missing gradient (None), a sparse one
        return sum(squares), list(map(math.sqrt, squares))

    def weight_vector(self) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """The weight norms alone (layout as :meth:`device_vector`'s, without gradients)."""
        if self.meta or not self.params:
            return None, {}
        parts = [t if t.dtype == torch.float32 else t.float() for t in self._weight_parts()]
        return torch.cat(parts), {"n": len(self._order), "stats": False, "weights": True,
                                  "no_grads": True}  # fmt: skip

    def _group_grad_norms(
        self, idx: list[int], dtype: torch.dtype | None, grads: list[torch.Tensor | None]
    ) -> torch.Tensor:
        """Norms of one dtype group when some gradients are missing or sparse (NaN = no grad)."""
        nan = self._nan_scalar()
        have = [i for i in idx if grads[i] is not None and not grads[i].is_sparse]  # type: ignore[union-attr]
        out: dict[int, torch.Tensor] = {}
        if have:
            tensors = [grads[i] for i in have]
            norms = (
                torch._foreach_norm(tensors, 2, dtype=dtype)  # type: ignore[arg-type]
                if dtype is not None
                else torch._foreach_norm(tensors)  # type: ignore[arg-type]
            )
            out.update(zip(have, norms))
        for i in idx:
            g = grads[i]
            if g is not None and g.is_sparse:
                out[i] = torch.linalg.vector_norm(g.coalesce().values().float())
        return torch.cat([out[i].float().reshape(1).to(nan.device) if i in out else nan
                          for i in idx])  # fmt: skip

    def _weight_parts(self) -> list[torch.Tensor]:
        parts: list[torch.Tensor] = []
        for tensors, dtype in self._wlists:
            norms = (
                torch._foreach_norm(tensors, 2, dtype=dtype)  # type: ignore[arg-type]
                if dtype is not None
                else torch._foreach_norm(tensors)
            )
            parts.append(torch.stack(norms))
        for i in self.other:
            parts.append(torch.linalg.vector_norm(self.params[i].detach()).float().reshape(1))
        return parts

    def _sample_stats(self, grads: list[torch.Tensor | None]) -> torch.Tensor | None:
        """The 6 x 6 weighted Gram matrix of [w, g, sign w] now and at the previous update (flat).

        One product gives every dot the record needs: update = w - w_prev, its norm and cosines,
        the gradient cosine, and the sign flips (``sign w . sign w_prev`` = same - opposite signs).
        """
        if not self._take_sample(grads):
            return None
        assert self._buf is not None and self.weight is not None
        # into a buffer of its own, read (tolist, or a cat's copy) before the next sample
        torch.mm(self._buf * self.weight, self._buf_t, out=self._gram)
        return self._gram_flat

    def _take_sample(self, grads: list[torch.Tensor | None]) -> bool:
        """Copy this update's [w, g, sign w] into the sample buffer; True when the previous
        update's rows are there too (the Gram matrix is then meaningful)."""
        buf = self._buf
        if buf is None or self.weight is None:
            return False
        params = self.params
        r = 3 * self._half
        glarge: list[torch.Tensor] = []
        for i, stride in self._large:
            g = grads[i]
            if g is None or g.is_sparse or g.shape != params[i].shape:
                glarge.append(self._zl)
            else:
                glarge.append(_blocks(g if g.is_contiguous() else g.reshape(-1), stride))
        gsmall: list[torch.Tensor] = []
        for i in self._small:
            g = grads[i]
            if g is None or g.is_sparse or g.shape != params[i].shape:
                gsmall.append(torch.zeros(params[i].numel(), device=buf.device))
            else:
                gsmall.append(g if g.ndim == 1 else g.reshape(-1))  # a bias is flat already
        self._fill(self._parts[r], self._lviews, self._sviews)
        self._fill(self._parts[r + 1], glarge, gsmall)
        torch.sign(self._rows[r], out=self._rows[r + 2])
        self._half ^= 1
        self.count += 1
        if not self._have_prev:
            self._have_prev = True
            return False
        return True

    def _fill(
        self,
        parts: tuple[torch.Tensor, torch.Tensor],
        large: list[torch.Tensor],
        small: list[torch.Tensor],
    ) -> None:
        """Copy the blocks and the small tensors into one row of the sample buffer (its two
        parts, :attr:`_parts`)."""
        for views, out in zip((large, small), parts):
            if not views:
                continue
            if self._f32 or all(v.dtype == torch.float32 for v in views):
                torch.cat(views, out=out)
            else:
                out.copy_(torch.cat([v.float() for v in views]))

    def reset_history(self) -> None:
        """Forget the previous samples (after a rollback or a skipped update)."""
        self._have_prev = False

    def record(self, values: list[float], layout: Mapping[str, Any]) -> dict[str, Any]:
        """Turn the host copy of :meth:`device_vector` into trace record keys."""
        out: dict[str, Any] = {}
        if not layout:
            return out
        n = int(layout["n"])
        order = self._order
        pos = 0
        if not layout.get("no_grads"):
            gnorms = values[:n]
            pos = n
            have = layout.get("has")
            present = range(n) if have is None else have
            g_sq = 0.0
            for k in present:
                v = gnorms[k]
                g_sq += v * v
            if have is None or have:
                out["grad_norm"] = math.sqrt(g_sq) if not math.isnan(g_sq) else math.nan
                nf_grads = 0
                if not math.isfinite(g_sq):
                    for k in present:
                        if not math.isfinite(gnorms[k]):
                            nf_grads += self._count_nonfinite_grad(order[k])
                    if not nf_grads:
                        # every element finite, only the float32 sum of squares overflowed: the
                        # true norm, which may itself lie past the float32 range
                        idx = [order[k] for k in present]
                        out["grad_norm"] = norm = _exact_norm(self.params, idx, grads=True)
                        if norm > _range_of(self.params, idx):
                            out["grad_past_range"] = True
                out["nf_grads"] = nf_grads
                if layout.get("names"):
                    names = self.grad_norms(gnorms, present)
                    if names:
                        out["grad_norms"] = names
        if layout.get("weights"):
            wnorms = values[pos : pos + n]
            pos += n
            w_sq = 0.0
            nf_params = 0
            for v in wnorms:
                w_sq += v * v
            if not math.isfinite(w_sq):
                for k, v in enumerate(wnorms):
                    if not math.isfinite(v):
                        nf_params += self._count_nonfinite_param(order[k])
            out["weight_norm"] = math.sqrt(w_sq) if not math.isnan(w_sq) else math.nan
            if not math.isfinite(w_sq) and not nf_params:
                out["weight_norm"] = _exact_norm(self.params, range(n), grads=False)
            out["nf_params"] = nf_params
        if layout.get("stats"):
            out.update(_direction(values[pos : pos + 36], int(layout.get("half", 0))))
        return out

    def grad_norms(self, gnorms: list[float], present: Iterable[int] | None = None) -> dict:
        """Per-name (or per top-level module) gradient norms from the per-param norms."""
        order, agg = self._order, self.agg
        per: dict[str, float] = {}
        for k in range(len(gnorms)) if present is None else present:
            v = gnorms[k]
            key = agg[order[k]]
            per[key] = per.get(key, 0.0) + v * v
        if len(per) < 2:
            return {}
        return {k: math.sqrt(v) for k, v in per.items()}

    def _count_nonfinite_grad(self, i: int) -> int:
        g = self.params[i].grad
        if g is None:
            return 0
        if g.is_sparse:
            g = g.coalesce().values()
        count = int((~torch.isfinite(g)).sum().item())
        return count

    def _count_nonfinite_param(self, i: int) -> int:
        p = self.params[i].detach()
        count = int((~torch.isfinite(p)).sum().item())
        return count


#: small tensors of one dtype and one shape but the first dimension, their gradients' buffer
#: (concatenated along that dimension) and its flat view
_Stack = tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]


def _stacks(small: list[torch.Tensor]) -> list[_Stack]:
    """The small tensors (at least one dimension) grouped so that each group's gradients go into
    one buffer with one ``torch.cat``: same dtype, same shape after the first dimension (a model
    of many small layers has a handful: its biases and norms, its weights by input width).
    ``_flatten_dense_tensors`` flattens each tensor first, a dispatched call per tensor: on the
    char transformer of ``bench/overhead.py`` (149 tensors) 170-200 us against ~100 us."""
    groups: dict[tuple[torch.dtype, tuple[int, ...]], list[torch.Tensor]] = {}
    for p in small:
        groups.setdefault((p.dtype, tuple(p.shape[1:])), []).append(p)
    stacks: list[_Stack] = []
    for (dtype, trailing), members in groups.items():
        rows = sum(p.shape[0] for p in members)
        out = torch.empty((rows, *trailing), dtype=dtype, device=members[0].device)
        stacks.append((members, out, out.view(-1)))
    return stacks


def _blocks(t: torch.Tensor, stride: int) -> torch.Tensor:
    """``SAMPLE // BLOCK`` blocks of ``BLOCK`` contiguous elements, ``stride`` apart (a view)."""
    return torch.as_strided(t, (SAMPLE // BLOCK, BLOCK), (stride, 1), t.storage_offset())


def _dtype_groups(
    params: list[torch.Tensor], indices: Iterable[int]
) -> list[tuple[list[int], torch.dtype | None]]:
    """The parameters by dtype and device; a half-precision group is measured in float32."""
    by: dict[tuple[torch.dtype, str], list[int]] = {}
    for i in indices:
        p = params[i]
        by.setdefault((p.dtype, str(p.device)), []).append(i)
    return [(idx, torch.float32 if dt in _HALF else None) for (dt, _), idx in by.items()]


def _exact_norm(params: list[torch.Tensor], indices: Iterable[int], *, grads: bool) -> float:
    """The 2-norm of these gradients (or weights) in float64, scaled by their largest
    magnitude so that no square overflows: the true size of finite values whose float32
    sum of squares was inf (rare: only then is it called)."""
    parts: list[torch.Tensor] = []
    for i in indices:
        t = params[i].grad if grads else params[i]
        if t is None:
            continue
        t = t.detach()
        if t.is_sparse:
            t = t.coalesce().values()
        if t.is_floating_point():
            parts.append(t.reshape(-1))
    if not parts:
        return math.nan
    top = max(float(torch.linalg.vector_norm(p, ord=math.inf)) for p in parts)
    if not math.isfinite(top) or top == 0:
        return top
    total = math.fsum(float(torch.sum((p.double() / top) ** 2)) for p in parts)
    return top * math.sqrt(total)


def _range_of(params: list[torch.Tensor], indices: Iterable[int]) -> float:
    """The largest finite value of the widest floating dtype among these parameters."""
    top = 0.0
    for i in indices:
        p = params[i]
        if p.is_floating_point():
            top = max(top, float(torch.finfo(p.dtype).max))
    return top or math.inf


def _direction(G: list[float], half: int) -> dict[str, Any]:
    """The update's direction measures from the 6 x 6 Gram matrix ``G`` (row-major) of the
    sample buffer's rows; ``half``: which half holds this update's rows."""
    out: dict[str, Any] = {}
    r = 3 * half
    q = 3 - r  # the previous update's half
    w, g, s, wp, gp, sp = r, r + 1, r + 2, q, q + 1, q + 2

    def at(i: int, j: int) -> float:
        return G[6 * i + j]

    uu = at(w, w) - 2.0 * at(w, wp) + at(wp, wp)
    ugp = at(w, gp) - at(wp, gp)
    ug = at(w, g) - at(wp, g)
    ggp, gpgp, gg = at(g, gp), at(gp, gp), at(g, g)
    # sign w . sign w_prev = same - opposite (both nonzero); |sign w_prev|^2 = nonzero
    total = at(sp, sp)
    flips = max(0.0, (total - at(s, sp)) / 2.0)
    un = math.sqrt(max(uu, 0.0))
    out["update_norm"] = un
    if un > 0 and gpgp > 0:
        out["update_cos"] = _clip(ugp / (un * math.sqrt(gpgp)))
    if un > 0 and gg > 0:
        out["update_cos_same"] = _clip(ug / (un * math.sqrt(gg)))
    if gg > 0 and gpgp > 0:
        out["grad_cos"] = _clip(ggp / math.sqrt(gg * gpgp))
    if total > 0:
        out["flip_frac"] = flips / total
    return out


def _clip(value: float) -> float:
    if not math.isfinite(value):
        return math.nan
    return max(-1.0, min(1.0, value))


def batch_stats(tensor: Any) -> torch.Tensor | None:
    """``[min x, max x]`` of a floating tensor, on its device (one kernel, no host sync), else None.

    ``max |x|`` is the larger magnitude of the two. NaN propagates through both, so a non-finite
    result says the batch holds NaN or inf. (``torch.aminmax`` is several times cheaper on CPU
    than ``vector_norm(ord=inf)``.)
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    if tensor.is_complex():
        return torch.linalg.vector_norm(tensor.detach(), ord=math.inf).reshape(1).repeat(2)
    if not tensor.is_floating_point():
        return None
    lo, hi = torch.aminmax(tensor.detach())
    return torch.stack([lo, hi])


def column_scale(tensor: Any) -> tuple[float, int] | None:
    """``(ratio, column)`` for a table-shaped floating batch (rows x columns, at least two): the
    largest column's max |x| over the median column's, and which column that is. None for any
    other batch (images, sequences, token ids). Read once, on the first batch: a column in raw
    units (prices in the thousands beside standardised ones) sets the curvature along its
    weights, and so the largest step the fit survives."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2 or tensor.shape[1] < 2:
        return None
    if not tensor.is_floating_point() or tensor.shape[0] < 1:
        return None
    col_max = torch.amax(tensor.detach().abs(), dim=0).double().cpu()
    positive = col_max[torch.isfinite(col_max) & (col_max > 0)]
    if positive.numel() < 2:
        return None
    ratio = float(positive.max() / positive.median())
    return ratio, int(torch.argmax(torch.where(torch.isfinite(col_max), col_max, 0.0)))
