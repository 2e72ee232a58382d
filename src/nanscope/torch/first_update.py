"""What a hand-written loop's first update showed, read before the loop was found.

``nanscope run`` knows a loop updates by hand only once its weights changed, at the second
backward: the first update has been applied by then. Its loss, batch, gradient and initial
weights are still readable at the end of its own backward (an autograd engine callback, before
the script's update), so :class:`~nanscope.torch.autowatch._ManualUpdates` reads them there and
update 1 gets the record every other update gets. Without it, a loop whose first loss is already
absurd or inf could not be told apart: weights scaled up at initialisation, a column in raw units
or a typo in the first batch all look the same from the loss alone.

Costs are paid only until the loop is found (a few backward calls), and only by a loop that
called no model (a script with a model has its first batch in the model's forward, and most of
them step a ``torch.optim`` optimizer: nothing here is read for them).
"""

from __future__ import annotations

import math
from typing import Any

from nanscope.numerics import RAW_UNITS

# torch and the measures are imported in the calls: ``nanscope run`` imports this module before
# the script imports torch (and a script that never does must not pay for it)

__all__ = ["batch_record", "gradient_record", "initial_weight_scale", "linear_weight_scale",
           "state_before", "weight_record"]  # fmt: skip


def batch_record(inputs: tuple[Any, ...]) -> dict[str, Any]:
    """``input_absmax`` (or ``nf_inputs``) and, for a table, the scale of its largest column
    against the median column's, over the data the loss applied the weights to."""
    from nanscope.torch.measure import batch_stats, column_scale
    from nanscope.torch.records import count_nonfinite

    record: dict[str, Any] = {}
    absmax, bad = 0.0, 0
    for x in inputs:
        stats = batch_stats(x)
        if stats is None:
            continue
        lo, hi = (float(v) for v in stats.float().tolist())
        value = max(abs(lo), abs(hi))
        if math.isfinite(value):
            absmax = max(absmax, value)
        else:
            bad += count_nonfinite(x)
        if "input_scale_ratio" not in record:
            scales = column_scale(x)
            if scales is not None:
                record["input_scale_ratio"], record["input_scale_column"] = scales
    if not inputs or (not absmax and not bad):
        return {}
    record["nf_inputs"] = bad
    if not bad:
        record["input_absmax"] = absmax
    if absmax > RAW_UNITS:
        rows = _outliers(inputs)
        if rows:
            record["rows"] = rows
    return record


