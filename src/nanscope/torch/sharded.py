"""Per-update measures for sharded parameters (FSDP2 ``fully_shard``, DTensor), and their last good
weights, without ever gathering a full tensor.

Under FSDP2 every parameter is a ``DTensor``: each rank holds one shard (``.to_local()``), and so
does its gradient. :class:`ShardedMeasure` (what :func:`measure_for` makes when a parameter is
a DTensor) takes the usual measures of :mod:`nanscope.torch.measure` on the local
shards and combines them across the ranks with **one** ``all_reduce(SUM)`` per update of one
float64 vector (``2 n + 36 + 3 W + 2`` values for ``n`` parameters and ``W`` ranks):

* ``[0, n)``: per parameter, the squared L2 norm of this rank's gradient shard, times
  ``shards / W`` (so a parameter replicated over part of the mesh is not counted twice);
* ``[n, 2n)``: the same for the weights, on full updates (zeros otherwise);
* ``[2n, 2n + 36)``: the 6 x 6 weighted Gram matrix of the sampled blocks of this rank's shards
  (weights, gradients and weight signs, now and at the update before; the same ``shards / W``
  factor per column), from which the record's
  update norm, cosines and sign-flip fraction follow: a dot product over a sharded tensor is the
  sum over its shards;
* ``W`` slots: how many of this rank's gradient shards are non-finite (each rank writes only its
  own slot, so after the sum every rank knows *which* ranks broke); ``W`` slots for the weights;
* ``W`` slots: 1 for each rank whose local computation failed;
* two counters: ranks that sent a Gram matrix, ranks that sent weight norms.

The size of the vector is fixed when the measure is made (checked once across the ranks), so a
rank whose local computation fails still takes part in the collective (it sends zeros and its
fault flag) and every rank switches the measures off together: one rank never waits alone in a
collective the others skipped. Parameters that are not DTensors (a plain module next to FSDP2
ones) are measured on this rank alone and added to the combined values locally.

Exact non-finite counts (``nf_grads``, ``nf_params``) are taken only when a combined norm is not
finite, on this rank's shards (no collective): they count what *this rank's* step would apply.
The record then also carries ``extra["shards"]``: the ranks whose shards went non-finite and, per
parameter, the rows (global indices along the sharded dimension) that hold the non-finite values
on this rank.

At a stop, :func:`save_shards` writes each rank's own shards to ``rank{r}/last_good.pt``
(format ``nanscope.local_shards/1``, see ``docs/distributed.md``) and :func:`load_last_good`
loads them back into a model sharded the same way. Nothing is gathered on one rank.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from nanscope.errors import UsageError
from nanscope.torch.measure import ParamMeasure

__all__ = [
    "FORMAT",
    "ShardedMeasure",
    "any_dtensor",
    "is_sharded",
    "load_last_good",
    "local_shards",
    "measure_for",
    "replicated",
    "restore_shards",
    "save_shards",
]

#: the ``format`` field of a rank's ``last_good.pt``
FORMAT = "nanscope.local_shards/1"
#: at most this many non-finite rows named per parameter and rank
SHARD_ROWS_NAMED = 16


_DTENSOR: list[type | None] = []


def _dtensor_type() -> type | None:
    if not _DTENSOR:
        try:
            from torch.distributed.tensor import DTensor
        except Exception:  # torch without distributed, or too old for DTensor
            _DTENSOR.append(None)
        else:
            _DTENSOR.append(DTensor)
    return _DTENSOR[0]


def any_dtensor(tensors: Iterable[Any]) -> bool:
    """True when one of ``tensors`` is a DTensor (FSDP2, tensor parallel)."""
    dt = _dtensor_type()
    return dt is not None and any(isinstance(t, dt) for t in tensors)


def is_sharded(model: Any) -> bool:
    """True when ``model`` has DTensor parameters (a ``fully_shard``-ed module, or part of one)."""
    if model is None or not hasattr(model, "parameters"):
        return False
    try:
        return any_dtensor(model.parameters())
    except Exception:
        return False


def local_shards(tensors: Iterable[Any]) -> list[Any]:
    """Each DTensor replaced by this rank's shard (sharing its storage), plain tensors as they are.

    For code that copies parameters in place (snapshots, restores): torch has no sharding
    strategy for some foreach ops on DTensors, and the local shards are all a rank owns.
    """
    return [_local(t) for t in tensors]


def replicated(t: Any) -> Any:
    """A plain tensor with ``t``'s value: ``t`` itself, or a replicated DTensor's local copy (what
    ``clip_grad_norm_`` returns under FSDP2); None for a DTensor whose local part is not its
    value (sharded or partial: reading it would take a collective)."""
    dt = _dtensor_type()
    if dt is None or not isinstance(t, dt):
        return t
    if all(pl.is_replicate() for pl in _any(t).placements):
        return _local(t)
    return None


def _local(t: Any) -> Any:
    """This rank's shard of a DTensor (a plain tensor sharing its storage), else ``t``."""
    dt = _dtensor_type()
    if dt is not None and isinstance(t, dt):
        inner = getattr(t, "_local_tensor", None)  # what to_local() returns, without its overhead
        if isinstance(inner, torch.Tensor):
            return inner.detach()
        with torch.no_grad():
            return _any(t).to_local().detach()
    return t


