"""``optimizer.step(closure)`` (LBFGS, Lightning): the update is checked inside the closure.

The watcher's step pre-hook wraps the closure (:meth:`ClosureSteps.wrap`): its first evaluation
is the update's check, right after the closure's backward and before the optimizer uses the
gradient. LBFGS evaluates the closure again, up to 20 times per step, changing the weights in
between: the later evaluations' losses are kept (the record's ``extra["closure_losses"]``), and a
non-finite one puts back the weights of the step's start and stops there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from nanscope._guard import FaultGuard
from nanscope.monitor import Monitor
from nanscope.probes import producer as _producer
from nanscope.torch.window import StepWindow

__all__ = ["ClosureSteps"]


class ClosureSteps:
    """The closure evaluations of one optimizer's current step (see the module docstring)."""

    def __init__(self, guard: FaultGuard, window: StepWindow) -> None:
        self.guard = guard
        self.window = window
        #: closure calls running now (an evaluation's backward is not a new update's)
        self.depth = 0
        self._checked = False
        self._losses: list[float] = []
        self._start: list[torch.Tensor] | None = None  # LBFGS: the weights at the step's start

    def wrap(
        self,
        closure: Callable[[], Any],
        params: list[torch.Tensor],
        *,
        check: Callable[[Any], None],
        recheck: Callable[[torch.Tensor], None],
        keeps_start: bool,
    ) -> Callable[[], Any]:
        """``closure``, checked: ``check(loss)`` at the first evaluation, ``recheck(loss)`` at
        the later ones; ``keeps_start``: the optimizer changes the weights between evaluations
        (LBFGS), so this step's start is kept to be put back."""
        self._checked = False
        self._losses = []
        self.window.restart_losses()  # this update's loss is its first closure evaluation
        if keeps_start:
            self._start = [p.detach().clone() for p in params]

        def checked_closure() -> Any:
            if self._checked:
                # the first update's loss and gradient were watched at the first evaluation, and
                # the optimizer's arithmetic up to this one: watching 20 more forwards and
                # backwards would only keep their per-op bookkeeping alive
                _producer.FIRST_UPDATE_WATCH.stop()
            self.depth += 1
            try:
                out = closure()
            finally:
                self.depth -= 1
            if not self._checked:
                self._checked = True
                self.guard.run("step", check, out)
            elif isinstance(out, torch.Tensor) and out.numel() == 1:
                self._losses.append(float(out.detach()))
                self.guard.run("step", recheck, out)
                self.window.drop_graph()  # a finite evaluation: its graph is not needed any more
            return out

        return checked_closure

    def restore_start(self, params: list[torch.Tensor], loss: torch.Tensor) -> bool:
        """A later evaluation's ``loss``: when it is not finite, the weights of the step's start
        are put back and True says the update is to be checked again with it."""
        if math.isfinite(float(loss.detach())):
            return False
        if self._start is not None:
            with torch.no_grad():
                for p, saved in zip(params, self._start):
                    p.copy_(saved)
        self.window.restart_losses(loss)
        return True

    def step_done(self, monitor: Monitor, step: int, history: Any) -> None:
        """The optimizer's step ended: every evaluation's loss goes on update ``step``'s record,
        the first one first; the later evaluations' forwards are dropped from ``history`` (they
        are this update's, not micro-batches of the next)."""
        self._start = None
        if not self._losses:
            return
        history.drop_pending()
        records = monitor.trace.records
        if records and records[-1].get("step") == step:
            first = records[-1].get("loss")
            losses = [first, *self._losses]
            records[-1].setdefault("extra", {})["closure_losses"] = losses
            # on disk too: the record was written at the first evaluation (trace.read_trace puts
            # this line back on it)
            monitor.write({"event": "closure_losses", "step": step, "losses": losses})
        self._losses = []
        self.window.restart_losses()  # the later evaluations' losses are not the next update's

    @property
    def pending(self) -> bool:
        """Later evaluations' losses wait for the end of the step."""
        return bool(self._losses)
