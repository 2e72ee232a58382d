"""When a periodic measure is due, and how long the loss has been climbing: one definition each.

Both captures (numpy's :mod:`nanscope.capture.arrays`, the torch adapter's records, its lean check
and its cross-rank agreement) take some measures only now and then, "every N updates", each with
its own phase: the full measures on the first update of every N, the direction sample on the first
two, a batch check on every N-th. :class:`Every` is that schedule, as cockpit's quantities hold a
``schedule(step) -> bool``: ``Every(n, offset, span)`` is due on the ``span`` updates from
``offset`` in every ``n``.

:class:`Rises` counts the rises of the loss in a row, what the direction sample and the divergence
detectors key on.

A schedule read on a hot path (once per update, right after the backward) may be written out there
as its arithmetic; a test then pins that copy to the schedule defined here
(``tests/core/test_schedule.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Every", "Rises"]


@dataclass(frozen=True, slots=True)
class Every:
    """Due on updates ``offset .. offset + span - 1`` of every ``n`` (counted from any start).

    ``Every(64, 1)(step)`` is ``(step - 1) % 64 == 0``: updates 1, 65, 129... ``Every(16, 1, 2)``
    is due on 1, 2, 17, 18... ``Every(8)`` on 0, 8, 16... A ``span`` of ``n`` or more is always
    due.
    """

    n: int
    offset: int = 0
    span: int = 1

    def __post_init__(self) -> None:
        for name, value, least in (("n", self.n, 1), ("span", self.span, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"Every: {name} must be an integer >= {least}, got {value!r}")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int):
            raise ValueError(f"Every: offset must be an integer, got {self.offset!r}")

    def due(self, step: int) -> bool:
        """Whether update ``step`` is on the schedule (the code calls this: a method call costs
        less than a call of the object)."""
        return (step - self.offset) % self.n < self.span

    def __call__(self, step: int) -> bool:
        return self.due(step)


class Rises:
    """How many times in a row the loss rose, up to the last value seen.

    A value that is not above the one before (equal, lower, NaN), or with no value before it (the
    first, or after ``None``), starts the count again at 0.
    """

    __slots__ = ("count", "last")

    def __init__(self) -> None:
        self.count = 0
        #: the last value seen (None before the first)
        self.last: float | None = None

    def see(self, loss: float | None) -> int:
        """Count ``loss``; returns the rises in a row up to it."""
        prev, self.last = self.last, loss
        self.count = self.count + 1 if loss is not None and prev is not None and loss > prev else 0
        return self.count

    def reset(self) -> None:
        """Forget the values seen: the next one starts a new count."""
        self.count = 0
        self.last = None
