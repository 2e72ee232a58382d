"""The confirming experiment: the failing update rerun from the last good state, one change each.

After a PyTorch stop the model still holds the weights of the failing update (the check runs
before ``optimizer.step``), and the adapter kept that update's batch. Each experiment reruns the
update on a *copy* of the model (the user's model, its buffers and its gradients are never
touched) with one thing changed:

* ``float32``: the model and the floating inputs in float32, no autocast (only when the update ran
  in float16 / bfloat16);
* ``without_rows``: the suspect rows the probes named (non-finite or extreme) left out of the batch;
* ``lr_x0.1``: a tenth of the learning rate. The loss and the gradient of an update are computed
  before its step, so the learning rate cannot change them: the entry says so rather than rerun
  the same thing; when the weights broke in a step, the step itself would have to be replayed,
  which needs the optimizer's state (not kept), and the entry says that too.

The rerun covers the forward, the loss when the loss is a ``nn.Module`` the adapter saw
(``nn.MSELoss()(out, y)``), and the backward of that loss. A loss written as an expression in the
training loop is the user's code and cannot be rerun: the forward is, and the producer op (the
first op that made a non-finite value from finite inputs) is recomputed in the changed way
instead; ``scope`` says which.

Each entry (the diagnosis JSON field ``confirmation``)::

    {"change": "float32" | "without_rows" | "lr_x0.1", "ran": bool, "finite": bool | None,
     "loss": float | None, "scope": ..., "text": ...}
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nanscope.probes._tensors import has_forward, tensors
from nanscope.probes.failure import TorchFailure
from nanscope.probes.producer import GRAPH_NODE, recompute_without_rows
from nanscope.probes.rows import suspect_batch_rows

__all__ = ["MAX_PARAMS", "confirm"]

#: models larger than this (parameters) are not copied for the experiment
MAX_PARAMS = 50_000_000


def confirm(failure: TorchFailure, found: dict[str, Any]) -> list[dict[str, Any]]:
    """Every experiment's outcome; never raises (a fault becomes an entry that says so)."""
    out: list[dict[str, Any]] = []
    for change in ("float32", "without_rows", "lr_x0.1"):
        try:
            entry = _experiment(change, failure, found)
        except Exception as exc:
            text = f"not run: the rerun failed ({type(exc).__name__}: {exc})"
            entry = {"change": change, "ran": False, "finite": None, "loss": None, "text": text}
        if entry is not None:
            out.append(entry)
    return out


# ------------------------------------------------------------------------------ experiments


def _experiment(change: str, f: TorchFailure, found: dict[str, Any]) -> dict[str, Any] | None:
    import torch

    located = found.get("located") or {}
    if change == "lr_x0.1":
        return _lr_entry(f, located)
    if change == "float32" and located.get("phase") in ("preprocess", "optimizer"):
        # the producer is the training loop's own code or the optimizer's arithmetic: neither is
        # rerun (the model would only get the broken batch, or the step the same gradients)
        return _recomputed_entry(f, located)
    if f.what == "weight" or located.get("phase") == "optimizer":
        return None  # the weights broke in a step: only the step could be rerun (lr entry)
    model = f.model
    if model is None or not hasattr(model, "parameters"):
        return {"change": change, "ran": False, "finite": None, "loss": None,
                "text": "not run: the model was not seen"}  # fmt: skip
    if not has_forward(model):
        return {"change": change, "ran": False, "finite": None, "loss": None,
                "text": f"not run: {type(model).__name__} has no forward of its own to "
                        "rerun"}  # fmt: skip
    params = list(model.parameters())
    if sum(p.numel() for p in params) > MAX_PARAMS:
        return {"change": change, "ran": False, "finite": None, "loss": None,
                "text": f"not run: the model has more than {MAX_PARAMS:,} parameters"}  # fmt: skip
    if any(not bool(torch.isfinite(p.detach()).all()) for p in params if p.is_floating_point()):
        return {"change": change, "ran": False, "finite": None, "loss": None,
                "text": "not run: the weights are already non-finite (no last good state in the "
                        "model)"}  # fmt: skip
    if change == "float32":
        narrow = {p.dtype for p in params if p.dtype in (torch.float16, torch.bfloat16)}
        autocast = f.autocast in (torch.float16, torch.bfloat16)
        if not narrow and not autocast:
            return None  # already float32: nothing to change
        try:
            return _rerun(f, located, change, dtype=torch.float32)
        except RuntimeError as exc:
            if not isinstance(located.get("precision"), dict):
                raise
            # the model's own forward casts (``x.half()``): with float32 weights it meets a
            # float32 / float16 mix; the producer op is recomputed in float32 instead
            first = str(exc).splitlines()[0][:120]
            return _recomputed_entry(f, located, not_rerun=f"the model's own forward casts to "
                                     f"{located.get('dtype')}, so it cannot run on float32 "
                                     f"weights ({first})")  # fmt: skip
    for cols in found.get("nonfinite_columns") or []:
        if isinstance(cols, dict) and cols.get("columns"):
            names = ", ".join(str(c) for c in cols["columns"][:5])
            return {"change": change, "ran": False, "finite": False, "loss": None,
                    "text": f"not run: column {names} of the {cols.get('source')} is non-finite "
                            f"in every row of the batch ({cols.get('rows')} rows): no row can be "
                            "left out; the column is broken, not rows"}  # fmt: skip
    rows = suspect_batch_rows(found.get("rows"))
    if rows:
        return _rerun(f, located, change, drop=rows)
    # no bad or extreme row in the data: the rows whose (finite) values made the producer's
    # non-finite output, seen in the replay (a flat trace divided by its std of 0, a
    # probability of exactly 0): leaving them out tests that they, not the weights, broke it
    rows = [r for r in located.get("producer_rows") or [] if isinstance(r, int)][:64]
    inside = located.get("phase") == "forward" or (
        located.get("phase") == "backward" and located.get("module") not in (None, "loss"))
    if not rows or not inside:
        return None  # a backward node of no known module: its backward cannot be rerun alone
    return _rerun(f, located, change, drop=rows, basis="producer")


