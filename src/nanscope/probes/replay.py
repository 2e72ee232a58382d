"""The decisive experiment, in process: the failing window rerun from a snapshot, one change each.

When a detector stops a PyTorch fit, the adapter kept (:mod:`nanscope.torch.history`) snapshots
of the weights and optimizer state, the inputs of each recent update and the user's training step
cut out of their loop (:mod:`nanscope.probes.loopslice`). :func:`experiments` then

1. picks the latest snapshot taken before the trouble began (the jump, the climb, or at least one
   update before the failure) and the updates from it to the failure;
2. reruns that window unchanged, twice over: the **control**. It must reproduce the recorded
   losses (the first within ``MATCH``) and the failure, or no experiment is believed and the
   diagnosis says the replay was not faithful;
3. reruns it once per intervention that bears on the candidates: the learning rate cut to
   1/10, 1/100, 1/1000 (each parameter group's recorded lr scaled); the applied update turned
   round (a flipped sign: the step's change of the weights negated);
   the suspect rows left out of their batches; the
   unscaled input columns standardised (from a snapshot before update 1 only); an epsilon at the
   producing op; the optimizer's ``eps`` restored; the gradient norm clipped to its level before
   the trouble; a standard initialisation.

Each rerun's losses are judged by :func:`nanscope.outcome.judge`, the same judgement as a healthy
verdict: an intervention *removes the failure* when every loss of the rerun is finite and it ended
not far above where it started. The entries go into the diagnosis's ``confirmation``; the engine
decides the cause from them (:mod:`nanscope.diagnose.decide`).

Everything runs on the user's own model and optimizer, with nanscope's hooks set aside, the
script's own output silenced and the RNG forked; their state is restored afterwards to what it
was at the failure. A fault becomes an entry that says so, never an exception.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from nanscope.capture.arrays import typo_rows
from nanscope.numerics import RAW_UNITS
from nanscope.outcome import FAR, judge
from nanscope.probes._measure import forward_name
from nanscope.probes._tensors import loss_before_scale, op_watch
from nanscope.probes.failure import TorchFailure
from nanscope.probes.stepwatch import StepWatch

__all__ = ["MATCH", "REPLAY_SECONDS", "data_step", "experiments", "onset_of"]

#: a batch tensor of more elements than this is not read for outlier rows (a large image batch)
OUTLIER_READ = 1 << 22

#: the control's first loss must be within this relative distance of the recorded one
MATCH = 0.05
#: all reruns of one failure together take at most this long (the fit waits for them)
REPLAY_SECONDS = 30.0
#: the window is rerun this many times over (a failure delayed by a smaller step shows later)
PASSES = 2
#: ... and at least this many updates in all (a window of two updates is rerun 12 times)
MIN_UPDATES = 24
#: a rerun whose last pass over the window's batches gives losses of this many times those of
#: its first pass or more has not removed the failure: it does not train (gradient descent on
#: the same batches lowers their loss, however small the step: the direction is what counts;
#: a loss that does not move at all, its gradient cut off by a clamp, is stuck, not cured)
NOISE = 1.0
#: the gradient norm a clipping replay bounds to when too few updates came before the trouble
#: to know its level: the ``max_norm`` most scripts pass to ``clip_grad_norm_``
CLIP_DEFAULT = 1.0
#: what a hand-written step's own tensors (a velocity) may take in copies around a replay
STATE_COPY_BYTES = 64 * 2**20
#: ops whose non-finite output an epsilon can prevent, and how (see ``_EpsilonMode``)
GUARDED_LOGS = ("log", "log2", "log10", "log1p", "xlogy")
GUARDED_DIVISIONS = ("div", "true_divide", "divide", "reciprocal", "rsqrt", "sqrt", "norm",
                "vector_norm", "pow", "std", "var", "cosine_similarity", "normalize")  # fmt: skip


class _Unfed(Exception):
    """The replayed step never called the model through its hooks."""


def experiments(failure: TorchFailure, found: dict[str, Any]) -> list[dict[str, Any]]:
    """The control and each intervention's outcome (``confirmation`` entries); never raises.
    ``found``: the evidence so far; where the localisation named no op and the control saw the
    producer (:mod:`nanscope.probes.stepwatch`), it is added there as ``located``."""
    history = failure.extra.get("history")
    if history is None:
        return []
    if history.off is not None:
        return [_not_run("replay", f"no replay: {history.off}")]
    try:
        return _Replay(failure, found, history).run()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a probe bug must never kill the user's run
        return [_not_run("replay", f"the replay failed ({type(exc).__name__}: {exc})")]


def data_step(failure: TorchFailure, alarm: dict[str, Any]) -> str | None:
    """Whether a departure (the loss out of its range and staying out) is the data's doing: the
    weights from before the jump, frozen, give the same high loss on the batches after it (a
    harder curriculum stage, a new data shard, a GAN's discriminator catching up), rather than
    the low loss they had. A sentence saying so, or None (the weights moved: a divergence, or
    no replay could tell). Never raises."""
    history = failure.extra.get("history")
    if history is None or history.off is not None:
        return None
    try:
        return _Replay(failure, {}, history).data_step(alarm)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return None


def _not_run(change: str, text: str) -> dict[str, Any]:
    return {"change": change, "ran": False, "finite": None, "loss": None, "scope": "window",
            "text": text}  # fmt: skip


class _ReplayedModel:
    """The user's model and optimizer as the replay handles them: their state saved before the
    reruns and restored after, a snapshot's loaded before each rerun, widened to float32; and
    what their weights are (in half precision? how far above the default initialisation?)."""

    def __init__(self, failure: TorchFailure, history: Any) -> None:
        import torch

        self.torch = torch
        self.f = failure
        self.model = history.model
        self.h = history
        self.optimizer = history.optimizer
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        #: the script updates its parameters by hand: its own code is the step, and a smaller
        #: step is what it applied, scaled (exact for a hand-written SGD)
        self.by_hand = bool(getattr(self.optimizer, "by_hand", False))

    def _save(self) -> dict[str, Any]:
        import copy

        torch = self.torch
        with torch.no_grad():
            return {
                "params": [p.detach().clone() for p in self.params],
                "grads": [None if p.grad is None else p.grad.detach().clone()
                          for p in self.params],
                "buffers": [b.detach().clone() for b in self._buffers()],
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "scaler": (self.f.grad_scaler.state_dict() if self.f.grad_scaler is not None
                           else None),
                "training": getattr(self.model, "training", None),
            }

    def _restore(self, saved: dict[str, Any]) -> None:
        torch = self.torch
        with torch.no_grad():
            for p, value in zip(self.params, saved["params"]):
                _put(p, value)
            for p, grad in zip(self.params, saved["grads"]):
                p.grad = grad
            for b, value in zip(self._buffers(), saved["buffers"]):
                _put(b, value)
        self.optimizer.load_state_dict(saved["optimizer"])
        if saved["scaler"] is not None:
            self.f.grad_scaler.load_state_dict(saved["scaler"])
        if saved["training"] is not None and hasattr(self.model, "train"):
            self.model.train(saved["training"])

    def _load(self, snap: Any) -> None:
        import copy

        torch = self.torch
        with torch.no_grad():
            for p, value in zip(self.params, snap.params):
                p.grad = None
                _put(p, value)
            for b, value in zip(self._buffers(), snap.buffers):
                _put(b, value)
        self.optimizer.load_state_dict(copy.deepcopy(snap.optimizer))
        if snap.rng is not None:
            torch.set_rng_state(snap.rng)

    def _buffers(self) -> list[Any]:
        return list(self.model.buffers()) if self.model is not None else []

    def _script_tensors(self) -> list[Any]:
        """The tensors a hand-written step reads from the script besides the weights (one level
        into lists, tuples and dicts): its own state, a velocity, is among them."""
        torch = self.torch
        plan = self.h.plan
        base = {**(self.h.frame_globals or {}), **(self.h.frame_locals or {})}
        weights = {id(p) for p in self.params}
        out: list[Any] = []
        for name in plan.free if plan is not None else ():
            value = base.get(name)
            items = (list(value.values()) if isinstance(value, dict) else
                     list(value) if isinstance(value, (list, tuple)) else [value])  # fmt: skip
            out.extend(t for t in items[:256]
                       if isinstance(t, torch.Tensor) and id(t) not in weights)  # fmt: skip
        return out

    def _widen(self) -> None:
        """The model, its buffers and the optimizer's state in float32 (from half or bf16)."""
        torch = self.torch
        narrow = (torch.float16, torch.bfloat16)
        state = self.optimizer.state_dict()
        with torch.no_grad():
            for p in self.params:
                if p.dtype in narrow:
                    p.data = p.data.float()
            for b in self._buffers():
                if b.dtype in narrow:
                    b.data = b.data.float()
        self.optimizer.load_state_dict(state)  # (its floating state follows the params' dtype)

    def _narrow(self) -> bool:
        """The fit computes in half precision or bf16: its weights, or autocast at the forward."""
        torch = self.torch
        narrow = (torch.float16, torch.bfloat16)
        return any(p.dtype in narrow for p in self.params) or self.f.autocast in narrow

    def _bare_scale(self, snap: Any, window: list[Any]) -> dict[str, Any] | None:
        """No model: the weight matrix of the snapshot farthest above a standard scale, measured
        as a bare-tensor loop's first update measures it
        (:func:`nanscope.torch.first_update.initial_weight_scale`)."""
        from nanscope.torch.first_update import initial_weight_scale

        tables = tuple(a for u in window for args, _ in u.forwards for a in args[:1])
        scale = initial_weight_scale(list(snap.params), tables)
        if not scale:
            return None
        worst = max(scale["layers"], key=lambda x: x["ratio"])
        return {"param": worst["param"], "ratio": round(worst["ratio"], 4)}

    def _initial_scale(self, snap: Any) -> dict[str, Any] | None:
        """How far the snapshot's weights sit above the framework's default initialisation of
        their module: the weight matrix whose std is the most times that of a fresh
        ``reset_parameters()`` of a copy of its module (lookup tables left out).
        ``{"param", "ratio"}``, or None."""
        import copy

        torch = self.torch
        if self.model is None:
            return None
        position = {id(p): i for i, p in enumerate(self.params)}
        worst: tuple[float, str, float] | None = None
        for name, module in self.model.named_modules():
            if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
                continue  # a lookup table: its default N(0, 1) is no fan-in scale to compare to
            own = [(n, p) for n, p in module.named_parameters(recurse=False)
                   if p.dim() >= 2 and p.is_floating_point() and id(p) in position]  # fmt: skip
            if not own or not callable(getattr(module, "reset_parameters", None)):
                continue
            if sum(p.numel() for _, p in own) > 50_000_000:
                continue
            fresh = copy.deepcopy(module)
            with torch.random.fork_rng(devices=[]):
                fresh.reset_parameters()
            default = dict(fresh.named_parameters(recurse=False))
            for pname, p in own:
                base = float(default[pname].detach().float().std())
                now = float(snap.params[position[id(p)]].detach().float().std())
                if base > 0 and now > 0:
                    ratio = now / base
                    if worst is None or ratio > worst[0]:  # the largest: what can blow up
                        worst = (ratio, f"{name}.{pname}" if name else pname, ratio)
        if worst is None:
            return None
        return {"param": worst[1], "ratio": round(worst[2], 4)}


class _Replay(_ReplayedModel):
    """The control and the interventions, each a rerun of the failing window from a snapshot."""

    def __init__(self, failure: TorchFailure, found: dict[str, Any], history: Any) -> None:
        super().__init__(failure, history)
        self.evidence = found
        self.deadline = time.monotonic() + REPLAY_SECONDS
        self.recorded = _first_losses(failure.extra.get("losses") or [])

    # ------------------------------------------------------------------ the plan of runs

    def run(self) -> list[dict[str, Any]]:
        fail = int(self.f.step or 0)
        onset = int(self.f.extra.get("onset") or fail)
        snap = self._snapshot(onset, fail)
        if snap is None:
            return [_not_run("replay", f"no snapshot from before update {onset} with the "
                             "batches of every update since (kept: "
                             f"{[s.step for s in self.h.snapshots()]})")]  # fmt: skip
        window = self.h.inputs(snap.step, fail)
        assert window is not None
        saved = self._save()
        out: list[dict[str, Any]] = []
        devices = sorted({p.device.index or 0 for p in self.params if p.device.type == "cuda"})
        state = _ScriptState(self._script_tensors()) if self.by_hand else None
        try:
            with self.torch.random.fork_rng(devices=devices):
                self._experiments(snap, window, saved, out, state)
        finally:
            if state is not None:
                state.restore()
        return out

    def _experiments(self, snap: Any, window: list[Any], saved: dict[str, Any],
                     out: list[dict[str, Any]], state: _ScriptState | None = None) -> None:
        try:
            # the op that makes the value, where the localisation could not see it (outside the
            # model, or no model): watched while the control reruns the whole step
            located = self.evidence.get("located") or {}
            # (an op only guessed, not seen make the value, is replaced by one the control sees)
            guessed = located.get("guessed") or located.get("observed") is False
            watch = StepWatch()
            control = self._rerun(snap, window, "control", {"watch": watch})
            out.append(control)
            # (no model: what a model is fed is the recorded batch, which the rows experiment
            # and the rules read; a model-less step reads its data itself)
            if watch.data_nonfinite and control.get("reproduced") and self.model is None:
                control["data_nonfinite"] = True
                control["text"] += ("; the step read NaN/inf from data made before it (a tensor "
                                    "it slices), which no rerun of the step changes")  # fmt: skip
            elif (not located.get("op") or guessed) and watch.found is not None and control.get(
                    "reproduced"):  # fmt: skip
                self.evidence["located"] = watch.found
            changed = state.changed() if state is not None else []
            if changed:
                # a velocity or a counter of the script's own: not in the snapshot, so the
                # control ran from today's value of it, and no rerun can be trusted
                out.append(_not_run("replay", "no experiment: the hand-written update changes "
                                    f"tensors besides the weights ({changed}); the snapshot "
                                    "does not hold their earlier values"))  # fmt: skip
                return
            if not control.get("reproduced"):
                return
            for change, setup in self._interventions(snap, window):
                if time.monotonic() > self.deadline:
                    out.append(_not_run(change, f"not run: the replays' time budget "
                                                f"({REPLAY_SECONDS:.0f} s) was spent"))  # fmt: skip
                    continue
                out.append(self._rerun(snap, window, change, setup))
        finally:
            self._restore(saved)

    def data_step(self, alarm: dict[str, Any]) -> str | None:
        jump_from, jump_to = alarm.get("jump_from_step"), alarm.get("jump_to_step")
        fail = int(self.f.step or 0)
        if not isinstance(jump_from, int) or not isinstance(jump_to, int) or jump_to > fail:
            return None
        snap = next((s for s in reversed(self.h.snapshots()) if s.step <= jump_from
                     and self.h.inputs(s.step, fail) is not None), None)  # fmt: skip
        after = self.h.inputs(jump_to, fail)
        if snap is None or after is None:
            return None
        before = [v for s, v in self.recorded.items() if snap.step <= s <= jump_from
                  and math.isfinite(v)]  # fmt: skip
        observed = [v for s, v in self.recorded.items() if jump_to <= s <= fail
                    and math.isfinite(v)]  # fmt: skip
        if not before or not observed:
            return None
        saved = self._save()
        try:
            with self.torch.random.fork_rng(devices=[]):
                self._load(snap)
                frozen = [self._one(u, {"lr": 0.0}, {}, None) for u in after]
        finally:
            self._restore(saved)
        if not frozen or not all(math.isfinite(v) for v in frozen):
            return None
        level_before = sorted(before)[len(before) // 2]
        level_after = sorted(observed)[len(observed) // 2]
        level_frozen = sorted(frozen)[len(frozen) // 2]
        if level_before <= 0 or level_after <= level_before:
            return None
        # on the log scale, the frozen weights' loss is nearer the loss after the jump than the
        # loss before it: the batches got harder, the weights did not break
        if math.log(level_frozen / level_before) < 0.5 * math.log(level_after / level_before):
            return None
        return (f"the loss stepped up at update {jump_to} with the data, not the weights: the "
                f"weights of update {snap.step}, from before the step, give a median loss of "
                f"{level_frozen:.4g} on the batches of updates {jump_to}-{fail} (the run had "
                f"{level_after:.4g} there and {level_before:.4g} before): a harder stage or a new "
                "shard of data, not a divergence")

    def _snapshot(self, onset: int, fail: int) -> Any:
        """The latest snapshot taken before the trouble (at least one update before a failure
        past update 1) whose updates up to the failure are all kept."""
        before = max(1, min(onset, fail - 1 if fail > 1 else 1))
        for snap in reversed(self.h.snapshots()):
            if snap.step <= before and self.h.inputs(snap.step, fail) is not None:
                return snap
        return None

    def _interventions(self, snap: Any, window: list[Any]) -> list[tuple[str, Any]]:
        changes: list[tuple[str, Any]] = []
        # a window of one update: its loss comes before its step, which no lr changes; unless the
        # update's own loss was finite and the non-finite value came later within its step (a
        # closure evaluated again by LBFGS's line search, at weights the lr moved)
        if len(window) >= 2 or self.f.loss_finite_before_step() is not None:
            for factor in (0.1, 0.01, 0.001):
                changes.append((f"lr_x{factor:g}", {"lr": factor}))
            # the applied update turned round: what a flipped sign (w + lr * g) needs
            changes.append(("sign_flipped", {"lr": -1.0}))
        rows = self._suspect_rows(window)
        sizes = {u.step: _batch_size(u.forwards) for u in window}
        # rows that are the whole batch (a column broken in every row) cannot be left out
        rows = {s: r for s, r in rows.items() if len(r) < (sizes.get(s) or len(r) + 1)}
        tables = {} if self.model is not None else _clean_tables(self.h, window)
        borne = {} if rows else tables  # (the kinds of rows: the batch's, where it showed any)
        rows = rows or _table_borne(tables, self.f.step, window)
        if rows:
            named = [*(self.evidence.get("rows") or []), *(self.f.extra.get("rows") or [])]
            nonfinite = _holds_nonfinite(window) or bool(borne.get("table_nonfinite"))
            extreme = _holds_extreme(window, named, self.f.step) or borne.get("table_extreme")
            changes.append(("without_rows", {"rows": rows, "nonfinite": nonfinite,
                                             "extreme": extreme, **tables}))  # fmt: skip
            if nonfinite and extreme and _outliers_beside_nonfinite(window):
                # both kinds, in other rows: leaving out the NaN/inf rows alone tells them apart
                changes.append(("without_nonfinite_rows", {
                    "rows": rows, "nonfinite": True, "only_nonfinite": True,
                    **(_clean_tables(self.h, window, only_nonfinite=True) if tables else {})}))
        columns = _unscaled_columns(window, self.f.extra.get("unscaled_column"))
        if columns and snap.step == 1:
            changes.append(("standardised", {"columns": columns}))
        located = self.evidence.get("located") or {}
        op = str(located.get("op") or "").split(".")[0]
        if op.endswith(("Backward0", "Backward1")):
            op = forward_name(op)  # (a backward producer: LogBackward0 guards at its log)
        # (not a producer in the loop's preprocessing: the replay feeds the model the inputs it
        # got, so an epsilon there could change nothing)
        if located.get("phase") in ("forward", "loss", "backward") and (
            op in GUARDED_LOGS or op in GUARDED_DIVISIONS
        ):
            changes.append(("eps", {"op": op}))
        if any(g.get("eps") == 0 for g in self.optimizer.param_groups):
            changes.append(("optimizer_eps", {"optimizer_eps": 1e-8}))
        if self._narrow():
            changes.append(("float32", {"float32": True}))
        if len(window) >= 2 and not (self.h.plan is not None and self.h.plan.clips):
            # (a step that clips already: a clip of the replay's own tests nothing more)
            changes.append(("clipped", {"clip": True}))
        if snap.step == 1:
            changes.append(("standard_init", {"reinit": True}))
        return changes

    def _suspect_rows(self, window: list[Any]) -> dict[int, list[int]]:
        """``{update: [batch rows]}``: every row of a kept batch that holds NaN/inf or an outlier
        (read here, in full), and the extreme rows the probes named."""
        steps = {u.step for u in window}
        out: dict[int, list[int]] = {}
        for update in window:
            bad: set[int] = set()
            outliers = False
            for i, it in enumerate(update.iterations):
                bad |= set(_nonfinite_rows(it.forwards, it.values))
                found = _outlier_rows(it.forwards, it.values)
                outliers = outliers or bool(found)
                if i == len(update.iterations) - 1:  # (the earlier ones': _rows_for reads them)
                    bad |= set(found)
            if bad or outliers:
                out[update.step] = sorted(bad)
        for row in [*(self.evidence.get("rows") or []), *(self.f.extra.get("rows") or [])]:
            if not isinstance(row, dict) or row.get("why") not in ("nonfinite", "nan", "inf",
                                                                   "extreme"):  # fmt: skip
                continue
            step, batch_row = row.get("step", self.f.step), row.get("batch_row")
            if isinstance(step, int) and step in steps and isinstance(batch_row, int):
                out.setdefault(step, [])
                if batch_row not in out[step]:
                    out[step].append(batch_row)
        return out

    # ------------------------------------------------------------------ one rerun

    def _rerun(self, snap: Any, window: list[Any], change: str,
               setup: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        setup = setup or {}
        started = time.monotonic()
        try:
            losses = self._losses(snap, window, setup)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the user's step may exit, or raise a test's own failure
            return _not_run(change, _why_not_run(exc))
        seconds = time.monotonic() - started
        judged = judge(losses)
        # removed: finite, no blow-up and no excursion, and it trains: the window's own batches
        # give a lower loss on its last pass than on its first (a flipped sign only climbs more
        # slowly at a smaller step; batches of different difficulty alternate in a cycle)
        # (or, but for a turned-round step, which must train to count, it held the loss an
        # order of magnitude below where the fit began: a loss at its floor, whose passes differ
        # by noise, as a confident classifier's 0.004 and 0.016 do)
        floor = self._fit_start() / FAR if change != "sign_flipped" else None
        fixed = judged.kind == "ok" and _trains(losses, len(window), floor)
        first = losses[0] if losses else math.nan
        entry: dict[str, Any] = {
            "change": change,
            "ran": True,
            "scope": "window",
            "from_step": snap.step,
            "to_step": window[-1].step,
            "updates": len(losses),
            "finite": all(math.isfinite(v) for v in losses),
            "loss": _json_float(losses[-1]) if losses else None,
            "losses": [round(v, 6) if math.isfinite(v) else _text(v) for v in losses[:64]],
            "fixed": fixed,
            "outcome": judged.kind,
            "seconds": round(seconds, 3),
        }
        if change == "control":
            recorded = self.recorded.get(snap.step)
            match = recorded is not None and _same_loss(first, recorded)
            entry["recorded_first"] = _json_float(recorded) if recorded is not None else None
            entry["reproduced"] = bool(match and not fixed)
            entry["fixed"] = False
            if not match:
                entry["text"] = (f"the replay is not faithful: its first loss {first:.4g} is not "
                                 f"the recorded {recorded if recorded is not None else '?'} "
                                 "(a loss that depends on state the replay cannot restore)")
            elif fixed:
                entry["text"] = ("the replay did not reproduce the failure: the window ran "
                                 f"finite from update {snap.step} ({judged.text()})")
            else:
                entry["text"] = (f"updates {snap.step}-{window[-1].step} rerun unchanged from a "
                                 f"snapshot reproduce the failure ({judged.text()})")
            return entry
        entry.update({"rows_nonfinite": True} if setup.get("nonfinite") else {})
        if setup.get("extreme") is not None:
            entry["rows_extreme"] = bool(setup["extreme"])
        if setup.get("clip"):
            setup = {**setup, "clip_to": _clip_level(self.f.extra, snap.step)}
        if setup.get("reinit"):
            scale = (self._initial_scale(snap) if self.model is not None
                     else self._bare_scale(snap, window))  # fmt: skip
            setup = {**setup, "bare": self.model is None}
            if scale:
                entry["initial_scale"] = scale
                setup = {**setup, "initial_scale": scale}
        entry["text"] = _describe(change, setup, snap, window, judged, fixed)
        if setup.get("op"):
            entry["op"] = setup["op"]
        if setup.get("columns"):
            entry["columns"] = list(setup["columns"])
        return entry

    def _losses(self, snap: Any, window: list[Any], setup: dict[str, Any]) -> list[float]:
        try:
            return self._run_window(snap, window, setup)
        except (RuntimeError, ValueError, IndexError):  # (torch's shape errors, by function)
            if not setup.get("rows"):
                raise
            # targets made from data the replay does not hold row by row (a slice of a tensor
            # made before the loop): the rows are replaced by a clean row of their batch instead
            return self._run_window(snap, window, {**setup, "replace_rows": True})

    def _run_window(self, snap: Any, window: list[Any], setup: dict[str, Any]) -> list[float]:
        self._load(snap)
        if setup.get("reinit"):
            if self.model is not None:
                _reinitialise(self.model)
            else:
                _reinitialise_bare(self.params, _widths(window))
        if "optimizer_eps" in setup:
            for group in self.optimizer.param_groups:
                if group.get("eps") == 0:
                    group["eps"] = setup["optimizer_eps"]
        if setup.get("float32"):
            self._widen()
        losses: list[float] = []
        stats = _column_stats(window, setup.get("columns") or [])
        clip_to = _clip_level(self.f.extra, snap.step) if setup.get("clip") else None
        # a short window is rerun over and over, so that a failure a smaller step only delays
        # still shows (at least MIN_UPDATES updates, at least PASSES passes)
        passes = max(PASSES, math.ceil(MIN_UPDATES / max(len(window), 1)))
        for _ in range(passes):
            for update in window:
                loss = self._one(update, setup, stats, clip_to)
                losses.append(loss)
                if not math.isfinite(loss):
                    return losses
                if time.monotonic() > self.deadline + 10.0:
                    raise TimeoutError("the replay ran past its time budget")
        return losses

    def _one(self, update: Any, setup: dict[str, Any], stats: dict[int, tuple[float, float]],
             clip_to: float | None) -> float:  # fmt: skip
        """Rerun one update: each of its loop iterations as it ran, the step at its last."""
        torch = self.torch
        plan = self.h.plan
        factor = float(setup.get("lr", 1.0))
        # a smaller step is the optimizer's own lr scaled (exact for every torch optimizer, LBFGS
        # and its line search included); a turned-round update is the applied update negated,
        # and so is a smaller one of an update written by hand (exact for its plain SGD)
        scaled = factor <= 0 or (self.by_hand and factor != 1.0)
        scale = factor if factor > 0 else 1.0
        if not self.by_hand:
            for group, lr in zip(self.optimizer.param_groups, update.lrs):
                if math.isfinite(lr):
                    group["lr"] = lr * scale
        before = [p.detach().clone() for p in self.params] if scaled else None
        self.optimizer.zero_grad(set_to_none=True)  # each update starts from no gradient
        backward: list[Any] = []
        base = {**(self.h.frame_globals or {}), **(self.h.frame_locals or {})}
        iterations = update.iterations
        for index, iteration in enumerate(iterations):
            rows = _rows_for(setup, update, index, iteration)
            # one namespace (a comprehension in the step sees the loop's names as globals)
            namespace = dict(base)
            for name in plan.fed:  # what only the model reads: it is fed what it got
                namespace.setdefault(name, None)
            size = _batch_size(iteration.forwards)
            replace = bool(setup.get("replace_rows"))
            for name, value in iteration.values.items():
                namespace[name] = value if replace else _without_rows(value, rows, size)
            namespace.update(setup.get("tables") or {})
            # (with no model nothing is fed: the script's code makes its batch from the names)
            recorded = iteration.forwards if self.model is not None else []
            forwards = [(_without_rows(a, rows, size, replace=replace),
                         _without_rows(k, rows, size, replace=replace))
                        for a, k in recorded]  # fmt: skip
            _rows_reached(rows, forwards, namespace, iteration, recorded, setup)
            if stats and self.model is not None:
                forwards = [(_standardise(a, stats), k) for a, k in forwards]
            elif stats:
                # no model to feed: the tables the step reads its batch from (a slice of X made
                # before the loop, the loop's xb), standardised where they have the batch's width
                width = _width(iteration.forwards)
                for name in dict.fromkeys((*plan.free, *iteration.values)):  # each name once
                    value = namespace.get(name)
                    if _is_table(value, width):
                        namespace[name] = _standardise((value,), stats)[0]
            if setup.get("float32"):
                forwards = [(_as_float32(a), _as_float32(k)) for a, k in forwards]
                for name in iteration.values:
                    namespace[name] = _as_float32(namespace[name])
            # autocast caches its casts of the weights while any autocast region is open (the
            # check runs inside the user's step, which may be inside one): not across updates
            torch.clear_autocast_cache()
            after = _clip_after(torch, self.params, clip_to) if self.by_hand else None
            watch = setup.get("watch")
            # (grad mode on: a hand-written loop is checked in an autograd engine callback,
            # where it is off)
            with _feeding(self.model, forwards), _catching(torch, backward, after), \
                    _clipping(None if self.by_hand else self.optimizer, clip_to), \
                    _epsilon(torch, setup.get("op")), \
                    op_watch(watch.note) if watch is not None else contextlib.nullcontext(), \
                    torch.enable_grad(), \
                    _full_precision(torch, bool(setup.get("float32"))):
                exec(plan.code, namespace)  # the user's training step, on their model
            torch.clear_autocast_cache()
        if before is not None:
            with torch.no_grad():
                for p, b in zip(self.params, before):
                    p.copy_(b + factor * (p - b))
        if not backward:
            raise RuntimeError("the replayed step made no backward() call")
        values = [float(t.detach().float().mean()) for t in backward]
        scaler = self.f.grad_scaler
        if scaler is not None and getattr(scaler, "is_enabled", lambda: False)():
            scale = float(scaler.get_scale())
            values = [v / scale for v in values]
        if isinstance(self.optimizer, torch.optim.LBFGS):
            return values[0]  # the closure's first evaluation, as the record holds it
        # the sum over the micro-batches, as the record holds it: (loss / n).backward() each
        return math.fsum(values)

    def _fit_start(self) -> float:
        """The loss the fit began at (its update 1's, when the record reaches back to it: the
        model as initialised), else NaN."""
        first = self.recorded.get(1, math.nan)
        return first if math.isfinite(first) else math.nan


def _first_losses(losses: list[tuple[int, float]]) -> dict[int, float]:
    """Each update's loss, its first record's: a closure step (LBFGS) whose later evaluation
    went non-finite records that loss again for the same update, after its own."""
    recorded: dict[int, float] = {}
    for step, loss in losses:
        recorded.setdefault(step, loss)
    return recorded


def _clip_level(extra: dict[str, Any], step: int) -> float:
    """The median gradient norm of the updates before ``step`` (at least three of them): the
    level before the trouble; with fewer seen, 1.0, the usual ``max_norm``."""
    norms = sorted(v for s, v in extra.get("grad_norms") or [] if s <= step and
                   math.isfinite(v) and v > 0)  # fmt: skip
    return norms[len(norms) // 2] if len(norms) >= 3 else CLIP_DEFAULT

# ------------------------------------------------------------------------------ the changes


def _unscaled_columns(window: list[Any], named: Any) -> list[int]:
    """The columns (last axis) of a table or sequence model input that are not in standardised
    units: a value of more than ``RAW_UNITS`` in magnitude (10 standard deviations out, were the
    column standardised) in the window's batches, or, where none could be read, the one the
    trace ``named`` (from its first batch's largest value, a typo's included)."""
    import torch

    top: Any = None
    for update in window:
        for it in update.iterations:
            # a typo's row is an outlier, not the column's units (it is left out instead)
            outliers = _outlier_rows(it.forwards, it.values)
            for args, _ in it.forwards:
                x = args[0] if args else None
                if x is None or _features(x) is None:
                    continue
                col = torch.nan_to_num(x.detach().abs().double(), nan=0.0, posinf=0.0)
                if outliers and len(outliers) < col.shape[0]:
                    keep = torch.ones(col.shape[0], dtype=torch.bool, device=col.device)
                    keep[outliers] = False
                    col = col[keep]
                col = col.reshape(-1, col.shape[-1]).amax(dim=0).cpu()
                top = col if top is None or top.shape != col.shape else torch.maximum(top, col)
    columns = [] if top is None else [int(i) for i in torch.nonzero(top > RAW_UNITS).flatten()]
    if top is None and isinstance(named, int):
        columns.append(named)
    return sorted(columns)


def _column_stats(window: list[Any], columns: list[int]) -> dict[int, tuple[float, float]]:
    """Each column's mean and std over the window's batches (a std of 0 read as 1)."""
    import torch

    out: dict[int, tuple[float, float]] = {}
    for column in columns:
        values = [f[:, column].double() for u in window for args, _ in u.forwards
                  for f in map(_features, args[:1]) if f is not None and f.shape[1] > column]
        if values:
            col = torch.cat(values)
            col = col[torch.isfinite(col)]
            if col.numel() > 1:
                std = float(col.std())
                out[column] = (float(col.mean()), std if std > 0 else 1.0)
    return out


def _rows_for(setup: dict[str, Any], update: Any, index: int,
              iteration: Any) -> list[int] | None:  # fmt: skip
    """The rows to leave out of this iteration's batch: those holding NaN/inf in it or an
    outlier (:func:`_outlier_rows`), and the extreme rows the probes named in the update's last
    iteration."""
    rows_by_step = setup.get("rows")
    if not rows_by_step or update.step not in rows_by_step:
        return None
    rows = set(_nonfinite_rows(iteration.forwards, iteration.values))
    if not setup.get("only_nonfinite"):
        rows |= set(_outlier_rows(iteration.forwards, iteration.values))
        if index == len(update.iterations) - 1:
            rows |= set(rows_by_step[update.step])
    size = _batch_size(iteration.forwards)
    if size is not None and len(rows) >= size:
        return None  # the whole batch: nothing to leave out (a column broken everywhere)
    return sorted(rows) or None


def _table_borne(tables: dict[str, Any], step: int | None,
                 window: list[Any]) -> dict[int, list[int]]:  # fmt: skip
    """Where no batch row of a step without a model stands out (a typo in a target the step
    slices itself goes unread) but the tables it slices its batches from hold NaN/inf or typo
    rows (``tables``, :func:`_clean_tables`): ``{failing update: []}``, the rows experiment
    then runs on the tables; else ``{}``."""
    return {int(step or window[-1].step): []} if tables.get("tables") else {}


def _clean_tables(history: Any, window: list[Any], *,
                  only_nonfinite: bool = False) -> dict[str, Any]:  # fmt: skip
    """For a step without a model that slices its batch from tables made before the loop
    (``xb = X[idx]``): each such table (a floating tensor of more rows than a batch, read in
    full) whose rows hold NaN/inf or (unless ``only_nonfinite``) a typo (:func:`typo_rows`), as
    a copy with those rows overwritten by its first clean row, so that every index the step
    draws stays valid. The setup fields of a rows experiment: ``tables`` (``{name: copy}``),
    ``table_rows`` (``{name: rows}``), ``table_nonfinite`` and ``table_extreme`` (which kinds
    were found); ``{}`` when no table holds such rows."""
    import torch

    plan = history.plan
    base = {**(history.frame_globals or {}), **(history.frame_locals or {})}
    size = next((s for u in window for it in u.iterations
                 if (s := _batch_size(it.forwards)) is not None), None)  # fmt: skip
    if plan is None or size is None:
        return {}
    out: dict[str, Any] = {}
    noted: dict[str, list[int]] = {}
    kinds = {"table_nonfinite": False, "table_extreme": False}
    for name in plan.free:
        value = base.get(name)
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()
                and value.dim() >= 1 and value.shape[0] > size
                and value.numel() <= OUTLIER_READ):  # fmt: skip
            continue
        table = value.detach().float().reshape(value.shape[0], -1).cpu()
        bad = set(torch.nonzero(~torch.isfinite(table).all(dim=1)).flatten().tolist())
        typos = set() if only_nonfinite else {
            int(r["batch_row"]) for r in typo_rows(table.numpy(), "batch")}
        kinds["table_nonfinite"] |= bool(bad)
        kinds["table_extreme"] |= bool(typos - bad)
        bad |= typos
        if not bad or len(bad) > max(1, len(table) // 8):
            continue  # nothing to replace, or a column in raw units: every row, not a few
        clean = next(i for i in range(len(table)) if i not in bad)
        copy = value.detach().clone()
        copy[torch.tensor(sorted(bad), device=value.device)] = value[clean].detach()
        out[name] = copy
        noted[name] = sorted(bad)
    return {"tables": out, "table_rows": noted, **kinds} if out else {}


def _same_loss(replayed: float, recorded: float) -> bool:
    """The replay's loss is the recorded one: within ``MATCH``, or both non-finite."""
    if not math.isfinite(recorded):
        return not math.isfinite(replayed)
    return math.isfinite(replayed) and abs(replayed - recorded) <= MATCH * max(abs(recorded),
                                                                             1e-12)


def _put(tensor: Any, value: Any) -> None:
    """``tensor`` holds ``value`` again, in ``value``'s dtype (a float32 rerun widened it)."""
    if tensor.dtype != value.dtype:
        tensor.data = value.clone()
    else:
        tensor.copy_(value)


def _batch_size(forwards: list[Any]) -> int | None:
    """The first dimension of the first tensor a forward was given."""
    import torch

    for args, kwargs in forwards:
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor) and a.dim() >= 1:
                return int(a.shape[0])
    return None


def _batch_tensors(forwards: list[Any], values: dict[str, Any]) -> tuple[int, list[Any]]:
    """The batch's size and its floating tensors of that size (the forwards' and the captured
    ones: inputs, targets)."""
    import torch

    size = _batch_size(forwards)
    if size is None:
        return 0, []
    return size, [v for v in [*(a for args, kw in forwards for a in (*args, *kw.values())),
                              *values.values()]
                  if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() >= 1
                  and v.shape[0] == size]  # fmt: skip


def _unread(forwards: list[Any], values: dict[str, Any]) -> bool:
    """A tensor of the batch too large for :func:`_outlier_rows` to read."""
    return any(v.numel() > OUTLIER_READ for v in _batch_tensors(forwards, values)[1])


def _outlier_rows(forwards: list[Any], values: dict[str, Any]) -> list[int]:
    """The rows of the batch (the forwards' tensors and the captured ones of the batch's size:
    inputs, targets, images pixel by pixel) holding a finite value past ``RAW_UNITS`` that is
    ``OUTLIER_Z`` robust standard deviations from its column's median: a typo, 5e7 among values
    of order one (a bright pixel of an 8-bit image is not: its column's spread is the batch's).
    None when they are more than an eighth of the batch: a column in raw units moves every row,
    not a few. Tensors of more than ``OUTLIER_READ`` elements are not read (:func:`_unread`)."""
    size, tensors = _batch_tensors(forwards, values)
    if size < 4:
        return []
    rows: set[int] = set()
    for value in tensors:
        if value.numel() > OUTLIER_READ:
            continue
        table = value.detach().float().reshape(size, -1).cpu().numpy()
        rows |= {int(r["batch_row"]) for r in typo_rows(table, "batch")}
    return sorted(rows) if len(rows) <= max(1, size // 8) else []


def _holds_extreme(window: list[Any], named: list[Any], failed_at: int | None) -> bool | None:
    """A kept batch of the window holds a finite outlier row, or the probes ``named`` an
    extreme row at one of its updates (None: a batch too large to read, it cannot tell)."""
    steps = {u.step for u in window}
    if any(isinstance(r, dict) and r.get("why") == "extreme"
           and r.get("step", failed_at) in steps for r in named):  # fmt: skip
        return True
    its = [it for u in window for it in u.iterations]
    if any(_outlier_rows(it.forwards, it.values) for it in its):
        return True
    return None if any(_unread(it.forwards, it.values) for it in its) else False


def _outliers_beside_nonfinite(window: list[Any]) -> bool:
    """A batch of the window holds a finite outlier row that holds no NaN/inf (a row the loop
    turned into inf, an ``exp`` of its huge value, is one row: leaving out either is the same)."""
    return any(set(_outlier_rows(it.forwards, it.values))
               - set(_nonfinite_rows(it.forwards, it.values))
               for u in window for it in u.iterations)  # fmt: skip


def _holds_nonfinite(window: list[Any]) -> bool:
    """A batch of the window holds a row with NaN/inf (read in full, here)."""
    return any(_nonfinite_rows(it.forwards, it.values) for u in window for it in u.iterations)


def _nonfinite_rows(forwards: list[Any], values: dict[str, Any]) -> list[int]:
    """Every row of the batch (the forwards' tensors and the captured ones of the batch's size)
    that holds a NaN or an inf."""
    import torch

    size = _batch_size(forwards)
    if size is None:
        return []
    bad = torch.zeros(size, dtype=torch.bool)
    for value in [*(a for args, kw in forwards for a in (*args, *kw.values())),
                  *values.values()]:  # fmt: skip
        if isinstance(value, torch.Tensor) and value.is_floating_point() and (
                value.dim() >= 1 and value.shape[0] == size):  # fmt: skip
            bad |= (~torch.isfinite(value.detach()).reshape(size, -1).all(dim=1)).cpu()
    return [int(i) for i in torch.nonzero(bad).flatten().tolist()]


def _as_float32(value: Any) -> Any:
    """Half and bf16 tensors as float32, inside tuples, lists and dicts."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, tuple):
        return tuple(_as_float32(v) for v in value)
    if isinstance(value, list):
        return [_as_float32(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_float32(v) for k, v in value.items()}
    return value


@contextlib.contextmanager
def _full_precision(torch: Any, on: bool) -> Iterator[None]:
    """While the step runs: autocast does nothing, and ``.half()`` / ``.bfloat16()`` /
    ``.to(torch.float16)`` leave a tensor in float32 (the model is float32 for this rerun)."""
    if not on:
        yield
        return
    tensor = torch.Tensor
    saved = {name: getattr(tensor, name) for name in ("half", "bfloat16", "to")}
    narrow = (torch.float16, torch.bfloat16)
    original_to = saved["to"]

    def keep(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(torch.float32 if a in narrow else a for a in args)
        if kwargs.get("dtype") in narrow:
            kwargs["dtype"] = torch.float32
        return original_to(self, *args, **kwargs)

    enter, leave = torch.autocast.__enter__, torch.autocast.__exit__
    tensor.half, tensor.bfloat16, tensor.to = keep, keep, to
    torch.autocast.__enter__ = lambda self: self  # type: ignore[assignment]
    torch.autocast.__exit__ = lambda self, *exc: False  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(tensor, name, value)
        torch.autocast.__enter__ = enter  # type: ignore[method-assign]
        torch.autocast.__exit__ = leave  # type: ignore[method-assign]


def _trains(losses: list[float], width: int, floor: float | None = None) -> bool:
    """The last pass over the window's batches ends lower than the first pass did, batch for
    batch (by the mean of their logs; of the values where a loss can be negative); or every
    loss of it is positive and below ``floor``."""
    if width < 1 or len(losses) < 2 * width:
        return len(losses) >= 2 and losses[-1] < losses[0]
    first, last = losses[:width], losses[len(losses) - width:]
    if floor is not None and floor > 0 and min(last) >= 0 and max(last) <= floor:
        return True
    if min(first + last) > 0:
        return sum(math.log(b / a) for a, b in zip(first, last)) / width < math.log(NOISE)
    return sum(b - a for a, b in zip(first, last)) < (NOISE - 1) * sum(abs(a) for a in first)


def _json_float(value: float) -> float | str:
    """A float as the diagnosis JSON holds it: non-finite values as their words."""
    return value if math.isfinite(value) else _text(value)


def _text(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _describe(change: str, setup: dict[str, Any], snap: Any, window: list[Any], judged: Any,
              fixed: bool) -> str:  # fmt: skip
    span = f"updates {snap.step}-{window[-1].step}"
    what = {
        "without_nonfinite_rows": "without the rows holding NaN/inf alone (the extreme ones "
                                  "kept)",
        "without_rows": ("without the rows holding NaN/inf (and any extreme ones) "
                         if setup.get("nonfinite") else "without the suspect rows ")
        + ", ".join([*(f"{rows or '(in an earlier micro-batch)'} of update {s}"
                       for s, rows in (setup.get("rows") or {}).items()
                       if rows or not setup.get("table_rows")),
                     *(f"{rows} of {name} (the table the step slices its batches from, "
                       "overwritten by a clean row)"
                       for name, rows in (setup.get("table_rows") or {}).items())]),
        "standardised": f"with input column(s) {setup.get('columns')} standardised",
        "eps": (f"with the {setup.get('op')} op masked where its divisor is exactly 0"
                if setup.get("op") in ("div", "true_divide", "divide")
                else f"with an epsilon at the {setup.get('op')} op"),
        "optimizer_eps": "with the optimizer's eps set to 1e-8",
        "clipped": f"with the gradient norm clipped to {setup.get('clip_to', 1.0):.3g}",
        "standard_init": ("with each weight matrix drawn again at randn / sqrt(fan_in)"
                          if setup.get("bare") else "from the framework's default initialisation")
        + (f" ({setup['initial_scale']['param']}, as initialised, had "
           f"{setup['initial_scale']['ratio']:.3g} times the default's std)"
           if setup.get("initial_scale") else ""),
    }.get(change)
    if change == "float32":
        what = "in float32 (weights, inputs and autocast)"
    if change == "sign_flipped":
        what = "with each applied update turned round (w - step instead of w + step)"
    if what is None and change.startswith("lr_x"):
        what = f"at {change[4:]} times the learning rate"
    verdict = "removes the failure" if fixed else "does not remove the failure"
    return f"{span} rerun {what}: {verdict} ({judged.text()})"


def _without_rows(value: Any, rows: list[int] | None, size: int | None, *,
                  replace: bool = False) -> Any:  # fmt: skip
    """``value`` with batch rows left out (tensors whose first dimension is the batch's), inside
    tuples, lists and dicts; anything else as it is. ``replace``: the rows overwritten by the
    first clean row of the batch instead, so the batch keeps its size."""
    if not rows:
        return value
    import torch

    if isinstance(value, torch.Tensor):
        n = value.shape[0] if value.dim() >= 1 else 0
        if n and (size is None or n == size) and max(rows) < n:
            keep = [i for i in range(n) if i not in set(rows)]
            if not keep:
                return value
            if replace:
                out = value.clone()
                out[torch.tensor(rows, device=value.device)] = value[keep[0]]
                return out
            return value[torch.tensor(keep, device=value.device, dtype=torch.long)]
        return value
    if isinstance(value, tuple):
        return tuple(_without_rows(v, rows, size, replace=replace) for v in value)
    if isinstance(value, list):
        return [_without_rows(v, rows, size, replace=replace) for v in value]
    if isinstance(value, dict):
        return {k: _without_rows(v, rows, size, replace=replace) for k, v in value.items()}
    return value


def _why_not_run(exc: BaseException) -> str:
    if isinstance(exc, _Unfed):
        return f"not run: {exc}"
    return f"not run: the rerun raised {type(exc).__name__}: {str(exc)[:160]}"


def _rows_reached(rows: list[int] | None, forwards: list[Any], namespace: dict[str, Any],
                  iteration: Any, recorded: list[Any], setup: dict[str, Any]) -> None:  # fmt: skip
    """Raise ``_Unfed`` when rows were to be left out and nothing the replay feeds changed: the
    batch the model was fed is made inside the step, out of the replay's reach (unless the
    tables it slices it from were cleaned: :func:`_clean_tables`)."""
    if rows and not setup.get("tables") and not _changed(forwards, recorded) and not _changed(
            [namespace[name] for name in iteration.values], list(iteration.values.values())):
        raise _Unfed("the suspect rows could not be left out: the replay does not hold the "
                     "batch the model was fed (a compiled model's inputs are not seen)"
                     if recorded else "the suspect rows could not be left out: the step makes "
                     "its batch itself (a slice of a tensor made before the loop), out of the "
                     "replay's reach")  # fmt: skip


def _changed(new: Any, old: Any) -> bool:
    """Whether ``_without_rows`` replaced any tensor inside ``old`` (leaves compared by identity,
    the containers it rebuilds looked into)."""
    if isinstance(old, (tuple, list)) and isinstance(new, (tuple, list)) and len(new) == len(old):
        return any(_changed(n, o) for n, o in zip(new, old))
    if isinstance(old, dict) and isinstance(new, dict):
        return any(_changed(new[k], o) for k, o in old.items() if k in new)
    return new is not old


def _width(forwards: list[Any]) -> int | None:
    """The number of columns of the first table (2-D floating tensor) a forward was given."""
    import torch

    for args, _ in forwards:
        a = args[0] if args else None
        if isinstance(a, torch.Tensor) and a.dim() == 2 and a.is_floating_point():
            return int(a.shape[1])
    return None


def _is_table(value: Any, width: int | None) -> bool:
    import torch

    return (width is not None and isinstance(value, torch.Tensor) and value.dim() == 2
            and value.is_floating_point() and int(value.shape[1]) == width)  # fmt: skip


def _standardise(args: tuple[Any, ...], stats: dict[int, tuple[float, float]]) -> tuple[Any, ...]:
    if not args or _features(args[0]) is None:
        return args
    x = args[0].clone()
    for column, (mean, std) in stats.items():
        if column < x.shape[-1]:
            x[..., column] = (x[..., column] - mean) / std
    return (x, *args[1:])


def _features(x: Any) -> Any:
    """``x`` as rows of features, ``(n, features)``, when it is a floating table ``(batch,
    features)`` or sequence batch (features on the last axis, as a linear layer and a recurrent
    one read them), else None (an image's last axis is its width, not a feature)."""
    import torch

    if isinstance(x, torch.Tensor) and x.dim() in (2, 3) and x.is_floating_point():
        return x.reshape(-1, x.shape[-1])
    return None


def _widths(window: list[Any]) -> set[int]:
    """The widths of the tables the window's updates were given (a first layer's fan-in)."""
    widths: set[int] = set()
    for update in window:
        width = _width(update.forwards)
        if width is not None:
            widths.add(width)
    return widths


def _reinitialise_bare(params: list[Any], widths: set[int]) -> None:
    """Weights written by hand, at a standard scale: each matrix drawn again from
    ``randn / sqrt(fan_in)``, its fan-in the dimension that is a width of the batch (a first
    layer), else its first (``x @ W``, as a hand-written layer mostly reads); vectors (biases)
    as they were."""
    import torch

    with torch.no_grad():
        for p in params:
            if p.dim() != 2 or not p.is_floating_point():
                continue
            rows, cols = int(p.shape[0]), int(p.shape[1])
            fan_in = cols if cols in widths and rows not in widths else rows
            p.copy_(torch.randn_like(p) / math.sqrt(max(fan_in, 1)))


def _reinitialise(model: Any) -> None:
    """Every submodule's own ``reset_parameters()``: the framework's default initialisation."""
    if model is None:
        return
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


@contextlib.contextmanager
def _feeding(model: Any, forwards: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> Iterator[None]:
    """Each forward of the replayed update gets the arguments the original one got, in order."""
    from nanscope.torch import _hooks

    queue = list(forwards)

    def feed(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if queue:
            return queue.pop(0)
        return None

    with _hooks.standing_aside(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = model.register_forward_pre_hook(feed, with_kwargs=True, prepend=True) \
            if model is not None and queue else None  # fmt: skip
        try:
            yield
        finally:
            if handle is not None:
                handle.remove()
    if forwards and len(queue) == len(forwards):
        # a compiled model runs its graph, not its hooks: what the replay feeds never arrives,
        # so no change to the batches could be tested (nor the rerun trusted)
        raise _Unfed("the model's forward did not pass through its hooks (a compiled model?): "
                     "the replay cannot feed it the recorded batches")


class _ScriptState:
    """The tensors a hand-written step may change besides the weights: copied before the
    replay (up to ``STATE_COPY_BYTES`` in all) and put back after; ``changed`` says which a
    rerun changed in place (their version counters moved)."""

    def __init__(self, tensors: list[Any]) -> None:
        self.tensors = tensors
        self.versions = [t._version for t in tensors]
        self.copies: list[Any] = []
        budget = STATE_COPY_BYTES
        for t in tensors:
            size = t.numel() * t.element_size()
            self.copies.append(t.detach().clone() if size <= budget else None)
            budget -= size if size <= budget else 0

    def changed(self) -> list[str]:
        return ["x".join(str(d) for d in t.shape) or "a scalar"
                for t, v in zip(self.tensors, self.versions) if t._version != v]

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for t, v, c in zip(self.tensors, self.versions, self.copies):
                if t._version != v and c is not None:
                    t.copy_(c)


def _clip_after(torch: Any, params: list[Any], limit: float | None) -> Callable[[], None] | None:
    """Clipping where a hand-written update has no step to hook: right after each backward."""
    if limit is None:
        return None

    def clip() -> None:
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], limit)

    return clip


@contextlib.contextmanager
def _catching(torch: Any, out: list[Any],
              after: Callable[[], None] | None = None) -> Iterator[None]:  # fmt: skip
    """Keep the tensor each ``backward()`` of the replayed update is called on (the loss);
    ``after``: what runs once each backward is done."""
    original = torch.Tensor.backward
    autograd_backward = torch.autograd.backward
    inside = [False]  # Tensor.backward calls torch.autograd.backward: one loss, counted once

    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.numel() == 1 and not inside[0]:
            out.append(loss_before_scale(self))  # (as the record holds it)
        inside[0] = True
        try:
            result = original(self, *args, **kwargs)
        finally:
            inside[0] = False
        if after is not None:
            after()
        return result

    def autograd_bw(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        counted = isinstance(tensors, torch.Tensor) and tensors.numel() == 1 and not inside[0]
        if counted:
            out.append(loss_before_scale(tensors))
        result = autograd_backward(tensors, *args, **kwargs)
        if counted and after is not None:
            after()
        return result

    torch.Tensor.backward = backward
    torch.autograd.backward = autograd_bw
    try:
        yield
    finally:
        torch.Tensor.backward = original
        torch.autograd.backward = autograd_backward


@contextlib.contextmanager
def _clipping(optimizer: Any, limit: float | None) -> Iterator[None]:
    """Clip the gradient norm to ``limit`` right before each step of the replay (no optimizer:
    a hand-written update, clipped after its backward instead)."""
    if limit is None or optimizer is None:
        yield
        return
    import torch

    def clip(opt: Any, args: Any, kwargs: Any) -> None:
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, limit)

    handle = optimizer.register_step_pre_hook(clip)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _epsilon(torch: Any, op: str | None) -> Iterator[None]:
    """At ops of the producer's family, the guard each needs: a log's input kept at least the
    smallest normal number, a division masked where its divisor is exactly 0, a sqrt's or a
    norm's input kept away from zero."""
    if not op:
        yield
        return
    from torch.overrides import TorchFunctionMode

    is_log = op.startswith(GUARDED_LOGS)
    name = op.split(".")[0]

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:  # fmt: skip
            kwargs = kwargs or {}
            fname = getattr(func, "__name__", "")
            if fname.rstrip("_") == name and args:
                if name in ("div", "true_divide", "divide") and len(args) > 1:
                    return _masked_division(torch, func, list(args), kwargs)
                args = _guarded(torch, fname, is_log, list(args))
            return func(*args, **kwargs)

    with Mode():
        yield


def _masked_division(torch: Any, func: Callable[..., Any], args: list[Any],
                     kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """``a / d`` with the entries whose divisor is exactly 0 set to 0, their gradient 0 too (the
    division's guard a padded or constant entry needs: ``where(d == 0, 0, a / d_safe)``, never
    ``where`` around an inf, whose backward is NaN)."""
    d = args[1]
    if isinstance(d, torch.Tensor) and d.is_floating_point():
        zero = d == 0
        safe = torch.where(zero, torch.ones_like(d), d)
        out = func(args[0], safe, *args[2:], **kwargs)
        return torch.where(zero, torch.zeros_like(out), out)
    if isinstance(d, (int, float)) and not isinstance(d, bool) and d == 0:
        a = args[0]
        return a * 0.0 if isinstance(a, torch.Tensor) else 0.0
    return func(*args, **kwargs)


def _guarded(torch: Any, name: str, is_log: bool, args: list[Any]) -> tuple[Any, ...]:
    tiny = 1.1754943508222875e-38
    if is_log and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
        eps = max(float(torch.finfo(args[0].dtype).tiny), tiny)
        args[0] = args[0].clamp_min(eps)
    elif isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
        eps = float(torch.finfo(args[0].dtype).eps)
        if name in ("sqrt", "rsqrt", "reciprocal"):
            args[0] = args[0].clamp_min(eps) if name != "reciprocal" else torch.where(
                args[0].abs() < eps, torch.full_like(args[0], eps), args[0])
        elif name in ("norm", "vector_norm", "normalize"):
            args[0] = args[0] + eps
    return tuple(args)


def onset_of(losses: list[tuple[int, float]], alarm: dict[str, Any], fail: int) -> int:
    """The first update of the trouble: the jump or climb the alarm names, else the failure."""
    for key in ("jump_from_step", "jump_step"):
        value = alarm.get(key)
        if isinstance(value, int):
            return min(fail, value)
    rises = alarm.get("rises")
    if isinstance(rises, int) and rises > 0:
        return max(1, fail - rises)
    # a climb before a non-finite value: walk back over the rising losses
    seen = [v for s, v in losses if s < fail]
    step = fail
    for value, prev in zip(reversed(seen), list(reversed(seen))[1:]):
        if not (math.isfinite(value) and math.isfinite(prev) and value > prev * 1.5):
            break
        step -= 1
    if seen and math.isfinite(seen[-1]) and seen and seen[0] > 0 and seen[-1] > FAR * seen[0]:
        step = min(step, fail - 1)
    return max(1, step)
