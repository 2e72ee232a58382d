"""``nanscope.watch(model, optimizer)``: feed the core Monitor from PyTorch hooks.

::

    watcher = nanscope.watch(model, optimizer)      # policy="raise" by default
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()                            # checked *before* the weights change

What is hooked, and when it costs anything:

* the model's forward pre-hook and forward hook keep references to the batch and the output;
* ``loss.backward()`` (a thin patch of ``Tensor.backward`` / ``torch.autograd.backward``) keeps the
  loss tensor; several backward calls before one step are micro-batches (gradient accumulation)
  and the record's loss is their mean;
* a loss module (``nn.MSELoss``...) keeps its target;
* the optimizer's step pre-hook measures the update (:mod:`nanscope.torch.measure`) and hands the
  record to :meth:`nanscope.Monitor.observe`. When a detector fires under the ``raise`` policy the
  hook raises :class:`nanscope.DivergenceError`, so ``optimizer.step`` never runs and the weights
  are those of the last good update; they are saved to ``run_dir/last_good.pt``. For
  ``optimizer.step(closure)`` (LBFGS, Lightning) the closure is wrapped and the check runs inside
  it, right after the closure's backward and before the optimizer uses the gradient.

The :class:`~nanscope.torch.watcher.Watcher` (re-exported here) wires the hooks to parts with one
job each (see :mod:`nanscope.torch.watcher`). On CPU the check of an ordinary update is lean
(:mod:`nanscope.torch.lean`): one fused gradient norm and the loss read at its backward decide at
once whether the update is finite; a finite update's record is then shown to the detectors and
written with the next ones, in batches of :data:`BATCH_RECORDS` or every :data:`BATCH_SECONDS`. A
non-finite update is still stopped before its step; a finite divergence is found at most one
batch late.

:func:`watch` is the caller that registers the cross-rank agreement
(:mod:`nanscope.torch.distributed`) on the watcher it makes; the Watcher itself knows nothing of
ranks.

A fault inside nanscope's hooks never stops training: one warning, that hook off, training goes on.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from nanscope.errors import UsageError
from nanscope.monitor import Monitor
from nanscope.torch import distributed
from nanscope.torch.lean import BATCH_RECORDS, BATCH_SECONDS, CLIMB_RISES
from nanscope.torch.precision import SCALE_FLOOR, SKIP_LIMIT
from nanscope.torch.records import FULL_EVERY
from nanscope.torch.rollback import ROLLBACK_LIMIT, ROLLBACK_LR_FACTOR
from nanscope.torch.watcher import Watcher

__all__ = ["BATCH_RECORDS", "BATCH_SECONDS", "CLIMB_RISES", "FULL_EVERY", "ROLLBACK_LIMIT",
           "ROLLBACK_LR_FACTOR", "SCALE_FLOOR", "SKIP_LIMIT", "Watcher", "watch"]  # fmt: skip


def watch(
    model: Any,
    optimizer: Any,
    *,
    policy: str | None = None,
    monitor: Monitor | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    every: int | None = None,
    sync_every: int | None = None,
    every_agree: int = 1,
) -> Watcher:
    """Watch ``model`` trained by ``optimizer``; returns the :class:`Watcher` (call ``.close()``).

    policy: ``"raise"`` (default), ``"warn"`` or ``"rollback"`` (skip the bad update: its
        gradients are dropped before the step, at most three times in a row).
    monitor: a :class:`nanscope.Monitor` to feed (default: a new one with ``policy``/``run_dir``).
    every: take the full measures (weight norm, per-layer gradient norms, the batch's max |x|)
        every ``every`` updates (default :data:`FULL_EVERY`), and at any non-finite update. The
        loss, the gradient's finiteness and norm, and the sampled update norm, cosines and sign
        flips are measured on every update.
    sync_every: read the device-side measures every this many updates (default 1 on CPU, 16 when
        the parameters are on an accelerator). Detection is then up to ``sync_every`` updates late;
        the failing update is still found exactly and the weights are restored from the last
        verified snapshot (see ``docs/torch.md``).
    every_agree: under ``torch.distributed`` with more than one rank (call ``watch`` on every
        rank), the ranks agree on every stop (:mod:`nanscope.torch.distributed`); they combine
        their verdicts on updates divisible by ``every_agree`` (default 1: every update).
    """
    if isinstance(every_agree, bool) or not isinstance(every_agree, int) or every_agree < 1:
        raise UsageError(f"every_agree must be a positive integer, got {every_agree!r}")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"watch(model, optimizer): model must be a torch.nn.Module, got {type(model).__name__}"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(
            "watch(model, optimizer): optimizer must be a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    watcher = Watcher(model, optimizer, policy=policy, monitor=monitor, run_dir=run_dir,
                      every=every, sync_every=sync_every)  # fmt: skip
    try:
        if distributed.is_distributed():
            distributed.attach_watcher(watcher, every=every_agree)
    except Exception as exc:  # never stop training for nanscope's sake
        warnings.warn(f"nanscope: ranks will not agree on stops ({type(exc).__name__}: {exc})",
                      RuntimeWarning, stacklevel=2)  # fmt: skip
    return watcher
