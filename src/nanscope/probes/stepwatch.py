"""The producer seen in the replay's control: the op of the training step that made the first
non-finite value, wherever in the step it stands.

The localisation replay (:mod:`nanscope.probes.locate`) reruns the model's forward and the loss
it can rebuild; an op outside both (a loss written out in the loop, ``torch.log(torch.softmax(
out))``, or a fit on bare tensors with no model at all) is out of its reach. The decisive
experiment's control (:mod:`nanscope.probes.replay`) reruns the user's whole step from a
snapshot and reproduces the failure: watched op by op while it runs, it shows the first op whose
output needs a gradient and is non-finite while every floating input is finite. That op, its
input values and the user's line it ran at are observed, not inferred (``how`` says so), and
they let the replay try the epsilon at that op.

Ops on tensors that need no gradient are not the producer here: the hand-written update under
``no_grad`` (a weight that overflowed is the step's, read elsewhere), and the data made in the
step (the loop's own preparation is located by :mod:`nanscope.probes.loop`).
"""

from __future__ import annotations

import traceback
from typing import Any

from nanscope.numerics import op_name
from nanscope.probes._measure import made_by, why_nonfinite
from nanscope.probes._source import stack_source
from nanscope.probes._tensors import all_finite, float_tensors, nonfinite_scalar, summary

__all__ = ["StepWatch"]


class StepWatch:
    """Fed every op of a rerun (``op_watch(watch.note)``); ``found`` is the producer's
    ``located`` dict, or None."""

    def __init__(self) -> None:
        self.found: dict[str, Any] | None = None
        #: a tensor the step read that needs no gradient and was not made by an op of the step
        #: (data made before it) held NaN/inf: the failure came in with the data, which no
        #: rerun of the step changes
        self.data_nonfinite = False
        #: the ids of the non-finite tensors the step's own ops made (a division of the batch
        #: by a zero std in the step is the step's producer, not data that came in)
        self._made: set[int] = set()

    def note(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        if self.found is not None:
            return
        outs = float_tensors(out)
        if not outs or all_finite(outs):
            return
        ins = float_tensors(args) + float_tensors(kwargs)
        if not self.data_nonfinite:
            # (a NaN row of X that this batch's slice left out does not count: only data whose
            # NaN/inf went into a non-finite result)
            data = [t for t in ins if t.grad_fn is None and not t.requires_grad
                    and id(t) not in self._made]  # fmt: skip
            self.data_nonfinite = bool(data) and not all_finite(data)
        if len(self._made) < 4096:
            self._made.update(id(t) for t in outs)
        if not any(t.requires_grad for t in outs):
            return
        if not all_finite(ins) or nonfinite_scalar(args, kwargs or {}):
            return  # it carried a value made before it
        op = op_name(func)
        values = [summary(t) for t in ins[:4]]
        made = summary(outs[0])
        why = why_nonfinite(op, values, made["dtype"]) if values else {
            "kind": "other", "text": "it was given no floating tensor"}  # fmt: skip
        found: dict[str, Any] = {
            "phase": "loss", "op": op, "module": "loss", "dtype": made["dtype"],
            "output": "nan" if made.get("nan") else "inf", "observed": True,
            "input_values": values, **made_by(why, values),
            "how": "the replay's control rerun of the whole training step, op by op",
        }  # fmt: skip
        # (this frame and the op watch's own are below the op's caller)
        source = stack_source(traceback.extract_stack()[:-2])
        if source:
            found["source"] = source
        self.found = found