def _lr_entry(f: TorchFailure, located: dict[str, Any]) -> dict[str, Any]:
    if located.get("phase") == "optimizer":
        return {"change": "lr_x0.1", "ran": False, "finite": None, "loss": None,
                "text": "not run: the weights broke in an optimizer step; replaying that step "
                        "with a tenth of the learning rate needs the optimizer's state, which "
                        "is not kept"}  # fmt: skip
    own = f.loss_finite_before_step()
    if own is not None:
        return {"change": "lr_x0.1", "ran": False, "finite": None, "loss": None,
                "text": f"the {f.what} of update {f.step} went non-finite within its step (its "
                        f"own loss, {own:.4g}, was finite): the window replay tests the "
                        "learning rate"}  # fmt: skip
    return {"change": "lr_x0.1", "ran": False, "finite": False, "loss": None,
            "text": f"the {f.what} of update {f.step} is computed from the weights before its "
                    "step: a tenth of the learning rate leaves it non-finite (the step size did "
                    "not make this value)"}  # fmt: skip


def _recomputed_entry(f: TorchFailure, located: dict[str, Any],
                      not_rerun: str | None = None) -> dict[str, Any] | None:  # fmt: skip
    """``float32`` for a producer outside the model (or in a model that cannot be rerun in
    float32, ``not_rerun`` says why): the op itself, recomputed from its inputs."""
    dtype = str(located.get("dtype") or "")
    if dtype not in ("float16", "bfloat16"):
        return None  # already float32: nothing to change
    where = _where(located)
    update = located.get("update") or f.step  # an optimizer producer is the step before
    phase = "the training loop's preprocessing" if located.get("phase") == "preprocess" else (
        "the optimizer step")
    scope = f"the producer op recomputed in float32 ({not_rerun or phase + ' is not rerun'})"
    recomputed = located.get("recomputed") or {}
    wide = recomputed.get("float32") if isinstance(recomputed, dict) else None
    precision = located.get("precision")
    if isinstance(precision, dict) and precision.get("value") is not None:
        value = float(precision["value"])
        return {"change": "float32", "ran": True, "finite": True, "loss": None, "scope": scope,
                "producer_value": value,
                "text": f"the producer {where} recomputed in float32 from the same inputs "
                        f"(update {update}) gives {value:.3g}, finite, past the {dtype} limit "
                        f"{float(precision.get('limit') or 0.0):.6g}: a precision overflow"}
    if isinstance(wide, dict) and wide.get("finite") is False:
        return {"change": "float32", "ran": True, "finite": False, "loss": None, "scope": scope,
                "text": f"the producer {where} recomputed in float32 from the same inputs "
                        f"(update {update}) is still non-finite: not a precision overflow"}
    return {"change": "float32", "ran": False, "finite": None, "loss": None, "scope": scope,
            "text": f"not run: the producer {where} in {phase} could not be recomputed in "
                    "float32"}  # fmt: skip


