"""What a replay of the last updates needs, kept while the fit runs: snapshots and batches.

When a detector fires, the cause is decided by rerunning the failing window from a state taken
before the trouble began, once unchanged and once per intervention
(:mod:`nanscope.probes.replay`). That needs, kept here by the :class:`History` of each watcher:

* **snapshots** of the weights, the buffers and the optimizer's state (copies, on the parameters'
  device): the one before update 1 and the latest ``KEEP`` taken every ``every`` updates. A
  snapshot is taken at an update's check, before its step: the state that update's loss was
  computed from. ``every`` starts at ``SNAPSHOT_EVERY`` and grows so that copying takes at most
  ``COST_SHARE`` of the fit's own time (a large model is copied rarely, a small one often); a
  model whose snapshot would exceed ``MAX_SNAPSHOT_BYTES`` is not snapshotted and the diagnosis
  says so instead of replaying.
* **each update's inputs**, by reference: for each loop iteration the update took (several
  under gradient accumulation over loop iterations), the values of the names the training step
  captures (:mod:`nanscope.probes.loopslice`: the loop's variables, a batch drawn by
  ``next(it)``), read when the model's forward is called, and the arguments of every forward
  call (a replayed forward is given exactly these); and the learning rate of each parameter
  group. References only: a batch the loop makes anew each update stays alive until it leaves
  the window (at most ``MAX_KEPT_BYTES`` of them).

The training step is read once, from the frame that called ``optimizer.step()`` at the first
check. Everything here runs inside the watcher's fault guard: a fault turns the history off and
the diagnosis says that no replay could run; training goes on.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from nanscope.probes.loopslice import Plan, plan_for

__all__ = ["COST_SHARE", "KEEP", "MAX_KEPT_BYTES", "MAX_SNAPSHOT_BYTES", "SNAPSHOT_EVERY",
           "History", "Iteration", "Snapshot", "UpdateInputs"]  # fmt: skip

#: the fewest updates between two snapshots
SNAPSHOT_EVERY = 16
#: recent snapshots kept (besides the first): the window reaches this many times ``every`` back
KEEP = 4
#: copying the state may take at most this share of the fit's own time
COST_SHARE = 0.003
#: a state (weights, buffers, optimizer) larger than this is not snapshotted
MAX_SNAPSHOT_BYTES = 512 * 2**20
#: the batches kept by reference for the window may hold at most this many bytes
MAX_KEPT_BYTES = 512 * 2**20


@dataclass
class Snapshot:
    """The state before update ``step``'s step: weights, buffers, optimizer state, CPU RNG."""

    step: int
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    optimizer: dict[str, Any]
    rng: torch.Tensor | None = None
    nbytes: int = 0


#: one forward call's arguments
Forward = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class Iteration:
    """One pass of the loop body within an update: the captured names' values when its first
    forward ran, and the arguments of every forward call it made (several in one iteration: a
    closure evaluated again, two models)."""

    values: dict[str, Any] = field(default_factory=dict)
    forwards: list[Forward] = field(default_factory=list)


@dataclass
class UpdateInputs:
    """What update ``step`` was computed from: the loop iterations it took (several under
    gradient accumulation over loop iterations) and each parameter group's learning rate."""

    step: int
    lrs: list[float]
    iterations: list[Iteration] = field(default_factory=list)
    nbytes: int = 0
    #: the ids of the tensors it holds (the next update's new bytes are read against them)
    ids: frozenset[int] = frozenset()

    @property
    def forwards(self) -> list[Forward]:
        return [f for it in self.iterations for f in it.forwards]