def _outliers(inputs: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The typo rows of a table-shaped first batch, as the Monitor's rows read
    (:func:`nanscope.capture.arrays.typo_rows`)."""
    import torch
    from nanscope.capture.arrays import typo_rows

    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and 1 <= x.dim() <= 2:
            rows = [dict(r, step=1) for r in typo_rows(x.detach().double().cpu().numpy(), "inputs")]
            if rows:
                return rows[:5]
    return []


def weight_record(params: list[Any]) -> dict[str, Any]:
    """``weight_norm`` of the weights before any update (float64), the norm the first step's
    size is measured against."""
    import torch

    total = 0.0
    with torch.no_grad():
        for p in params:
            if p.is_floating_point():
                total += float(torch.linalg.vector_norm(p.detach().double())) ** 2
    return {"weight_norm": math.sqrt(total)} if math.isfinite(total) else {}


def gradient_record(params: list[Any]) -> dict[str, Any]:
    """``grad_norm`` (in float64: a float32 sum of squares overflows on finite elements) and
    ``nf_grads`` of the gradients the update is about to apply."""
    import torch

    total, bad, seen = 0.0, 0, False
    with torch.no_grad():
        for p in params:
            g = p.grad
            if g is None or not g.is_floating_point():
                continue
            seen = True
            bad += int((~torch.isfinite(g)).sum())
            # a NaN or inf element makes the norm NaN or inf, as every other record's does
            total += float(torch.linalg.vector_norm(g.detach().double())) ** 2
    if not seen:
        return {}
    return {"grad_norm": math.sqrt(total), "nf_grads": bad}


def initial_weight_scale(params: list[Any], inputs: tuple[Any, ...]) -> dict[str, Any]:
    """``std(W) * sqrt(fan_in)`` of each weight matrix before any update (about 0.5 to 1.5 for
    a standard initialiser; :func:`nanscope.capture.init_scale.weight_scale`), its std taken
    where the weights are (no copy to the host)."""
    import torch
    from nanscope.capture.init_scale import weight_scale

    widths = {int(x.shape[-1]) for x in inputs if isinstance(x, torch.Tensor) and x.dim() >= 1}
    matrices = []
    with torch.no_grad():
        for i, p in enumerate(params):
            if p.dim() == 2 and p.is_floating_point() and p.numel() >= 2 and bool(
                torch.isfinite(p).all()
            ):
                shape = "x".join(str(s) for s in p.shape)
                name = f"the {shape} weight (leaf {i + 1} of {len(params)})"
                matrices.append((name, tuple(int(f) for f in p.shape), float(p.float().std())))
    return weight_scale(matrices, widths)


#: values of one weight matrix read for its scale
SCALE_SAMPLE = 1 << 14


def linear_weight_scale(model: Any) -> dict[str, Any]:
    """``std(W) * sqrt(in_features)`` of each ``nn.Linear`` of ``model`` as it is now (the same
    measure as :func:`initial_weight_scale`, the fan-in known from the module): read when a
    watcher is bound before the first update, it is evidence about the initialisation, which the
    rules otherwise have only for a loop without a model. Embeddings (drawn at std 1 by design)
    and other modules are not read."""
    import torch
    from nanscope.capture.init_scale import weight_scale

    matrices = []
    with torch.no_grad():
        for name, module in model.named_modules():
            w: Any = getattr(module, "weight", None)
            if not isinstance(module, torch.nn.Linear) or type(w) not in (torch.Tensor,
                                                                            torch.nn.Parameter):
                continue  # (a sharded tensor's std would be a collective: not read)
            if w.dim() != 2 or w.numel() < 2 or not w.is_floating_point() or w.is_meta:
                continue
            # an evenly strided sample of at most SCALE_SAMPLE values: the std of an
            # initialiser's draws, at a cost that does not grow with the model
            flat = w.detach().reshape(-1)
            flat = flat[:: max(1, flat.numel() // SCALE_SAMPLE)].float()
            if not bool(torch.isfinite(flat).all()):
                continue
            # (a 1-d shape: the fan-in is the module's in_features, not a guess between two)
            matrices.append((f"{name}.weight", (int(w.shape[1]),), float(flat.std())))
    return weight_scale(matrices, set())


def state_before(params: list[Any], inputs: tuple[Any, ...]
                 ) -> tuple[list[Any], Any, dict[str, Any], tuple[Any, ...]] | None:  # fmt: skip
    """What a replay from before update 1 needs (:meth:`History.begin_by_hand`): copies of the
    weights as update 1 found them, the CPU RNG state, the namespace of the script's frame that
    called ``backward()`` (a shallow copy: the batch's names) and update 1's batch. None when
    the weights are larger than a snapshot may be."""
    import sys

    import torch
    from nanscope._frames import is_user_file
    from nanscope.torch.history import MAX_SNAPSHOT_BYTES

    if sum(p.numel() * p.element_size() for p in params) > MAX_SNAPSHOT_BYTES:
        return None
    frame: Any = sys._getframe(1)
    scope: dict[str, Any] = {}
    for _ in range(32):
        if frame is None:
            break
        if is_user_file(frame.f_code.co_filename):
            scope = dict(frame.f_locals)
            break
        frame = frame.f_back
    with torch.no_grad():
        before = [p.detach().clone() for p in params]
    return before, torch.get_rng_state(), scope, tuple(inputs)