def _where(located: dict[str, Any]) -> str:
    text = str(located.get("op"))
    source = located.get("source") or {}
    if isinstance(source, dict) and source.get("file"):
        text += f" at {source['file']}:{source.get('line')}"
    return text


def _output_grad(f: TorchFailure, root: Any, keep: Any, batch: int | None) -> tuple[Any, bool]:
    """The gradient to seed the model's backward with: the kept gradient at the output (its
    ``keep`` rows), cast like ``root``, and True; else ones and False."""
    import torch

    grad = f.extra.get("output_grad")
    if isinstance(grad, torch.Tensor):
        if keep is not None and grad.dim() >= 1 and grad.shape[0] == batch:
            grad = grad[keep.to(grad.device)]
        if grad.shape == root.shape and bool(torch.isfinite(grad).all()):
            return grad.to(dtype=root.dtype, device=root.device), True
    return torch.ones_like(root), False


@dataclass
class _Rerun:
    """One rerun on copies of the weights: what was changed, and the model's outputs."""

    f: TorchFailure
    located: dict[str, Any]
    change: str
    basis: str
    drop: list[int] | None
    keep: Any  # the rows of the batch kept (a boolean mask), None for all
    batch: int | None
    state: dict[str, Any]  # the copied weights and buffers, by name
    outs: list[Any]  # the model's floating outputs
    out_finite: bool
    what: str  # the entry's opening words: what was rerun

    def params(self) -> list[Any]:
        return [p for p in self.state.values() if p.requires_grad]


def _rerun(f: TorchFailure, located: dict[str, Any], change: str, *, dtype: Any = None,
           drop: list[int] | None = None, basis: str = "suspect") -> dict[str, Any]:  # fmt: skip
    import torch

    state = _copied_state(f.model, dtype)
    batch = _batch_size(f)
    keep = None
    if drop:
        if batch is None:
            return {"change": change, "ran": False, "finite": None, "loss": None,
                    "text": "not run: the batch's rows could not be told apart"}  # fmt: skip
        mask = torch.ones(batch, dtype=torch.bool)
        mask[[r for r in drop if r < batch]] = False
        keep = mask
        if not bool(mask.any()):
            return {"change": change, "ran": False, "finite": None, "loss": None,
                    "text": "not run: every row of the batch is a suspect"}  # fmt: skip
    prep = functools.partial(_prepared, keep=keep, batch=batch, dtype=dtype)
    out, loss = _forward(f, state, prep, dtype)
    outs = [t for t in tensors(out) if t.is_floating_point()]
    out_finite = all(bool(torch.isfinite(t.detach()).all()) for t in outs)
    what = _what(change, drop, f)
    if basis == "producer":
        what = what.replace(", update", f" (where {located.get('op')} made its value), update")
    run = _Rerun(f, located, change, basis, drop, keep, batch, state, outs, out_finite, what)
    entry: dict[str, Any] = {"change": change, "ran": True, "loss": None}
    if drop:
        entry["rows"] = list(drop)
        entry["rows_from"] = "producer" if basis == "producer" else "probes"
        if basis == "producer":
            entry["producer_phase"] = located.get("phase")
    if loss is not None and isinstance(loss, torch.Tensor):
        return _with_loss(run, entry, loss)
    in_model = located.get("phase") == "backward" and located.get("module") not in (None, "loss")
    if out_finite and in_model:
        judged = _with_model_backward(run, entry)
        if judged is not None:
            return judged
    return _forward_only(run, entry)


def _copied_state(model: Any, dtype: Any) -> dict[str, Any]:
    """Copies of the weights and buffers (cast when asked): the user's model is never touched."""
    import torch

    state: dict[str, Any] = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        c = t.detach().clone()
        if dtype is not None and c.is_floating_point():
            c = c.to(dtype)
        if isinstance(t, torch.nn.Parameter) and t.requires_grad:
            c.requires_grad_(True)
        state[name] = c
    return state