class History:
    """Snapshots and recent update inputs of one watched model and optimizer."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        self.every = SNAPSHOT_EVERY
        self.first: Snapshot | None = None
        self.recent: deque[Snapshot] = deque(maxlen=KEEP)
        self.updates: deque[UpdateInputs] = deque()
        self.plan: Plan | None = None
        self.frame_globals: dict[str, Any] | None = None
        #: the frame's own namespace (a function's locals at the last check; a script's globals)
        self.frame_locals: dict[str, Any] | None = None
        #: why nothing can be replayed (set once; the history then keeps nothing more)
        self.off: str | None = None
        self._iterations: list[Iteration] = []
        #: before the training step is read (the first update): each forward's caller's
        #: namespace, copied
        self._first_scopes: list[dict[str, Any]] = []
        self._kept_bytes = 0
        self._code: Any = None
        self._depth = 0
        self._snap_seconds = 0.0
        self._last_check: float | None = None
        self._update_seconds: float | None = None
        self._since_snapshot = 0

    # ------------------------------------------------------------------ fed by the watcher

    def bind(self, model: Any) -> None:
        self.model = model

    def on_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any], frame_depth: int = 1,
                   scope: dict[str, Any] | None = None) -> None:  # fmt: skip
        """The model's forward was called (references): a new loop iteration when the captured
        names hold other values than at the last forward of this update. ``scope``: the
        caller's namespace copied at a forward made before this history existed."""
        if self.off is not None or len(self._iterations) >= 256:
            return
        plan = self.plan
        values: dict[str, Any] = {}
        if plan is None:
            # the training step is read at the first check: until then each forward keeps a
            # copy of its caller's namespace, to read the captured names from then
            if scope is None:
                frame = self._user_frame(frame_depth + 1)
                scope = dict(frame.f_locals) if frame is not None else {}
            self._first_scopes.append(scope)
            self._iterations.append(Iteration({}, [(args, kwargs)]))
            return
        else:
            frame = self._step_frame(frame_depth + 1)
            if frame is not None:
                scope = frame.f_locals
                for name in plan.captured:
                    if name in scope:
                        values[name] = scope[name]
                if frame.f_globals is not scope:
                    glb = frame.f_globals
                    for name in plan.free:
                        value = scope[name] if name in scope else glb.get(name, _MISSING)
                        if _data(value):
                            values[name] = value
                else:
                    for name in plan.free:
                        value = scope.get(name, _MISSING)
                        if _data(value):
                            values[name] = value
        its = self._iterations
        if its and _same_values(its[-1].values, values, plan.captured):
            its[-1].forwards.append((args, kwargs))
        else:
            its.append(Iteration(values, [(args, kwargs)]))

    def drop_pending(self) -> None:
        """Forget the forwards seen since the last check: a closure step's later evaluations
        (LBFGS's line search) are its own update's, not micro-batches of the next one."""
        self._iterations = []
        if self.plan is None:
            self._first_scopes = []

    def on_check(self, step: int, frame_depth: int, model_site: Any = None) -> None:
        """Update ``step`` is being checked, before its step: keep its inputs, snapshot if due.
        ``frame_depth``: frames from the caller of this method up to the hook's own frame;
        ``model_site``: the user's line that called the model (a ``CallSite``), if known."""
        iterations, self._iterations = self._iterations, []
        if self.off is not None:
            return
        if self.updates and self.updates[-1].step == step:
            # the same update checked again: a later closure evaluation of an LBFGS step that
            # went non-finite, at the step's start put back. Its inputs are the first check's
            return
        now = time.perf_counter()
        if self._last_check is not None:
            spent = now - self._last_check - self._snap_seconds_last()
            self._update_seconds = spent if self._update_seconds is None else (
                0.9 * self._update_seconds + 0.1 * spent)  # fmt: skip
        self._last_check = now
        frame = self._user_frame(frame_depth + 1)
        if self.plan is None:
            by_hand = bool(getattr(self.optimizer, "by_hand", False))
            if not by_hand and not isinstance(self.optimizer, torch.optim.Optimizer):
                self.off = (f"the parameters are updated by {type(self.optimizer).__name__}, "
                            "not a torch.optim optimizer nor by hand")  # fmt: skip
                return
            if _multi_rank():
                self.off = ("the fit runs on several ranks: a replay on one rank would run the "
                            "collectives of a distributed step alone")  # fmt: skip
                return
            self._read_plan(frame, model_site, by_hand)
            if self.off is not None:
                return
            iterations = self._first_iterations(iterations)
        captured = self.plan.captured if self.plan is not None else ()
        if frame is not None:
            self.frame_locals = frame.f_locals
            if not iterations:  # no forward seen (a closure, a model outside the watch)
                scope = frame.f_locals
                iterations = [Iteration({n: scope[n] for n in captured if n in scope})]
        lrs = [_float(g.get("lr")) for g in self.optimizer.param_groups]
        nbytes, ids = _new_bytes(iterations, self.updates[-1].ids if self.updates else None)
        entry = UpdateInputs(step, lrs, iterations, nbytes, ids)
        self.updates.append(entry)
        self._kept_bytes += entry.nbytes
        horizon = self.every * (KEEP + 1) + 2
        while self.updates and (len(self.updates) > horizon
                                or self._kept_bytes > MAX_KEPT_BYTES):  # fmt: skip
            self._kept_bytes -= self.updates.popleft().nbytes
        self._since_snapshot += 1
        if self.first is None or self._since_snapshot >= self.every:
            self._take(step)

    def begin_by_hand(self, before: list[torch.Tensor], rng: torch.Tensor | None,
                      scope: dict[str, Any], inputs: tuple[Any, ...]) -> None:  # fmt: skip
        """A loop that updates by hand is found at its second update, once its first changed the
        weights: update 1's weights (``before``, copied at its backward, with the RNG state
        then), its caller's namespace and its batch become the first snapshot and the first
        kept update, so that a failure at update 2 can be replayed from before update 1."""
        if self.off is not None:
            return
        self.on_forward(inputs, {}, scope=scope)
        self.on_check(1, 1)
        first = self.first
        if first is not None and first.step == 1 and len(first.params) == len(before) and all(
                a.shape == b.shape for a, b in zip(first.params, before)):  # fmt: skip
            first.params, first.rng = list(before), rng
        elif first is not None and first.step == 1:
            self.first = None  # (not the weights of update 1: no snapshot rather than a wrong one)

    def _first_iterations(self, forwards: list[Iteration]) -> list[Iteration]:
        """The first update's iterations, its forwards grouped by the captured names' values
        read from each forward's copied namespace."""
        scopes, self._first_scopes = self._first_scopes, []
        captured = self.plan.captured if self.plan is not None else ()
        free = self.plan.free if self.plan is not None else ()
        out: list[Iteration] = []
        for it, scope in zip(forwards, scopes):
            values = {n: scope[n] for n in captured if n in scope}
            values.update({n: scope[n] for n in free if n in scope and _data(scope[n])})
            if out and _same_values(out[-1].values, values, captured):
                out[-1].forwards.extend(it.forwards)
            else:
                out.append(Iteration(values, list(it.forwards)))
        return out

    def _snap_seconds_last(self) -> float:
        seconds, self._snap_seconds = self._snap_seconds, 0.0
        return seconds

    # ------------------------------------------------------------------ the training step

    def _step_frame(self, depth: int) -> Any:
        """The frame running the training step (the plan's code), up from a forward hook."""
        code = self._code
        frame: Any
        try:
            frame = sys._getframe(depth)
        except ValueError:
            return None
        # (32: a hand-written loop's second update is checked from an autograd engine callback
        # inside the backward, under the first-update watch's mode: 17 frames down)
        for _ in range(32):
            if frame is None:
                return None
            if frame.f_code is code:
                return frame
            frame = frame.f_back
        return None

    def _user_frame(self, depth: int) -> Any:
        """The frame that called ``optimizer.step()``: the first outside torch and nanscope."""
        code = self._code
        if code is not None:
            try:
                frame = sys._getframe(depth + self._depth)
            except ValueError:
                frame = None
            if frame is not None and frame.f_code is code:
                return frame
        from nanscope._frames import is_user_file

        try:
            frame = sys._getframe(depth)
        except ValueError:
            return None
        walked = 0
        while frame is not None and walked < 24:
            filename = frame.f_code.co_filename
            if is_user_file(filename):
                self._code, self._depth = frame.f_code, walked
                return frame
            frame = frame.f_back
            walked += 1
        return None

    def _read_plan(self, frame: Any, model_site: Any, by_hand: bool = False) -> None:
        if frame is None:
            self.off = ("the code that called " + ("backward()" if by_hand else
                        "optimizer.step()") + " was not found on the stack")  # fmt: skip
            return
        code = frame.f_code
        model_line = None
        if model_site is not None and getattr(model_site, "file", None) == code.co_filename and (
                getattr(model_site, "function", None) == code.co_name):  # fmt: skip
            model_line = int(model_site.line)
        # (by hand: the frame is the one that called backward(), at that line)
        self.plan = plan_for(code.co_filename, code.co_name, frame.f_lineno, model_line,
                             by_hand=by_hand)  # fmt: skip
        self.frame_globals = frame.f_globals
        if not self.plan.ok:
            self.off = self.plan.reason or "the training step could not be read"

    # ------------------------------------------------------------------ snapshots

    def _take(self, step: int) -> None:
        start = time.perf_counter()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        model = self.model
        buffers = list(model.buffers()) if model is not None else []
        size = sum(t.numel() * t.element_size() for t in (*params, *buffers))
        state = self.optimizer.state_dict()
        size += sum(t.numel() * t.element_size() for t in _tensors(state.get("state", {})))
        if size > MAX_SNAPSHOT_BYTES:
            self.off = (f"the model and optimizer state ({size / 2**20:.0f} MiB) are larger than "
                        f"a snapshot may be ({MAX_SNAPSHOT_BYTES / 2**20:.0f} MiB)")  # fmt: skip
            self.first = None
            self.recent.clear()
            self.updates.clear()
            return
        with torch.no_grad():
            snap = Snapshot(
                step,
                [p.detach().clone() for p in params],
                [b.detach().clone() for b in buffers],
                copy.deepcopy(state),
                torch.get_rng_state(),
                size,
            )
        if self.first is None:
            self.first = snap
        else:
            self.recent.append(snap)
        self._since_snapshot = 0
        seconds = time.perf_counter() - start
        self._snap_seconds = seconds
        if self._update_seconds:
            # copying takes at most COST_SHARE of the fit's time
            self.every = max(SNAPSHOT_EVERY, min(4096, math.ceil(
                seconds / (COST_SHARE * self._update_seconds))))  # fmt: skip

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot kept, oldest first."""
        out = [self.first] if self.first is not None else []
        out.extend(self.recent)
        return out

    def inputs(self, first: int, last: int) -> list[UpdateInputs] | None:
        """The kept inputs of updates ``first`` to ``last``, or None when any is missing or
        incomplete: under ``nanscope run`` the watcher is made at the first step, so the first
        update's earlier micro-batches (accumulation over loop iterations) were not seen; it
        took fewer iterations than the next update then."""
        found = {u.step: u for u in self.updates}
        out = [found.get(s) for s in range(first, last + 1)]
        if any(u is None for u in out):
            return None
        head, after = found.get(first), found.get(first + 1)
        if head is not None and after is not None and len(head.iterations) < len(
                after.iterations) and first == min(found):  # fmt: skip
            return None
        return out  # type: ignore[return-value]

    def memory(self) -> int:
        """Bytes held by snapshots and kept batches (the batches: those made for the window)."""
        return sum(s.nbytes for s in self.snapshots()) + self._kept_bytes


def _multi_rank() -> bool:
    dist = getattr(torch, "distributed", None)
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized()
                    and dist.get_world_size() > 1)  # fmt: skip
    except (RuntimeError, ValueError):
        return False


def _float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().cpu())
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _tensors(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    if depth > 4:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v, depth + 1)]
    return []


_MISSING = object()


def _data(value: Any) -> bool:
    """A value an iteration reads that may change between iterations: a tensor, an array, a
    number (not a module, a function or an optimizer, which the replay reads as they are)."""
    return isinstance(value, (torch.Tensor, int, float)) or type(value).__name__ == "ndarray"


def _same_values(a: dict[str, Any], b: dict[str, Any], captured: tuple[str, ...] = ()) -> bool:
    """The same loop variables (the captured names) hold the same objects: the same iteration."""
    keys = [k for k in captured if k in a or k in b] if captured else list(a.keys() | b.keys())
    return all(a.get(k, _MISSING) is b.get(k, _MISSING) for k in keys)


def _parts(iterations: list[Iteration]) -> list[Any]:
    return [[it.forwards, list(it.values.values())] for it in iterations]


def _new_bytes(iterations: list[Iteration],
               before: frozenset[int] | None) -> tuple[int, frozenset[int]]:  # fmt: skip
    """The bytes of this update's tensors that the previous update (``before``: its tensors'
    ids) did not hold already (a full batch reused every update costs nothing more), and this
    update's tensors' ids."""
    seen = before or frozenset()
    mine: set[int] = set()
    total = 0
    for t in _tensors(_parts(iterations)):
        key = id(t)
        if key not in mine and key not in seen:
            total += t.numel() * t.element_size()
        mine.add(key)
    return total, frozenset(mine)