def _any(t: object) -> Any:
    """``t`` typed as Any (a DTensor's attributes are not in the stubs of every torch)."""
    return t


def _shards(t: Any) -> int:
    """How many distinct shards a DTensor is split into (1 when replicated; 0 for a plain one)."""
    dt = _dtensor_type()
    if dt is None or not isinstance(t, dt):
        return 0
    t = _any(t)
    mesh = t.device_mesh
    count = 1
    for dim, placement in enumerate(t.placements):
        if placement.is_shard():
            count *= int(mesh.size(dim))
    return count


def _offset(t: Any) -> tuple[int, ...]:
    """The global index of the first element of this rank's shard, per dimension."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return tuple(int(o) for o in offset)


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def measure_for(params: list[torch.Tensor], names: Mapping[int, str]) -> ParamMeasure:
    """The measure of these parameters: a :class:`ShardedMeasure` when one is a DTensor (FSDP2's
    ``fully_shard``, tensor parallel), else a :class:`~nanscope.torch.measure.ParamMeasure`."""
    if any_dtensor(params):
        return ShardedMeasure(params, names)
    return ParamMeasure(params, names)


class ShardedMeasure(ParamMeasure):
    """:class:`~nanscope.torch.measure.ParamMeasure` on local shards, combined across the ranks.

    ``params`` are the optimizer's (DTensor or plain) parameters; the base class measures their
    local shards (``self.params``); ``self.global_params`` keeps the originals.
    """

    def __init__(self, params: list[torch.Tensor], names: Mapping[int, str]) -> None:
        self.global_params = list(params)
        self.rank, self.world = _world()
        self.off = False
        self.fault: str | None = None
        self._checked = False
        self.size = -1  # -1 until set up: a rank that fails here says so at the structure check
        self.key = (len(params), sum(id(p) for p in params))
        try:
            self._setup(params, names)
        except Exception as exc:  # every rank must still reach the structure check
            self.fault = f"rank {self.rank} could not set up ({type(exc).__name__}: {exc})"[:300]
            self.size = -1
            for name, value in (("notes", []), ("params", list(params)), ("meta", False),
                                ("weight", None), ("_have_prev", False), ("_order", [])):
                if not hasattr(self, name):
                    setattr(self, name, value)

    def _setup(self, params: list[torch.Tensor], names: Mapping[int, str]) -> None:
        local = [_local(p) for p in params]
        local_names = {id(lp): names.get(id(p), f"param{i}")
                       for i, (p, lp) in enumerate(zip(params, local))}  # fmt: skip
        super().__init__(local, local_names)
        self.key = (len(params), sum(id(p) for p in params))
        self.sharded = [_shards(p) > 0 for p in params]
        n = len(self._order)
        self.size = 2 * n + 36 + 3 * self.world + 2
        dev = self._device()
        order = self._order
        # per parameter (in _order): the factor of its local square in the sum, and masks
        factor = [(_shards(params[i]) / self.world) if self.sharded[i] else 0.0 for i in order]
        self._factor = torch.tensor(factor, dtype=torch.float64, device=dev)
        self._dt_mask = torch.tensor([self.sharded[i] for i in order], device=dev)
        self._mixed = not all(self.sharded)
        # the sample's columns of sharded and of plain parameters (a NaN in a plain gradient must
        # not reach the combined Gram matrix: NaN * 0 is NaN, so the columns are split, not masked)
        cols_dt: list[int] = []
        cols_pl: list[int] = []
        col_factor: list[torch.Tensor] = []  # a replicated shard's dot products count 1/W times
        at = 0
        for i, size in zip(self.sampled, self._sizes):
            (cols_dt if self.sharded[i] else cols_pl).extend(range(at, at + size))
            f = _shards(params[i]) / self.world if self.sharded[i] else 1.0
            col_factor.append(torch.full((size,), f, dtype=torch.float32))
            at += size
        self._cols_dt = torch.tensor(cols_dt, dtype=torch.long, device=dev) if self._mixed else None
        self._cols_pl = torch.tensor(cols_pl, dtype=torch.long, device=dev) if cols_pl else None
        self._w_all: torch.Tensor | None = None
        if self.weight is not None:
            self._w_all = self.weight * torch.cat(col_factor).to(self.weight.device)
            if self._cols_dt is not None:
                self._w_dt = self._w_all[self._cols_dt]
                self._w_pl = self._w_all[self._cols_pl] if self._cols_pl is not None else None
        self._group = None
        self._check_grad_placements()  # made inside the first step hook: the gradients are there
        self._packed = torch.zeros(self.size, dtype=torch.float64, device=dev)
        self._plain = torch.zeros(2 * n + 36, dtype=torch.float64, device=dev)

    # ------------------------------------------------------------------ the collective

    def _check_structure(self) -> None:
        """Once, on every rank: the same vector size everywhere, else off on every rank."""
        import torch.distributed as dist

        self._checked = True
        broken = int(self.size < 0)
        if self.world <= 1:
            if broken:
                self._switch_off(self.fault or "the sharded measures could not be set up")
            return
        # the device the process group's backend wants (NCCL: the parameters' accelerator)
        dev = self.global_params[0].device if self.global_params else torch.device("cpu")
        probe = torch.tensor([self.size, -self.size, broken], dtype=torch.int64, device=dev)
        try:
            dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=self._group)
        except Exception as exc:
            self._switch_off(f"the ranks could not compare their parameters ({exc})")
            return
        if int(probe[2]):
            self._switch_off(self.fault or "another rank could not set up its sharded measures")
        elif int(probe[0]) != -int(probe[1]):
            self._switch_off(
                "the ranks hold different parameter lists (pipeline stages?): sharded measures off"
            )

    def _switch_off(self, why: str) -> None:
        self.off = True
        self.fault = why
        note = f"sharded measures are off: {why}"
        if note not in self.notes:
            self.notes.append(note)

    def device_vector(
        self, full: bool, *, sample: bool = True
    ) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """The combined measures of this update (a collective: call it on every rank).

        ``sample`` is ignored: the sample is taken on every update, so that no rank's local
        decision (its own loss rose) ever changes which collectives run.
        """
        if not self._checked:  # first, before any early return: every rank takes part
            self._check_structure()
        if self.off or self.meta or not self.params:
            return None, {}
        import torch.distributed as dist

        n = len(self._order)
        packed, plain = self._packed, self._plain
        packed.zero_()
        plain.zero_()
        has: list[int] = []
        try:
            grads = [_local(p.grad) if p.grad is not None else None for p in self.global_params]
            has = [k for k, i in enumerate(self._order) if grads[i] is not None]
            self._pack(grads, has, full, packed, plain)
        except Exception as exc:  # this rank's part failed: it still takes part, flagged
            self.fault = f"rank {self.rank}: {type(exc).__name__}: {exc}"[:300]
            packed.zero_()
            packed[2 * n + 36 + 2 * self.world + self.rank] = 1.0
            plain.zero_()
        if self.world > 1:
            try:
                dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=self._group)
            except Exception as exc:
                self._switch_off(f"the all_reduce failed ({type(exc).__name__}: {exc})"[:300])
                return None, {}
        try:
            body = packed[: 2 * n + 36] + plain
            gn = body[:n].clamp_min(0).sqrt()
            wn = body[n : 2 * n].clamp_min(0).sqrt()
            vec = torch.cat([gn, wn, body[2 * n :], packed[2 * n + 36 :]]).float()
        except Exception as exc:  # after the collective: this update unmeasured, the next one is
            self.fault = f"rank {self.rank}: {type(exc).__name__}: {exc}"[:300]
            return None, {}
        layout: dict[str, Any] = {"n": n, "stats": True, "names": full, "sharded": True,
                                  "full": full, "half": self._half ^ 1}  # fmt: skip
        if len(has) != n:
            layout["has"] = has
        return vec, layout

    def _check_grad_placements(self) -> None:
        """Once: a gradient placed otherwise than its parameter (``Partial`` under tensor
        parallel) makes that parameter's combined norm approximate; say so."""
        odd = []
        for i, p in enumerate(self.global_params):
            g = p.grad
            if self.sharded[i] and g is not None and _placement_text(g) != _placement_text(p):
                odd.append(f"{self.names[i]} ({_placement_text(g)} vs {_placement_text(p)})")
        if odd:
            self.notes.append(
                "gradients placed otherwise than their parameters, their combined norms are "
                "approximate: " + ", ".join(odd[:5])
            )

    def _pack(
        self,
        grads: list[torch.Tensor | None],
        has: list[int],
        full: bool,
        packed: torch.Tensor,
        plain: torch.Tensor,
    ) -> None:
        """This rank's part of the collective into ``packed`` (zeroed), the plain parameters'
        part into ``plain``."""
        n = len(self._order)
        W = self.world
        dev = self._device()
        gsq = self._squares(grads, has)
        dt, mixed = self._dt_mask, self._mixed
        zero = torch.zeros((), dtype=torch.float64, device=dev)
        packed[:n] = torch.where(dt, gsq * self._factor, zero) if mixed else gsq * self._factor
        if mixed:
            plain[:n] = torch.where(dt, zero, gsq)
        nf_g = (~torch.isfinite(torch.where(dt, gsq, zero))).sum() if mixed else (
            ~torch.isfinite(gsq)).sum()  # fmt: skip
        packed[2 * n + 36 + self.rank] = nf_g
        if full:
            weights = [p for p in self.params]
            wsq = self._squares(weights, range(n))
            packed[n : 2 * n] = (
                torch.where(dt, wsq * self._factor, zero) if mixed else wsq * self._factor
            )
            if mixed:
                plain[n : 2 * n] = torch.where(dt, zero, wsq)
            nf_w = (~torch.isfinite(torch.where(dt, wsq, zero))).sum() if mixed else (
                ~torch.isfinite(wsq)).sum()  # fmt: skip
            packed[2 * n + 36 + W + self.rank] = nf_w
            packed[-1] = 1.0
        if self._take_sample(grads):
            buf = self._buf
            assert buf is not None and self._w_all is not None
            if self._cols_dt is None:
                packed[2 * n : 2 * n + 36] = torch.mm(buf * self._w_all, buf.t()).reshape(-1)
            else:
                sub = buf.index_select(1, self._cols_dt)
                packed[2 * n : 2 * n + 36] = torch.mm(sub * self._w_dt, sub.t()).reshape(-1)
                if self._cols_pl is not None and self._w_pl is not None:
                    sub = buf.index_select(1, self._cols_pl)
                    plain[2 * n :] = torch.mm(sub * self._w_pl, sub.t()).reshape(-1)
            packed[-2] = 1.0

    def _squares(self, tensors: list[Any], present: Iterable[int]) -> torch.Tensor:
        """Squared L2 norm per parameter (in ``_order``; 0 where absent), float64, on device."""
        dev = self._device()
        order = self._order
        out = torch.zeros(len(order), dtype=torch.float64, device=dev)
        keep = present if isinstance(present, range) else set(present)
        every = isinstance(present, range) or len(keep) == len(order)
        pos = 0
        for idx, dtype in self.groups:
            ks = list(range(pos, pos + len(idx))) if every else [
                pos + j for j in range(len(idx)) if (pos + j) in keep]  # fmt: skip
            start, pos = pos, pos + len(idx)
            if not ks:
                continue
            dense = [tensors[order[k]] for k in ks]
            dense = [t.coalesce().values() if t.is_sparse else t for t in dense]
            norms = (
                torch._foreach_norm(dense, 2, dtype=dtype)  # type: ignore[arg-type]
                if dtype is not None
                else torch._foreach_norm(dense)  # type: ignore[arg-type]
            )
            squares = torch.stack(norms).to(dev).double().square()
            if len(ks) == len(idx):  # the common case: the group's slice, every grad present
                out[start:pos] = squares
            else:
                where = torch.tensor(ks, dtype=torch.long, device=dev)
                out.index_copy_(0, where, squares)
        for k in range(pos, len(order)):
            if k in keep:
                t = tensors[order[k]]
                out[k] = torch.linalg.vector_norm(t).double().square()
        return out

    def _sample_stats(self, grads: list[torch.Tensor | None]) -> torch.Tensor | None:
        """Not taken on its own (a local decision must never change the collectives): the sample
        is part of every :meth:`device_vector`."""
        return None

    def weight_vector(self) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """This rank's own weight-shard norms (no collective), for a failure seen on this rank
        only: they give ``nf_params`` for this rank's shards, not a global weight norm."""
        if self.off or self.meta or not self.params:
            return None, {}
        n = len(self._order)
        wsq = self._squares(list(self.params), range(n))
        return wsq.sqrt().float(), {"n": n, "local_weights": True}

    # ------------------------------------------------------------------ the record

    def record(self, values: list[float], layout: Mapping[str, Any]) -> dict[str, Any]:
        """Trace keys from the host copy of :meth:`device_vector` (or :meth:`weight_vector`)."""
        if not layout:
            return {}
        n = int(layout["n"])
        if layout.get("local_weights"):
            nf = sum(self._count_nonfinite_param(self._order[k])
                     for k, v in enumerate(values[:n]) if not math.isfinite(v))  # fmt: skip
            return {"nf_params": nf}
        if not layout.get("sharded"):
            return super().record(values, layout)
        W = self.world
        tail = values[2 * n + 36 :]
        nf_g, nf_w, faults = tail[:W], tail[W : 2 * W], tail[2 * W : 3 * W]
        n_gram, n_weights = tail[3 * W : 3 * W + 2]
        failed = [r for r in range(W) if faults[r] > 0]
        if failed:  # every rank reads the same sum: all switch off together
            who = ", ".join(map(str, failed))
            why = self.fault if self.rank in failed and self.fault else (
                f"the local measures of rank(s) {who} failed (their trace says why)")  # fmt: skip
            self._switch_off(why)
            return {"extra": {"shards": {"measures_off": why, "failed_ranks": failed}}}
        base: dict[str, Any] = {"n": n, "names": layout.get("names"), "half": layout.get("half"),
                                "stats": n_gram >= W, "weights": n_weights >= W}  # fmt: skip
        if "has" in layout:
            base["has"] = layout["has"]
        flat = list(values[:n])
        if base["weights"]:
            flat += values[n : 2 * n]
        if base["stats"]:
            flat += values[2 * n : 2 * n + 36]
        out = super().record(flat, base)
        bad_g = [r for r in range(W) if nf_g[r] > 0]
        bad_w = [r for r in range(W) if base["weights"] and nf_w[r] > 0]
        if bad_g or bad_w or out.get("nf_grads") or out.get("nf_params"):
            info = self._shards_info(bad_g, bad_w, values[:n], values[n : 2 * n])
            out["extra"] = {"shards": info}
        return out

    def _shards_info(
        self, bad_g: list[int], bad_w: list[int], gnorms: list[float], wnorms: list[float]
    ) -> dict[str, Any]:
        """Which ranks' shards went non-finite, and on this rank which rows (local look only)."""
        info: dict[str, Any] = {"rank": self.rank, "world_size": self.world,
                                "nonfinite_grad_ranks": bad_g,
                                "nonfinite_weight_ranks": bad_w}  # fmt: skip
        params: list[dict[str, Any]] = []
        for what, norms in (("grad", gnorms), ("weight", wnorms)):
            for k, v in enumerate(norms):
                if math.isfinite(v) or len(params) >= 32:
                    continue
                i = self._order[k]
                found = self._bad_rows(i, what)
                if found is not None:
                    params.append(found)
        if params:
            info["params"] = params
        return info

    def _bad_rows(self, i: int, what: str) -> dict[str, Any] | None:
        p = self.global_params[i]
        t = _local(p.grad) if what == "grad" else self.params[i]
        if t is None or t.is_sparse or t.numel() == 0:
            return None
        bad = ~torch.isfinite(t.detach())
        count = int(bad.sum())
        if not count:
            return None
        entry: dict[str, Any] = {"param": self.names[i], "what": what, "rank": self.rank,
                                 "count": count, "numel": int(t.numel())}  # fmt: skip
        if t.dim() >= 1:
            rows = torch.nonzero(bad.reshape(t.shape[0], -1).any(dim=1)).reshape(-1)
            start = 0
            if self.sharded[i]:
                entry["placements"] = [str(pl) for pl in _any(p).placements]
                try:
                    start = _offset(p)[0]
                except Exception:
                    start = 0
            entry["rows"] = [int(r) + start for r in rows[:SHARD_ROWS_NAMED].tolist()]
            entry["rows_total"] = int(rows.numel())
        return entry

    def _count_nonfinite_grad(self, i: int) -> int:
        g = _local(self.global_params[i].grad)
        if g is None:
            return 0
        if g.is_sparse:
            g = g.coalesce().values()
        return int((~torch.isfinite(g)).sum().item())