def _prepared(x: Any, keep: Any, batch: int | None, dtype: Any) -> Any:
    """An input with the rows left out (``keep``) and cast to ``dtype``, inside lists and dicts."""
    import torch

    if isinstance(x, torch.Tensor):
        if keep is not None and x.dim() >= 1 and x.shape[0] == batch:
            x = x[keep.to(x.device)]
        if dtype is not None and x.is_floating_point():
            x = x.to(dtype)
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_prepared(v, keep, batch, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _prepared(v, keep, batch, dtype) for k, v in x.items()}
    return x


def _forward(
    f: TorchFailure, state: dict[str, Any], prep: Callable[[Any], Any], dtype: Any
) -> tuple[Any, Any]:
    """The model's output on ``state`` for the update's prepared inputs, under the update's RNG
    state and autocast, and the loss module's loss of it (None when there is none)."""
    import torch

    model = f.model
    args, kwargs = prep(tuple(f.args)), prep(dict(f.kwargs))
    device = next((p.device for p in state.values()), torch.device("cpu"))
    loss = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.enter_context(torch.random.fork_rng(devices=[device] if device.type == "cuda"
                                                  else []))  # fmt: skip
        rng = f.extra.get("rng_state")
        if rng is not None:
            torch.set_rng_state(rng)
        stack.enter_context(torch.enable_grad())
        if f.autocast is not None and dtype is None:
            stack.enter_context(torch.autocast(device.type, dtype=f.autocast))
        out = torch.func.functional_call(model, state, tuple(args), dict(kwargs))
        if f.loss_module is not None and f.loss_args:
            largs = list(prep(tuple(f.loss_args)))
            largs[0] = out
            if dtype is not None:
                largs = [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point()
                         else a for a in largs]  # fmt: skip
            loss = f.loss_module(*largs)
    return out, loss


def _with_loss(run: _Rerun, entry: dict[str, Any], loss: Any) -> dict[str, Any]:
    """The loss module was rerun: the loss and the gradients of the weights judge the update."""
    import torch

    value = float(loss.detach().float().reshape(-1)[0]) if loss.numel() else math.nan
    params = run.params()
    grads_finite = True
    if math.isfinite(value) and params and loss.grad_fn is not None:
        grads = torch.autograd.grad(loss.sum(), params, allow_unused=True)
        grads_finite = all(bool(torch.isfinite(g).all()) for g in grads if g is not None)
    finite = math.isfinite(value) and grads_finite and run.out_finite
    entry.update(loss=value if math.isfinite(value) else None, finite=finite,
                 scope="forward, loss and backward")
    tail = (f"the loss is {value:.4g}, finite" if math.isfinite(value)
            else f"the loss is {value}")  # fmt: skip
    if math.isfinite(value) and not grads_finite:
        tail += ", but a gradient is not"
    if not finite and run.change == "without_rows":
        tail += ": leaving those rows out does not make the update finite"
    meaning = _meaning(run.change, run.basis, run.located) if finite else ""
    entry["text"] = f"{run.what} {tail}" + meaning
    return entry


