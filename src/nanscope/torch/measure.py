"""Fused per-update measures on torch tensors, the torch mirror of :mod:`nanscope.capture.arrays`.

One :class:`ParamMeasure` per optimizer. Each update it costs:

* one ``torch._foreach_norm`` over the gradients and one over the weights (one fused kernel per
  dtype group, instead of one per tensor); a finite norm proves every element finite, so exact
  non-finite counts are only taken when a norm is not finite;
* one ``torch.cat`` of fixed strided views of the weights and one of the gradients: a sample of at
  most :data:`SAMPLE` elements per tensor (every tensor of up to ``SAMPLE`` elements is taken
  whole). The previous update's samples are kept (two small vectors), so the applied update, its
  cosine with the gradient, the gradient's cosine with the previous one and the sign-flip fraction
  come from one 4 x K matrix product, as in the numpy tracker. Dot products over the sample are
  weighted by ``numel / sample size`` of each tensor, so ``update_norm`` and the cosines estimate
  the full-tensor values (they are exact for tensors of at most ``SAMPLE`` elements);
* one host read of the small result vector (``.tolist()``): on CPU that is free; on CUDA the
  vector stays on the device and is read every ``sync_every`` updates (see ``docs/torch.md``).

Parameters the measures cannot use are skipped with a note, never a crash: parameters on the meta
device, without a gradient, complex (norms only, no sample), sparse gradients (norm of the values).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["MAX_NAMES", "SAMPLE", "ParamMeasure", "batch_stats", "param_names"]

#: elements per tensor kept for the update cosine and the sign-flip fraction
SAMPLE = 1024
#: above this many parameters, per-name gradient norms are summed per top-level module
MAX_NAMES = 32

_HALF = (torch.float16, torch.bfloat16)


def param_names(model: Any) -> dict[int, str]:
    """``id(parameter) -> qualified name`` from ``model.named_parameters()`` ({} if unknown)."""
    if model is None:
        return {}
    try:
        return {id(p): name for name, p in model.named_parameters()}
    except Exception:
        return {}


def _aggregate_key(name: str, depth: int) -> str:
    parts = name.split(".")
    return ".".join(parts[:depth]) if len(parts) > depth else name


class ParamMeasure:
    """Measures the parameters of one optimizer, update after update."""

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
        self.groups = self._dtype_groups(self.dense)
        # grad-norm aggregation: by name, or by top-level module when there are many params
        self.agg: list[str]
        if len(params) > MAX_NAMES:
            depth = 1
            keys = [_aggregate_key(n, depth) for n in self.names]
            while len(set(keys)) < 2 and depth < 3:
                depth += 1
                keys = [_aggregate_key(n, depth) for n in self.names]
            self.agg = keys
        else:
            self.agg = list(self.names)
        # the fixed sample: strided views of each dense contiguous tensor
        self.sampled: list[int] = []
        self._strides: list[int] = []
        self._views: list[torch.Tensor] = []
        sizes: list[int] = []
        weights: list[float] = []
        for i in self.dense:
            p = params[i]
            if p.numel() == 0 or not p.is_contiguous():
                continue
            n = p.numel()
            stride = max(1, math.ceil(n / SAMPLE))
            view = p.detach().view(-1)[::stride]
            self.sampled.append(i)
            self._strides.append(stride)
            self._views.append(view)
            sizes.append(view.numel())
            weights.append(n / view.numel())
        self._sizes = sizes
        self.weight: torch.Tensor | None = None
        if self._views:
            dev = self._views[0].device
            if all(v.device == dev for v in self._views):
                self.weight = torch.cat(
                    [torch.full((k,), w, dtype=torch.float32) for k, w in zip(sizes, weights)]
                ).to(dev)
            else:
                self.notes.append("parameters on several devices: update cosine off")
                self._views = []
                self.sampled = []
        self._zeros = [torch.zeros(k, dtype=torch.float32, device=v.device) for k, v in
                       zip(sizes, self._views)]
        self._prev: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.count = 0

    def _dtype_groups(self, indices: Iterable[int]) -> list[tuple[list[int], torch.dtype | None]]:
        by: dict[tuple[torch.dtype, str], list[int]] = {}
        for i in indices:
            p = self.params[i]
            by.setdefault((p.dtype, str(p.device)), []).append(i)
        return [(idx, torch.float32 if dt in _HALF else None) for (dt, _), idx in by.items()]

    # ------------------------------------------------------------------ per update

    def device_vector(self, full: bool) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """Every measure of this update as one float32 vector (on the params' device), plus layout.

        Layout: ``[grad norm per param (NaN = no grad)] [weight norm per param] [gram]`` where
        gram is the flat 6 x 6 matrix of :meth:`_sample_stats`.
        """
        if self.meta or not self.params:
            return None, {}
        params = self.params
        grads = [p.grad for p in params]
        parts: list[torch.Tensor] = []
        n = len(params)
        gn: list[torch.Tensor | None] = [None] * n
        sparse: list[int] = []
        for idx, dtype in self.groups:
            have = [i for i in idx if grads[i] is not None and not grads[i].is_sparse]  # type: ignore[union-attr]
            sparse.extend(i for i in idx if grads[i] is not None and grads[i].is_sparse)  # type: ignore[union-attr]
            if have:
                tensors = [g for g in (grads[i] for i in have) if g is not None]
                norms = (
                    torch._foreach_norm(tensors, 2, dtype=dtype)  # type: ignore[arg-type]
                    if dtype is not None
                    else torch._foreach_norm(tensors)  # type: ignore[arg-type]
                )
                for i, v in zip(have, norms):
                    gn[i] = v
        for i in sparse:
            g = grads[i]
            assert g is not None
            gn[i] = torch.linalg.vector_norm(g.coalesce().values().float())
        for i in self.other:
            g = grads[i]
            if g is not None:
                gn[i] = torch.linalg.vector_norm(g).float()
        ref = self._views[0] if self._views else params[self.dense[0]] if self.dense else None
        dev = ref.device if ref is not None else torch.device("cpu")
        nan = torch.full((), math.nan, dtype=torch.float32, device=dev)
        parts.append(torch.stack([v.float().to(dev) if v is not None else nan for v in gn]))
        layout: dict[str, Any] = {
            "n": n,
            "stats": False,
            "has": [i for i, g in enumerate(grads) if g is not None],
        }
        if full:
            wn: list[torch.Tensor | None] = [None] * n
            for idx, dtype in self.groups:
                tensors = [params[i].detach() for i in idx]
                norms = (
                    torch._foreach_norm(tensors, 2, dtype=dtype)  # type: ignore[arg-type]
                    if dtype is not None
                    else torch._foreach_norm(tensors)
                )
                for i, v in zip(idx, norms):
                    wn[i] = v
            for i in self.other:
                wn[i] = torch.linalg.vector_norm(params[i].detach()).float()
            parts.append(torch.stack([v.float().to(dev) if v is not None else nan for v in wn]))
            layout["weights"] = True
            stats = self._sample_stats(grads)
            if stats is not None:
                parts.append(stats)
                layout["stats"] = True
        return torch.cat(parts), layout

    def _sample_stats(self, grads: list[torch.Tensor | None]) -> torch.Tensor | None:
        """The 6 x 6 weighted Gram matrix of [w, w_prev, g, g_prev, sign w, sign w_prev] (flat).

        One product gives every dot the record needs: update = w - w_prev, its norm and cosines,
        the gradient cosine, and the sign flips (``sign w . sign w_prev`` = same - opposite signs).
        """
        if not self._views or self.weight is None:
            return None
        w_now = torch.cat(self._views)
        if w_now.dtype != torch.float32:
            w_now = w_now.float()
        gviews: list[torch.Tensor] = []
        for k, i in enumerate(self.sampled):
            g = grads[i]
            if g is None or g.is_sparse or g.shape != self.params[i].shape:
                gviews.append(self._zeros[k])
            else:
                gviews.append(g.detach().reshape(-1)[:: self._strides[k]])
        g_now = torch.cat(gviews)
        if g_now.dtype != torch.float32:
            g_now = g_now.float()
        s_now = torch.sign(w_now)
        prev = self._prev
        self._prev = (w_now, g_now, s_now)
        self.count += 1
        if prev is None:
            return None
        m = torch.stack([w_now, prev[0], g_now, prev[1], s_now, prev[2]])
        return ((m * self.weight) @ m.T).reshape(-1)

    def reset_history(self) -> None:
        """Forget the previous samples (after a rollback or a skipped update)."""
        self._prev = None

    def record(self, values: list[float], layout: Mapping[str, Any]) -> dict[str, Any]:
        """Turn the host copy of :meth:`device_vector` into trace record keys."""
        out: dict[str, Any] = {}
        if not layout:
            return out
        n = int(layout["n"])
        gnorms = values[:n]
        pos = n
        have = list(layout.get("has", ()))
        g_sq = 0.0
        nf_grads = 0
        per: dict[str, float] = {}
        for i in have:
            v = gnorms[i]
            if not math.isfinite(v):
                nf_grads += self._count_nonfinite_grad(i)
            g_sq += v * v
            key = self.agg[i]
            per[key] = per.get(key, 0.0) + v * v
        if have:
            out["grad_norm"] = math.sqrt(g_sq) if not math.isnan(g_sq) else math.nan
            out["nf_grads"] = nf_grads
            if len(per) > 1:
                out["grad_norms"] = {k: math.sqrt(v) for k, v in per.items()}
        if layout.get("weights"):
            wnorms = values[pos : pos + n]
            pos += n
            w_sq = 0.0
            nf_params = 0
            for i, v in enumerate(wnorms):
                if math.isnan(v) and self.params[i].device.type == "meta":
                    continue
                if not math.isfinite(v):
                    nf_params += self._count_nonfinite_param(i)
                w_sq += v * v
            out["weight_norm"] = math.sqrt(w_sq) if not math.isnan(w_sq) else math.nan
            out["nf_params"] = nf_params
        if layout.get("stats"):
            G = values[pos : pos + 36]

            def at(i: int, j: int) -> float:
                return G[6 * i + j]

            uu = at(0, 0) - 2.0 * at(0, 1) + at(1, 1)
            ugp = at(0, 3) - at(1, 3)
            ug = at(0, 2) - at(1, 2)
            ggp, gpgp, gg = at(2, 3), at(3, 3), at(2, 2)
            # sign w . sign w_prev = same - opposite (both nonzero); |sign w_prev|^2 = nonzero
            total = at(5, 5)
            flips = max(0.0, (total - at(4, 5)) / 2.0)
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


def _clip(value: float) -> float:
    if not math.isfinite(value):
        return math.nan
    return max(-1.0, min(1.0, value))


def batch_stats(tensor: Any) -> torch.Tensor | None:
    """``max |x|`` of a floating tensor, on its device (one kernel, no host sync), else None.

    NaN propagates through the max, so a non-finite result says the batch holds NaN or inf.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return None
    return torch.linalg.vector_norm(tensor.detach(), ord=math.inf)