# ---------------------------------------------------------------------- last good weights


def _placement_text(t: Any) -> list[str] | None:
    dt = _dtensor_type()
    if dt is None or not isinstance(t, dt):
        return None
    return [str(pl) for pl in _any(t).placements]


def _named_tensors(model: Any) -> list[tuple[str, Any]]:
    named: list[tuple[str, Any]] = list(model.named_parameters())
    named += [(name, b) for name, b in model.named_buffers() if b is not None]
    return named


def restore_shards(params: Iterable[Any], saved: Iterable[Any]) -> None:
    """Copy a snapshot of local shards (``local_shards`` clones) back into ``params``, in place."""
    with torch.no_grad():
        for p, value in zip(local_shards(params), local_shards(saved)):
            p.copy_(value)


def save_shards(
    model: Any, monitor: Any, *, step: int, restored: bool = False
) -> tuple[Path | None, list[str]]:
    """Write this rank's shards of ``model`` to ``monitor.run_dir/last_good.pt``.

    Called at a stop (before ``optimizer.step``: the weights are still those of the last good
    update ``step``) on every rank, each on its own: nothing is gathered and no collective runs.
    A rank whose own shards are already non-finite writes nothing and says so. Format: see
    ``docs/distributed.md`` (``nanscope.local_shards/1``). Returns the path (None when nothing
    was written) and notes on what could not be saved; sets ``last_good``, ``last_good_format``,
    ``last_good_step`` (and ``last_good_restored``) in ``monitor.meta``.
    """
    rank, world = _world()
    shards: dict[str, torch.Tensor] = {}
    placements: dict[str, list[str]] = {}
    shapes: dict[str, list[int]] = {}
    offsets: dict[str, list[int]] = {}
    mesh: list[int] | None = None
    for name, tensor in _named_tensors(model):
        if tensor.device.type == "meta":
            continue
        local = _local(tensor).detach()
        if local.is_floating_point() and not bool(torch.isfinite(local).all()):
            return None, [f"rank {rank}'s shard of {name} is already non-finite: no last good "
                          "weights saved on this rank"]  # fmt: skip
        shards[name] = local.cpu().clone()
        text = _placement_text(tensor)
        if text is not None:
            placements[name] = text
            shapes[name] = list(tensor.shape)
            with contextlib.suppress(Exception):
                offsets[name] = list(_offset(tensor))
            if mesh is None:
                mesh = [int(s) for s in tensor.device_mesh.shape]
    if not shards:
        return None, []
    state = {"format": FORMAT, "rank": rank, "world_size": world, "step": int(step),
             "mesh_shape": mesh, "shards": shards, "placements": placements,
             "global_shapes": shapes, "offsets": offsets}  # fmt: skip
    path: Path | None = None
    if monitor.writes:
        path = monitor.run_dir / "last_good.pt"
        monitor.run_dir.mkdir(parents=True, exist_ok=True)
        torch.save(state, path)
        monitor.meta["last_good"] = str(path)
        monitor.meta["last_good_format"] = FORMAT
    monitor.meta.setdefault("last_good_step", int(step))
    if restored:
        monitor.meta["last_good_restored"] = True
    return path, []


