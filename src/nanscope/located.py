"""The ``located`` evidence: where the first non-finite value of a failing update was made.

The probes build it (PyTorch: the first-update watch and the loss graph in
``nanscope.probes.producer``, the replay in ``nanscope.probes.locate``, the loop's
re-evaluation in ``nanscope.probes.loop``; numpy: ``nanscope.probes.fperrors``), the rules read
it (``nanscope.diagnose.rules._producer``), and the diagnosis writes it to its JSON as the dict
the probe built (``Diagnosis.located``; a key with no value is left out). :class:`Located` is
its key table and its typed reading.

=====================  ==========================================================================
key                    meaning
=====================  ==========================================================================
``phase``              where in the update: ``preprocess`` (the training loop's own code),
                       ``forward``, ``loss``, ``backward`` or ``optimizer``
``op``                 the op that made the value: a forward op (``log``, ``div``), an autograd
                       node (``SqrtBackward0``) or a numpy ufunc
``module``             the module running it (its name in the model), ``loss`` for the loss
``source``             the user's line: ``{"file", "line", "function", "code", "call", "guessed"}``
                       (``call``: the line that called the model or the loss module; ``guessed``:
                       found by scanning the ``backward()`` function for the op's spelling)
``dtype``              the dtype the op computed in
``output``             what it made: ``nan`` or ``inf``
``observed``           an op check saw it (true), or it was inferred (false)
``how``                how it was found, in words
``step``               the update it was found in
``update``             1: seen live by the first-update watch
``detected``           what the detector saw non-finite: ``loss``, ``grad``, ``weight`` ...
``why``                the input values that made it: ``{"kind": "zero_denominator" |
                       "log_domain" | "past_range" | "nonfinite_input" | "domain" | "other",
                       "text", ...}``
``inputs``             the same in a few words: ``exactly zero``, ``past the half range``,
                       ``huge (...)``, ``non-finite``, ``finite (...)``
``input_zero``         an input was exactly zero
``input_absmax``       the largest finite input magnitude
``input_values``       a summary of each input: ``{"dtype", "shape", "absmax", "min", "zeros",
                       "numel", "nonfinite", "nan"}``
``recomputed``         the op run again wider: ``{"float32": {"finite", "absmax"}, ...}``
``precision``          a measured overflow of float16 / bfloat16: finite wider and past the narrow
                       dtype's limit (``{"dtype", "limit", "value", "in", "text"}``)
``forward_op``         the forward op of a backward producer
``backward_op``        the autograd node of a forward or loss producer read off the graph
``backward_source``    the user's ``backward()`` line of a backward producer
``grad_in``            summaries of the gradient a backward producer received
``saved``              summaries of the tensors a backward producer saved
``chain``              the ops that carried the value on after it: ``[{"op", ...}]``
``loss_scale``         a constant the loss was multiplied by before ``backward()``
``replay``             what the replay found when another way of finding won:
                       ``{"phase", "op", "module", "note", "how"}``
``note``               why the op is missing or uncertain, in words
``found``              false: no producer was found
``guessed``            the op is a guess (the graph was freed)
``producer_rows``      the batch rows whose values made the op's non-finite output
``gradient_at_output`` how the backward replay was seeded at the model's output, in words
``custom_function``    the op is a custom ``torch.autograd.Function``'s backward
``autocast``           the autocast dtype the update ran under
``from``               ``live graph``: read off the loss's graph before ``backward()`` freed it
``message``            numpy's floating-point error message (``divide by zero encountered ...``)
``also``               numpy: the other ops of the update that made a non-finite value
=====================  ==========================================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KEYS", "Located", "unknown_keys"]


@dataclass(frozen=True)
class Located:
    """One ``located`` dict, typed: a field per key of the table above (``from`` is ``from_``).

    ``Located.read(d)`` reads a dict a probe built, whatever its keys' order; a value of the
    wrong type reads as absent, so a rule never fails on it.
    """

    phase: str | None = None
    op: str | None = None
    module: str | None = None
    source: dict[str, Any] | None = None
    dtype: str | None = None
    output: str | None = None
    observed: bool | None = None
    how: str | None = None
    step: int | None = None
    update: int | None = None
    detected: str | None = None
    why: dict[str, Any] | None = None
    inputs: str | None = None
    input_zero: bool | None = None
    input_absmax: float | None = None
    input_values: list[dict[str, Any]] | None = None
    recomputed: dict[str, Any] | None = None
    precision: dict[str, Any] | None = None
    forward_op: str | None = None
    backward_op: str | None = None
    backward_source: dict[str, Any] | None = None
    grad_in: list[dict[str, Any]] | None = None
    saved: dict[str, Any] | None = None
    chain: list[dict[str, Any]] | None = None
    loss_scale: float | None = None
    replay: dict[str, Any] | None = None
    note: str | None = None
    found: bool | None = None
    guessed: bool | None = None
    producer_rows: list[int] | None = None
    gradient_at_output: str | None = None
    custom_function: bool | None = None
    autocast: str | None = None
    from_: str | None = field(default=None, metadata={"key": "from"})
    message: str | None = None
    also: list[dict[str, Any]] | None = None

    @classmethod
    def read(cls, data: Mapping[str, Any] | None) -> Located:
        """The typed view of a ``located`` dict (``None`` or ``{}``: every field absent)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = (data or {}).get(f.metadata.get("key", f.name))
            if value is not None and _fits(value, _TYPES[f.name]):
                values[f.name] = value
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The dict of the set fields, in the table's order (a probe's own dict keeps its own
        order in the JSON: this is for building one from scratch)."""
        return {f.metadata.get("key", f.name): getattr(self, f.name)
                for f in dataclasses.fields(self) if getattr(self, f.name) is not None}  # fmt: skip


def _python_type(annotation: str) -> tuple[type, ...]:
    """The runtime types a field's annotation (a string: ``"str | None"``) allows."""
    base = annotation.split("|")[0].strip().split("[")[0]
    return {"str": (str,), "bool": (bool,), "int": (int,), "float": (int, float),
            "dict": (dict,), "list": (list,)}[base]  # fmt: skip


_TYPES = {f.name: _python_type(str(f.type)) for f in dataclasses.fields(Located)}


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # a bool is an int to Python, not to the table
    return isinstance(value, types)


#: every key a ``located`` dict may hold, in the table's order
KEYS = tuple(f.metadata.get("key", f.name) for f in dataclasses.fields(Located))


def unknown_keys(data: Mapping[str, Any]) -> set[str]:
    """The keys of ``data`` that are not in the table (a probe that writes one documents it)."""
    return set(data) - set(KEYS)
