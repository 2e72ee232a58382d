"""The decisive experiment: rerun the first updates of a fit at several learning rates.

The outcome of one learning rate is decided from its loss curve alone, with scale-free tests (the
loss may be 1e-6 or 1e9):

* ``nonfinite``  the loss went NaN/inf with no growth phase before it (``at_update``: the first).
* ``diverged``   sustained geometric growth: ``RISES`` consecutive rising updates whose increments
  do not shrink, by a total factor of at least ``GROWTH`` over the first of them and over the
  largest of the ``RECENT`` losses before them, ending above where the run started (or, for
  losses that can be negative, a last increment ``GROWTH`` times the first); or the loss leaving
  its range and staying out, as the live runs' departure detector sees it (an adaptive
  optimizer's jump and plateau); or a non-finite loss right after a rise.
  ``at_update`` is the update where the growth was confirmed (or where a Monitor's divergence
  alarm fired, if earlier).
* ``descended``  finite throughout, no sustained growth, and the median of the last quarter of the
  curve is at least ``FLAT`` (1 %) below the median of the first quarter, with three quarters of
  the last quarter below that first median: it *descends steadily*, beyond its noise; and the
  curve is good by :func:`nanscope.outcome.judge` (it ended not far above where it started, with
  no excursion of orders of magnitude on the way), the same judgement as a healthy verdict, and it
  ended below its first loss. A curve that ended far above its start is ``diverged`` whatever its
  quarters say.
* ``ascended``   the same medians, the other way round: a steady rise (a sign error at small steps).
* ``flat``       neither.
* ``error``      the fit raised an exception (not a non-finite failure) before it could be judged.

The recommendation is the largest learning rate whose outcome is ``descended``.
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from nanscope._json import jsonable
from nanscope.errors import DivergenceError, UsageError
from nanscope.formatting import lr as format_lr
from nanscope.monitor import Monitor
from nanscope.outcome import judge

__all__ = [
    "OUTCOMES",
    "FactorResult",
    "SweepResult",
    "classify",
    "sweep",
]

OUTCOMES = ("descended", "diverged", "nonfinite", "ascended", "flat", "error")

#: consecutive rising updates that make sustained growth
RISES = 4
#: total growth factor over those updates
GROWTH = 2.0
#: updates before the rises whose largest loss the growth must also clear by ``GROWTH``
RECENT = 16
#: relative change between first- and last-quarter medians below which a curve is flat
FLAT = 0.01


class StopSweep(BaseException):
    """Raised after the last update a sweep wants, in process and in a script's child process; a
    BaseException so that a fit's own ``except Exception`` does not swallow it."""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _growth_confirmed(points: Sequence[tuple[int, float]]) -> int | None:
    """First update at which ``RISES`` consecutive rises with non-shrinking increments grew the loss
    by ``GROWTH``; ``None`` when the curve never does."""
    for end in range(RISES, len(points)):
        window = [v for _, v in points[end - RISES : end + 1]]
        deltas = [b - a for a, b in itertools.pairwise(window)]
        if not all(d > 0 for d in deltas) or deltas[-1] < deltas[0]:
            continue
        if window[0] > 0:
            # and above the run's own recent range: four rises in a row happen by chance in a
            # noisy minibatch loss, from a low point back to where it was
            recent = [v for _, v in points[max(0, end - RISES - RECENT) : end - RISES]]
            start = median([v for _, v in points[:RISES + 1]])
            # ... and above where the run started: at a noise floor a heavy-tailed loss doubles
            # and doubles again without anything diverging
            # two updates past it, not one: a heavy-tailed batch loss spikes once
            grown = window[-2] / max([window[0], *recent]) >= GROWTH and window[-2] > start
        else:
            grown = deltas[-1] / deltas[0] >= GROWTH
        if grown:
            return points[end][0]
    return None


def _departed(points: Sequence[tuple[int, float]]) -> int | None:
    """The update at which the live runs' departure detector would have stopped this curve."""
    from nanscope.detectors import Departure

    detector = Departure()
    for update, value in points:
        alarm = detector.step({"step": update, "loss": value})
        if alarm is not None:
            return alarm.step
    return None