def load_last_good(model: Any, path: str | Path) -> dict[str, Any]:
    """Load this rank's saved shards (``nanscope.local_shards/1``) into ``model``, in place.

    ``model`` must be sharded as it was when saved (same ``fully_shard`` calls, same world size);
    ``path`` is a rank's ``last_good.pt`` or the run root holding ``rank{r}/last_good.pt`` (this
    rank's file is taken). Call it on every rank; no collective runs. Returns the file's header
    (``step``, ``rank``, ``world_size``...). Raises :class:`~nanscope.errors.UsageError` on a
    file of another format, rank or world size, or a shard whose shape or placement differs.
    """
    rank, world = _world()
    where = Path(path)
    if where.is_dir():
        where = where / f"rank{rank}" / "last_good.pt"
    if not where.is_file():
        raise UsageError(f"no last good weights at {where}")
    try:
        state = torch.load(where, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(f"cannot read {where} ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(f"{where} is not a nanscope local-shards file (format {FORMAT})")
    if int(state["world_size"]) != world or int(state["rank"]) != rank:
        raise UsageError(
            f"{where} holds rank {state['rank']} of {state['world_size']}; this is rank {rank} of "
            f"{world}: load each rank's own file with the same world size"
        )
    shards: dict[str, torch.Tensor] = state["shards"]
    placements: dict[str, list[str]] = state.get("placements") or {}
    named = dict(_named_tensors(model))
    missing = [name for name in shards if name not in named]
    if missing:
        raise UsageError(f"{where}: the model has no {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, saved in shards.items():
            target = named[name]
            here = _placement_text(target)
            if here != (placements.get(name)):
                raise UsageError(
                    f"{where}: {name} was saved with placements {placements.get(name)}, the model "
                    f"has {here}: shard the model as it was when saved"
                )
            local = _local(target)
            if tuple(local.shape) != tuple(saved.shape):
                raise UsageError(f"{where}: {name} shard shape {tuple(saved.shape)} does not fit "
                                 f"this rank's {tuple(local.shape)}")  # fmt: skip
            local.copy_(saved.to(local.device, local.dtype))
    return {k: v for k, v in state.items() if k not in ("shards",)}