def _with_model_backward(run: _Rerun, entry: dict[str, Any]) -> dict[str, Any] | None:
    """The producer is a backward node inside the model: its backward is rerun too, from the
    gradient the failing backward sent into the output (kept by the adapter; the rows left out
    left out of it too), else with that gradient taken as ones (as the replay did). None when
    the model has no weights to differentiate or no output with a graph."""
    import torch

    params = run.params()
    roots = [t for t in run.outs if t.grad_fn is not None]
    if not (params and roots):
        return None
    seed, seeded = _output_grad(run.f, roots[0], run.keep, run.batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grads = torch.autograd.grad(roots[0], params, seed, allow_unused=True)
    finite = all(bool(torch.isfinite(g).all()) for g in grads if g is not None)
    how = ("the gradient at its output the one the failing backward sent in"
           + (", those rows left out" if run.keep is not None else "")) if seeded else (
           "the gradient at its output taken as ones")  # fmt: skip
    entry.update(finite=finite, scope=f"forward and backward of the model ({how}; the "
                 "loop's loss expression is not rerun)")
    text = f"{run.what} the model's output and its gradients are " + (
        "finite" if finite else "not all finite")
    if finite:
        text += _meaning(run.change, run.basis, run.located)
    elif run.change == "without_rows":
        text += ": leaving those rows out does not make the update finite"
    entry["text"] = text
    return entry


def _forward_only(run: _Rerun, entry: dict[str, Any]) -> dict[str, Any]:
    """The loss is the user's expression: the forward judges the update, then the producer op
    recomputed in the changed way where it can be."""
    import torch

    change, located, out_finite = run.change, run.located, run.out_finite
    outs = run.outs
    out_max = max((float(t.detach().float().abs().max()) for t in outs if t.numel()), default=0.0)
    entry["scope"] = "forward only (the loss expression is the training loop's own code)"
    entry["finite"] = out_finite
    text = f"{run.what} the model's output is {'finite' if out_finite else 'non-finite'}"
    text += f" (max |x| {out_max:.3g})" if out_finite else ""
    narrow = [str(t.dtype).replace("torch.", "") for t in outs
              if t.dtype in (torch.float16, torch.bfloat16)]  # fmt: skip
    precision = located.get("precision")
    producer_phase = located.get("phase")
    if change == "float32" and narrow and isinstance(precision, dict):
        entry["finite"] = None
        entry["scope"] = "forward; the model casts to a narrow dtype itself"
        text += (f", still in {narrow[0]}: the model's own code casts to it; the producer "
                 f"{located.get('op')} recomputed in float32 gives "
                 f"{float(precision.get('value') or 0.0):.3g}, finite: a precision overflow")
        entry["text"] = text
        return entry
    if out_finite and change == "float32" and producer_phase in ("loss", "backward", "preprocess"):
        if isinstance(precision, dict) and precision.get("value") is not None:
            entry["scope"] = "forward, and the producer op recomputed in float32"
            entry["producer_value"] = precision.get("value")
            text += (f"; the producer {located.get('op')} recomputed in float32 gives "
                     f"{float(precision['value']):.3g}, finite")  # fmt: skip
            text += _meaning(change)
        else:
            entry["finite"] = None
            text += "; the producer is outside the model and was not recomputed"
    elif not out_finite and change == "without_rows":
        text += ": leaving those rows out does not make the update finite"
    elif out_finite and change == "without_rows" and producer_phase == "loss":
        again = recompute_without_rows(run.drop or [], run.batch or 0, run.f.loss)
        GRAPH_NODE.clear()
        if again is not None:
            entry["finite"] = bool(again["finite"])
            entry["scope"] = "forward, and the producer op recomputed without those rows"
            text += (f"; the producer {again['op']} recomputed without them is "
                     + (f"finite (max |x| {again['absmax']:.3g})" if again["finite"]
                        else "still non-finite"))  # fmt: skip
            if again["finite"]:
                text += _meaning(change)
        else:
            entry["finite"] = None
            text += "; the producer is in the loss expression and could not be recomputed"
    elif out_finite and producer_phase in ("forward", None):
        text += _meaning(change, run.basis, located)
    elif out_finite and change == "without_rows" and producer_phase == "preprocess":
        # the model got the loop's output: leaving rows out of it is exact for the forward
        text += _meaning(change, run.basis, located)
    elif out_finite:
        entry["finite"] = None
        text += "; the failure is outside the model's forward, which could not be rerun"
    entry["text"] = text
    return entry


def _meaning(change: str, basis: str = "suspect", located: dict[str, Any] | None = None) -> str:
    if change == "without_rows" and (located or {}).get("phase") == "preprocess":
        return (f": the values the training loop's {(located or {}).get('op')} made in those rows "
                "are what broke the update")
    if change == "without_rows" and basis == "producer":
        op = (located or {}).get("op")
        return f": the values in those rows are what made {op} non-finite"
    return {"float32": ": a precision overflow", "without_rows": ": those rows are the cause"}.get(
        change, ""
    )


def _what(change: str, drop: list[int] | None, f: TorchFailure) -> str:
    if change == "float32":
        return f"rerun in float32, update {f.step}:"
    rows = ", ".join(str(r) for r in (drop or [])[:5])
    return f"rerun without batch row(s) {rows}, update {f.step}:"


def _batch_size(f: TorchFailure) -> int | None:
    import torch

    for x in list(tensors(f.args)) + list(tensors(f.kwargs)):
        if isinstance(x, torch.Tensor) and x.dim() >= 1:
            return int(x.shape[0])
    return None
