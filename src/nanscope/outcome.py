"""How a fit ended: the one judgement of whether a loss curve went well.

Every place that says a run went well asks this module, so that they cannot disagree: the
engine's end-of-run verdict (``healthy`` is earned here), the live detectors (a loss that leaves
its start by orders of magnitude is stopped), ``sweep``'s ``descended`` and the ledger's "the lr
that worked".

:func:`judge` reads a loss series (one value per update, in order) and says which of these it is:

* ``ok``: every loss finite, and the loss ended (the median of its last updates) not far above
  where it started: at most ``FAR`` times its first loss, and no excursion of orders of magnitude
  on the way. Only this kind may be called healthy, and only when the run was watched.
* ``blown``: finite, but it ended more than ``FAR`` times above where it started, whatever path it
  took (one jump, a slow climb, an oscillation of growing amplitude). Never healthy.
* ``returned``: finite and it ended near its start, but on the way it reached ``EXCURSION`` times
  its start or more and came back down (an explosion the fit survived, a curriculum step, a new
  data shard): at most suspect, never stopped. For a whole fit (``from_init``: its first loss is
  the model at initialisation) also a climb of ``FAR`` times that start which never came back
  below it: a fit that ends above its untrained loss after such a climb did not train.
* ``nonfinite``: a loss was NaN or inf.
* ``empty``: no loss at all: nothing can be said.

Losses that can be negative (a Gaussian NLL, an ELBO) are compared by difference against the
scale of the start: ending ``(FAR - 1)`` times ``|start|`` above it is ``blown``. Everything is a
ratio against the run's own start: a loss of 1e10 that ends at 1e9 is ``ok``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from nanscope._vocabulary import Vocabulary

__all__ = [
    "EXCURSION",
    "FAR",
    "KINDS",
    "UNSCALED_RATIO",
    "Outcome",
    "OutcomeKind",
    "ended_far_above",
    "judge",
]

#: a loss that ends more than this many times above where it started is never healthy: an order
#: of magnitude is far outside what minibatch noise, a harder curriculum step or a GAN's
#: generator reaches, and far inside what a divergence reaches
FAR = 10.0
#: a peak this many times above the start is an explosion even when the loss came back
EXCURSION = 1e3
#: the end of a curve is the median of its last updates: this share of them, at least END_MIN
#: (the last value of a short fit alone is whichever swing of an oscillation it stopped on) and
#: at most END_MAX
END_SHARE = 0.1
END_MIN = 3
END_MAX = 10


class OutcomeKind(Vocabulary):
    """Which of the module's five kinds a loss curve is (see the module's docstring)."""

    OK = "ok"
    BLOWN = "blown"
    RETURNED = "returned"
    NONFINITE = "nonfinite"
    EMPTY = "empty"


KINDS = tuple(k.value for k in OutcomeKind)

#: an input column whose max |x| is this many times the median column's is in raw units: it sets
#: the curvature along its weights, and so the largest step the fit survives
UNSCALED_RATIO = 100.0


@dataclass(frozen=True)
class Outcome:
    """What :func:`judge` found. ``start``/``end``/``peak`` are losses; ``index``: where it broke
    (the first non-finite loss, or the first update that took the loss past ``FAR`` times its
    start for good), else None."""

    kind: OutcomeKind
    start: float = math.nan
    end: float = math.nan
    peak: float = math.nan
    best: float = math.nan
    updates: int = 0
    index: int | None = None

    @property
    def good(self) -> bool:
        """The loss stayed finite and ended not far above where it started."""
        return self.kind == OutcomeKind.OK

    @property
    def end_ratio(self) -> float:
        """How far the end sits above the start (a ratio; by difference for losses <= 0)."""
        return _ratio(self.start, self.end)

    @property
    def peak_ratio(self) -> float:
        return _ratio(self.start, self.peak)

    def text(self) -> str:
        """One clause for people: ``"the loss went from 2472 to 2.6e+14 (1e+11x its start)"``."""
        if self.kind == OutcomeKind.EMPTY:
            return "no loss was recorded"
        if self.kind == OutcomeKind.NONFINITE:
            at = f" at update index {self.index}" if self.index is not None else ""
            return f"the loss became non-finite{at}"
        went = f"the loss went from {self.start:.4g} to {self.end:.4g}"
        if self.kind == OutcomeKind.BLOWN:
            return f"{went}, {_times(self.end_ratio)} its start: it ended far above where it began"
        if self.kind == OutcomeKind.RETURNED:
            return (
                f"{went}, but on the way it reached {self.peak:.4g} ({_times(self.peak_ratio)} "
                "its start) and came back down"
            )
        return went


def _times(ratio: float) -> str:
    return f"{ratio:.3g}x" if math.isfinite(ratio) else "infinitely many times"


def _ratio(start: float, value: float) -> float:
    """``value`` against ``start``: their ratio when both are positive, else ``1 + (value -
    start) / |start|`` (the same number for positive losses, a difference in units of the start
    for losses that can be negative)."""
    if not (math.isfinite(start) and math.isfinite(value)):
        return math.nan
    if start > 0 and value > 0:
        return value / start
    if start == 0:
        return 1.0 if value <= 0 else math.inf
    return 1.0 + (value - start) / abs(start)


def ended_far_above(start: float, value: float, factor: float = FAR) -> bool:
    """``value`` sits more than ``factor`` times above ``start`` (by difference when <= 0)."""
    return _ratio(start, value) > factor  # NaN compares False


def judge(losses: Iterable[float | None], *, from_init: bool = False) -> Outcome:
    """Judge a loss series (``None`` entries, updates without a loss, are skipped).

    ``from_init``: the series is a whole fit from its first update. A window of a fit (a
    replay's) starts at a trained model's minibatch loss, whose noise alone can span ``FAR``."""
    values = [float(v) for v in losses if v is not None]
    if not values:
        return Outcome(OutcomeKind.EMPTY)
    for i, v in enumerate(values):
        if not math.isfinite(v):
            finite = values[:i]
            return Outcome(
                OutcomeKind.NONFINITE,
                start=finite[0] if finite else math.nan,
                end=finite[-1] if finite else math.nan,
                peak=max(finite) if finite else math.nan,
                best=min(finite) if finite else math.nan,
                updates=len(values),
                index=i,
            )
    n = len(values)
    start = values[0]
    k = min(n, max(END_MIN, min(END_MAX, int(n * END_SHARE))))
    tail = sorted(values[-k:])
    end = tail[len(tail) // 2]
    peak, best = max(values), min(values)
    kind = OutcomeKind.OK
    index = None
    if ended_far_above(start, end):
        kind = OutcomeKind.BLOWN
        # the update from which the loss stayed more than FAR times above its start
        index = n - 1
        while index > 0 and ended_far_above(start, values[index - 1]):
            index -= 1
    elif ended_far_above(start, peak, EXCURSION) or (
        from_init and ended_far_above(start, peak) and _ratio(start, end) > 1.0
    ):
        kind = OutcomeKind.RETURNED
        index = values.index(peak)
    return Outcome(kind, start=start, end=end, peak=peak, best=best, updates=n, index=index)