def _trend(values: Sequence[float]) -> str:
    if len(values) < 2:
        return "flat"
    quarter = max(1, len(values) // 4)
    first = median(values[:quarter])
    last = median(values[-quarter:])
    scale = max(abs(first), abs(last))
    if scale == 0 or abs(last - first) <= FLAT * scale:
        return "flat"
    # beyond the noise: most of the last quarter on the far side of the first quarter's median
    # (a minibatch loss bouncing in one range moves its medians either way by chance)
    tail = sorted(values[-quarter:])
    upper, lower = tail[(3 * len(tail)) // 4], tail[len(tail) // 4]
    if last < first:
        return "descended" if upper < first or len(tail) < 4 else "flat"
    return "ascended" if lower > first or len(tail) < 4 else "flat"


def classify(
    losses: Sequence[float | None],
    *,
    alarm_step: int | None = None,
    alarm_kind: str | None = None,
) -> tuple[str, int | None]:
    """``(outcome, at_update)`` for a loss curve (``losses[0]`` is update 1; ``None`` = not seen).

    ``alarm_kind``/``alarm_step``: what a Monitor's detectors said, when the fit had one.
    """
    points = [(i + 1, float(v)) for i, v in enumerate(losses) if v is not None]
    first_bad = next((u for u, v in points if not math.isfinite(v)), None)
    finite = [(u, v) for u, v in points if first_bad is None or u < first_bad]
    grew = _growth_confirmed(finite)
    departed = _departed(finite)
    if departed is not None:
        grew = departed if grew is None else min(grew, departed)
    if alarm_kind == "diverging" and alarm_step is not None:
        grew = alarm_step if grew is None else min(grew, alarm_step)
    if first_bad is not None:
        values = [v for _, v in finite]
        rose = len(values) >= 2 and values[-1] > values[-2] and values[-1] > values[0]
        if grew is not None:
            return "diverged", grew
        if rose:
            return "diverged", first_bad
        return "nonfinite", first_bad
    if grew is not None:
        return "diverged", grew
    if not points:
        return "flat", None
    ended = judge(v for _, v in points)
    if ended.kind == "blown":
        # whatever path it took (one jump, then a slow fall): it ended far above where it began
        return "diverged", points[ended.index or 0][0]
    trend = _trend([v for _, v in points])
    if trend == "descended" and (not ended.good or ended.end >= ended.start):
        # it came back down from an explosion, or ended above where it began: whatever its
        # quarters say, not a step size that worked
        return "flat", None
    return trend, None


def _fmt(value: float) -> str:
    return format_lr(value)


@dataclass
class FactorResult:
    """What one learning rate (one factor of the script's own lr) did over the first updates."""

    factor: float
    lr: float | None
    outcome: str
    at_update: int | None = None
    updates: int = 0
    requested: int = 0
    losses: list[float | None] = field(default_factory=list)
    error: str | None = None
    note: str | None = None
    duration: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when the fit made every update the sweep asked for."""
        return self.updates >= self.requested

    @property
    def final_loss(self) -> float | None:
        seen = [v for v in self.losses if v is not None]
        return seen[-1] if seen else None

    @property
    def best_loss(self) -> float | None:
        seen = [v for v in self.losses if v is not None and math.isfinite(v)]
        return min(seen) if seen else None

    @property
    def ascends(self) -> bool:
        return self.outcome in ("ascended", "diverged")

    def label(self, with_lr: bool) -> str:
        if with_lr and self.lr is not None:
            return _fmt(self.lr)
        return f"×{_fmt(self.factor)}"

    def phrase(self) -> str:
        """``"diverged at update 7"``, ``"descended"``, ... (no subject)."""
        if self.outcome == "diverged":
            text = f"diverged at update {self.at_update}" if self.at_update else "diverged"
        elif self.outcome == "nonfinite":
            text = f"went non-finite at update {self.at_update}"
        elif self.outcome == "flat":
            text = "stayed flat"
        elif self.outcome == "error":
            text = f"failed ({self.error})" if self.error else "failed"
        else:
            text = self.outcome
        if not self.complete and self.outcome not in ("diverged", "nonfinite", "error"):
            text += f" (the fit ended after {self.updates} of {self.requested} updates)"
        return text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "factor": self.factor,
            "lr": self.lr,
            "outcome": self.outcome,
            "at_update": self.at_update,
            "updates": self.updates,
            "requested": self.requested,
            "complete": self.complete,
            "final_loss": self.final_loss,
            "best_loss": self.best_loss,
            "losses": list(self.losses),
            "error": self.error,
            "note": self.note,
            "duration": round(self.duration, 3),
        }
        out.update(self.extra)
        return jsonable(out)


@dataclass
class SweepResult:
    """Every learning rate's result, and the one to use."""

    results: list[FactorResult]
    updates: int
    base_lr: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def factors(self) -> list[float]:
        return [r.factor for r in self.results]

    @property
    def recommended(self) -> FactorResult | None:
        """The largest learning rate that descended steadily, or ``None``."""
        good = [r for r in self.results if r.outcome == "descended"]
        return max(good, key=lambda r: r.factor) if good else None

    @property
    def recommended_factor(self) -> float | None:
        best = self.recommended
        return best.factor if best is not None else None

    @property
    def recommended_lr(self) -> float | None:
        best = self.recommended
        return best.lr if best is not None else None

    @property
    def every_factor_ascends(self) -> bool:
        """True when no learning rate descends and every one rises: the update sign is wrong."""
        return bool(self.results) and all(r.ascends for r in self.results)

    def result_for(self, factor: float) -> FactorResult:
        for r in self.results:
            if math.isclose(r.factor, factor, rel_tol=1e-9):
                return r
        raise KeyError(factor)

    def text(self) -> str:
        """One line: ``"lr 1.0 diverged at update 7; 0.1 descended; use 0.1"``."""
        with_lr = all(r.lr is not None for r in self.results)
        ordered = sorted(self.results, key=lambda r: -r.factor)
        parts = []
        for i, r in enumerate(ordered):
            subject = r.label(with_lr)
            parts.append(f"{'lr ' if i == 0 else ''}{subject} {r.phrase()}")
        best = self.recommended
        if best is not None:
            parts.append(f"use {best.label(with_lr)}" if with_lr else f"use lr {best.label(False)}")
        elif self.every_factor_ascends:
            parts.append("every step size ascends: check the sign of the update")
        else:
            parts.append("no step size descended: try smaller ones, or look beyond the step size")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": "nanscope.sweep/1",
            "updates": self.updates,
            "factors": self.factors,
            "base_lr": self.base_lr,
            "results": [r.to_dict() for r in self.results],
            "recommended_factor": self.recommended_factor,
            "recommended_lr": self.recommended_lr,
            "every_factor_ascends": self.every_factor_ascends,
            "text": self.text(),
        }
        out.update(self.extra)
        return jsonable(out)


# ---------------------------------------------------------------------- the in-process API


class _SweepMonitor(Monitor):
    """A Monitor that ends the fit (by raising :class:`StopSweep`) after ``limit`` updates or at
    the first non-finite loss, and keeps the loss of every update."""

    def __init__(self, limit: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limit = limit
        self.losses: list[float | None] = []

    def observe(self, record: Mapping[str, Any], *, batch: Any = None) -> dict[str, Any]:
        loss = record.get("loss")
        value = float(loss) if isinstance(loss, (int, float)) else None
        try:
            return super().observe(record, batch=batch)
        finally:
            self.losses.append(value)
            if len(self.losses) >= self.limit or (value is not None and not math.isfinite(value)):
                raise StopSweep


def check_positive(values: Iterable[Any], what: str) -> list[float]:
    """``values`` as distinct positive finite floats, in order; a :class:`UsageError` naming
    ``what`` otherwise (the learning rates of a sweep, the factors of a script's sweep)."""
    out: list[float] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{what} must be positive numbers; got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{what} must be positive numbers; got {value!r}")
        if float(value) not in out:
            out.append(float(value))
    if not out:
        raise UsageError(f"{what} is empty: give at least one")
    return out


def check_updates(updates: Any) -> int:
    if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
        raise UsageError(f"updates must be a whole number of at least 1; got {updates!r}")
    return updates


def sweep(
    fit: Callable[[float, Monitor], Any],
    lrs: Sequence[float] = (1.0, 0.1, 0.01),
    updates: int = 50,
) -> SweepResult:
    """Run ``fit(lr, monitor)`` for each learning rate, for at most ``updates`` updates each.

    ``fit`` runs the fit from the same starting point every call and reports every update with
    ``monitor.update(loss, ...)``; the sweep ends it after ``updates`` updates (or at the first
    non-finite loss) by raising a private exception from ``monitor.update``, so the fit needs no
    update count of its own. Each call gets a fresh in-memory Monitor with policy ``"warn"``.
    Returns a :class:`SweepResult`; ``.recommended_lr`` is the largest lr that descended steadily.
    """
    if not callable(fit):
        raise UsageError(f"fit must be a callable fit(lr, monitor); got {type(fit).__name__}")
    lr_list = check_positive(lrs, "lrs")
    check_updates(updates)
    base = max(lr_list)
    results: list[FactorResult] = []
    for lr in lr_list:
        monitor = _SweepMonitor(updates, write=False, policy="warn", name=f"sweep lr={lr:g}")
        error: str | None = None
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                fit(lr, monitor)
            except StopSweep:
                pass
            except DivergenceError:
                pass  # the fit's own Monitor stopped it; the curve says the rest
            except ArithmeticError as exc:  # np.seterr(all="raise"), overflow in pure Python
                if not monitor.losses:
                    error = f"{type(exc).__name__}: {exc}"
                else:
                    monitor.losses.append(math.nan)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        alarm = monitor.alarm
        outcome, at = classify(
            monitor.losses,
            alarm_step=alarm.step if alarm else None,
            alarm_kind=alarm.kind if alarm else None,
        )
        if error is not None and outcome not in ("diverged", "nonfinite"):
            outcome, at = "error", None
        results.append(
            FactorResult(
                factor=lr / base,
                lr=lr,
                outcome=outcome,
                at_update=at,
                updates=len(monitor.losses),
                requested=updates,
                losses=monitor.losses,
                error=error,
                duration=time.perf_counter() - started,
            )
        )
    if all(r.updates == 0 and r.error is None for r in results):
        raise UsageError(
            "fit(lr, monitor) never called monitor.update(loss, ...): report every update to the "
            "monitor it is given"
        )
    return SweepResult(results=results, updates=updates, base_lr=base)
