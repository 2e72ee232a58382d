"""Detectors: cheap checks run on every update that decide *when* to stop, nothing more.

Each detector is a small object with ``step(record) -> Alarm | None``; it keeps a few floats of
state and never looks at arrays. Thresholds are scale-free: ratios between successive updates,
counts of consecutive updates, deviations measured against the run's own history. A loss of 1e10
that falls is fine; a gradient norm of 400 can be normal.

* :class:`NonFinite` fires at the first non-finite loss, gradient or weight.
* :class:`Divergence` fires on the divergence fingerprint: ``RISES`` (4) consecutive rising
  updates whose increments grow, or ``SLOW_RISES`` (12) rising by a steady factor, by a total of
  at least ``GROWTH`` (10x), above anything the loss reached in the 64 updates before, with the
  gradient reversing direction or the weights flipping sign (an oversized step overshooting).
  Without gradients it needs ``LOSS_ONLY_GROWTH`` (100x) instead.
* :class:`Departure` fires when the loss leaves its own range and does not come back, as Adam and
  AdamW diverge: a jump in a few updates, then a plateau far above the best the run reached (at
  least ``K`` (3x) above its best smoothed loss, more for a noisy run) for a window of updates
  (``WINDOW``, longer when the jump itself took longer), never falling back into its range
  (``sqrt(k)`` times its best), and above where it started. A loss that climbs steadily out of
  its range (a line through its log rises beyond its noise) counts by where the climb has got to
  rather than by its median, once that is ``k`` times its best and ``sqrt(k)`` times where it
  started: SGD a hair past its stability limit, an ascent. (Known limit: a loss that climbs
  for a legitimate reason past where it started, a GAN generator's as its discriminator learns or
  a sum-reduced loss under a growing sequence-length curriculum, looks the same from the loss
  alone; its updates point downhill, so it would be called a step size.) Values at the float
  noise floor of the run's own starting loss (below ``NOISE_FLOOR`` times it) are never a
  departure, and never a divergence either.
* :class:`Explosion` fires when the loss leaves everything it reached before by orders of
  magnitude in one update (``JUMP``, 1000x its largest earlier loss) and the next update is still
  more than :data:`nanscope.outcome.FAR` times above where the run started: one step threw the
  weights out (an unscaled feature under SGD, an lr far too large), whatever the optimizer, and a
  loss that will come back down (a single extreme batch, a spike the fit absorbs) is left alone.
* :class:`Ascent` fires when ``ASCENT_RISES`` consecutive updates raise the loss while the applied
  update points along the gradient (cosine > 0.5): the update's sign is flipped.
* :class:`Spikes` never stops a run; it tags updates whose loss or gradient norm jumps far above
  the run's recent history (``"loss_spike"``, ``"grad_jump"``) for the rules to read.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from nanscope._vocabulary import Vocabulary
from nanscope.numerics import finite_float
from nanscope.outcome import FAR

__all__ = [
    "NOISE_FLOOR",
    "Alarm",
    "AlarmKind",
    "Ascent",
    "Departure",
    "Detector",
    "Divergence",
    "Explosion",
    "NonFinite",
    "Spikes",
    "default_detectors",
    "stuck_at_zero",
]

#: losses below this fraction of the run's own first loss are at the float noise floor: ratios
#: between them (1e-14 -> 4e-13) are rounding, not growth
NOISE_FLOOR = 1e-6


class AlarmKind(Vocabulary):
    """What an :class:`Alarm` says happened: every kind nanscope raises (a ``str``, so an alarm's
    kind still equals its plain name, in a rollback entry's JSON too)."""

    #: a non-finite loss, gradient or weight (:class:`NonFinite`)
    NONFINITE = "nonfinite"
    #: the loss grew, left its range or exploded (:class:`Divergence`, :class:`Departure`,
    #: :class:`Explosion`)
    DIVERGING = "diverging"
    #: the loss rose while each update pointed along the gradient (:class:`Ascent`)
    ASCENDING = "ascending"
    #: a loss spike with an extreme row in its batch: a reason to roll back, never to stop (the
    #: Monitor's rollback policy)
    SPIKE = "spike"
    #: another rank died or stopped answering the cross-rank agreement (``torch.distributed``)
    RANK_FAILURE = "rank_failure"


@dataclass(frozen=True)
class Alarm:
    """Why a detector asks to stop: ``kind`` is machine-readable, ``text`` is for people.

    ``kind`` is an :class:`AlarmKind` for every alarm nanscope raises; a detector of the user's
    own (``Monitor(detectors=...)``) may name its own kind."""

    kind: str
    step: int
    text: str
    data: dict[str, Any] = field(default_factory=dict)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _update_cosines(record: Any) -> list[float]:
    """The finite cosines of the update with the gradient, under either convention (against the
    previous update's gradient or the current one)."""
    both = (finite_float(record.get("update_cos")), finite_float(record.get("update_cos_same")))
    return [c for c in both if c is not None]


def _log_of(value: Any) -> float | None:
    """The log of a finite positive number, else None."""
    if type(value) is float:  # the common case, first: finite and positive in one test
        return math.log(value) if 0.0 < value < math.inf else None
    number = finite_float(value)
    return math.log(number) if number is not None and number > 0 else None


class NonFinite:
    """First non-finite loss, gradient or weight; a gradient whose norm lies past the range of
    its own dtype (``grad_past_range``: every element finite, but any step with it overflows)
    counts as a non-finite gradient."""

    def quiet(self, record: dict[str, Any], rises: int, behind: int) -> bool:
        if (record.get("nf_loss") or record.get("nf_grads") or record.get("nf_params")
                or record.get("grad_past_range")):  # fmt: skip
            return False
        loss = record.get("loss")
        if type(loss) is float:  # the common case, inline: it runs on every update
            return loss - loss == 0.0  # NaN and inf give NaN
        return loss is None or _finite(loss)

    def step(self, record: dict[str, Any]) -> Alarm | None:
        loss = record.get("loss")
        what = []
        if record.get("nf_loss", 0) or (loss is not None and not _finite(loss)):
            what.append("loss")
        if record.get("nf_grads", 0) or record.get("grad_past_range"):
            what.append("grad")
        if record.get("nf_params", 0):
            what.append("weight")
        if not what:
            return None
        step = int(record["step"])
        return Alarm(
            AlarmKind.NONFINITE,
            step,
            f"non-finite {', '.join(what)} at update {step}",
            {"what": what},
        )


class Divergence:
    """Sustained geometric growth of the loss with oscillation: the step size is too large.

    Two shapes count: a fast climb (``RISES`` consecutive rises, each larger than the last, at
    least ``GROWTH`` in total) and a slow one (``SLOW_RISES`` consecutive rises of a steady factor,
    at least ``GROWTH`` in total). Either must also take the loss above everything it reached in
    the ``HISTORY`` updates before the climb: a transient excursion that stays inside the run's
    own range (minibatch noise on the edge of stability) is not a divergence.
    """

    RISES = 4
    SLOW_RISES = 12
    GROWTH = 10.0
    LOSS_ONLY_GROWTH = 100.0
    ACCEL = 1.2
    HISTORY = 64

    def __init__(self) -> None:
        self._recent: deque[dict[str, Any]] = deque(maxlen=self.SLOW_RISES + 1)
        self._history: deque[float] = deque(maxlen=self.HISTORY + self.SLOW_RISES + 1)
        self._prev: float | None = None
        self._rise_from: float | None = None
        self._rises = 0
        self._start: float | None = None

    def quiet(self, record: dict[str, Any], rises: int, behind: int) -> bool:
        return rises < self.RISES  # it reads nothing before the fourth rise in a row

    def step(self, record: dict[str, Any]) -> Alarm | None:
        loss = finite_float(record.get("loss"))
        if loss is None:
            self._recent.clear()
            self._prev, self._rises = None, 0
            return None
        if self._start is None:
            self._start = loss
        self._recent.append(record)
        self._history.append(loss)
        rising = self._prev is not None and loss > self._prev
        if rising and self._rises == 0:
            self._rise_from = self._prev  # the loss the climb started from
        self._prev = loss
        self._rises = self._rises + 1 if rising else 0
        if self._rises < self.RISES:
            return None  # the common case: read nothing more
        if _at_noise_floor(loss, self._start):
            return None  # rounding noise of a converged fit, not growth
        rises = min(self._rises, self.SLOW_RISES)
        window = list(self._recent)[-(rises + 1) :]
        losses = [float(rec["loss"]) for rec in window]
        deltas = [b - a for a, b in itertools.pairwise(losses)]
        fast = losses[-self.RISES - 1 :]
        fast_deltas = deltas[-self.RISES :]
        accelerating = sum(b >= self.ACCEL * a for a, b in itertools.pairwise(fast_deltas))
        shapes: list[tuple[str, list[float]]] = []
        if accelerating >= len(fast_deltas) - 2:
            shapes.append(("fast", fast))
        if rises >= self.SLOW_RISES and _steady(losses):
            shapes.append(("slow", losses))
        if not shapes:
            return None
        before = list(self._history)[: -(rises + 1)][-self.HISTORY :]
        if before and loss <= max(before):
            return None  # still inside the range the run has already visited
        for shape, used in shapes:
            growth = _growth(used)
            if shape == "slow" and self._rise_from and self._rise_from > 0:
                growth = loss / self._rise_from  # the whole climb, however long
            osc_flags, descent_flags = _direction(window[-(len(used) - 1) :])
            known = [o for o in osc_flags if o is not None]
            descent = [d for d in descent_flags if d is not None]
            if descent and sum(not d for d in descent) > len(descent) / 2:
                return None  # the update ascends: that is the Ascent detector's case
            if known:
                # an update whose direction was not measured (its cosines are sampled on a
                # climb) is no evidence of oscillation: a one-row spike followed by a wild
                # update or two would otherwise read as the step size
                if sum(known) >= max(2, len(osc_flags) - 1) and growth >= self.GROWTH:
                    break
            elif growth >= self.LOSS_ONLY_GROWTH:
                break
        else:
            return None
        step = int(record["step"])
        n = len(used) - 1 if shape == "fast" else self._rises
        how = "each rise larger than the last" if shape == "fast" else "by a steady factor"
        return Alarm(
            AlarmKind.DIVERGING,
            step,
            f"loss grew {growth:.3g}x over {n} consecutive updates, {how}",
            {"growth": growth, "rises": n, "oscillating": sum(known), "shape": shape},
        )


def _at_noise_floor(loss: float, start: float | None) -> bool:
    """The loss sits at the float noise floor of the run's own first loss."""
    return start is not None and start > 0 and abs(loss) < NOISE_FLOOR * start


class Departure:
    """The loss jumps out of its own range and stays out: divergence as adaptive optimizers show it.

    Adam and AdamW normalise the step, so an oversized learning rate does not make the loss grow
    geometrically: it jumps within a few updates and then plateaus far above the best the run had
    reached (3.5 -> 20, 8.8 -> 394). The detector keeps

    * ``best``: the running minimum of the loss smoothed over ``SMOOTH`` updates (one lucky batch
      is not the run's best);
    * ``noise``: a moving average of ``|log(loss_t / loss_{t-1})|`` while the loss is at home,
      which sets ``k = max(K, exp(NOISE_SIGMAS * noise))``;
    * the run's home range: below ``sqrt(k) * best``.

    It fires when the loss has stayed out of its home range for ``WINDOW`` updates (or twice the
    number of updates the jump took, if longer) with the median of those updates at least
    ``k * best`` and above where the run started (the median of its first ``SMOOTH`` losses: all
    it learned is lost), not falling (a line through the log of those updates does not take them
    below ``RECOVERING`` times where they began, beyond its noise), above the float noise floor
    of the starting loss. A steady climb whose median still lags (0.69 -> 2.26 over 100 updates,
    its best at the start) counts by its level now (``_climbing``: the lower of a log-linear fit's
    end and the median of the last ``SMOOTH`` updates) once that is ``k * best`` and ``sqrt(k)``
    times where the run started, after as many updates out of range as the climb took to get to
    ``k * best``. A loss that comes home resets it: an excursion the run recovers from is
    noise; a loss that rises back to its starting level (a GAN's discriminator, a harder
    curriculum) or falls back towards its range (new data being learned) is not a departure.
    """

    K = 3.0
    NOISE_SIGMAS = 4.0
    SMOOTH = 5
    WINDOW = 10
    MAX_WINDOW = 64
    ALPHA = 0.1
    #: the trend of the updates out of range takes the loss below this fraction of where it
    #: left, beyond noise: it is coming back (new data the run is learning), not departed
    RECOVERING = 0.8

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=self.SMOOTH)
        self._head: list[float] = []  # the first losses: where the run started
        self._start: float | None = None
        self.best = math.inf
        self.best_step: int | None = None
        self._noise = 0.0
        self._noise_n = 0
        self._prev: float | None = None
        self._home: tuple[int, float] | None = None  # the last update inside the range
        self._away: deque[tuple[int, float]] = deque(maxlen=2 * self.MAX_WINDOW)
        self._away_n = 0
        self._fired = False
        self._k_noise, self._k = 0.0, max(self.K, 1.0)
        self._home_factor = math.sqrt(self._k)  # the home range is below this times the best

    @property
    def k(self) -> float:
        if self._noise != self._k_noise:
            self._refresh_k()
        return self._k

    def _refresh_k(self) -> None:
        """k and the home factor for the noise now (exp and sqrt only when the noise moved)."""
        noise = self._k_noise = self._noise
        self._k = max(self.K, math.exp(self.NOISE_SIGMAS * noise))
        self._home_factor = math.sqrt(self._k)

    def quiet(self, record: dict[str, Any], rises: int, behind: int) -> bool:
        # out of its range one update more per record at most: it fires after WINDOW of them
        return self._fired or self._away_n + behind + 1 < self.WINDOW

    def step(self, record: dict[str, Any]) -> Alarm | None:
        loss = finite_float(record.get("loss"))
        if loss is None or loss <= 0:
            if loss is None:
                self._prev = None
            return None
        step = int(record["step"])
        if self._start is None:
            self._start = loss
        if len(self._head) < self.SMOOTH:
            self._head.append(loss)
        self._recent.append(loss)
        smooth = sorted(self._recent)[len(self._recent) // 2]
        if self._noise != self._k_noise:
            self._refresh_k()
        if loss <= self._home_factor * self.best or not math.isfinite(self.best):
            self.best, self.best_step = (smooth, step) if smooth < self.best else (
                self.best, self.best_step)  # fmt: skip
            if self._prev is not None and self._prev > 0 and not self._away:
                # the noise of the run at home: between consecutive updates inside its range
                change = abs(math.log(loss / self._prev))
                self._noise += self.ALPHA * (change - self._noise) if self._noise_n else change
                self._noise_n += 1
            self._prev = loss
            self._home = (step, loss)
            self._away.clear()
            self._away_n = 0
            return None
        self._prev = loss
        self._away.append((step, loss))
        self._away_n += 1
        if self._fired or self._away_n < self.WINDOW:
            return None
        data = self.state()
        if data is None or data["window"] < data["needed"]:
            return None
        self._fired = True
        if data["climb"]:
            return Alarm(
                AlarmKind.DIVERGING,
                step,
                f"the loss climbed out of its range and kept climbing: best {data['best']:.3g} "
                f"at update {data['best_step']}, {data['window']} updates out of its range, now "
                f"at {data['level']:.3g} ({data['factor']:.3g}x its best)",
                {"shape": "departure", **data},
            )
        return Alarm(
            AlarmKind.DIVERGING,
            step,
            f"the loss left its range and stayed out: best {data['best']:.3g} at update "
            f"{data['best_step']}, then {data['jump_from']:.3g} -> {data['jump_to']:.3g} in "
            f"{data['jump_updates']} update(s) and {data['window']} updates at a median "
            f"{data['plateau']:.3g} ({data['factor']:.3g}x its best)",
            {"shape": "departure", **data},
        )

    def state(self) -> dict[str, Any] | None:
        """The departure under way (the loss out of its range right now), or None."""
        if not self._away or not math.isfinite(self.best):
            return None
        k = self.k
        values = [v for _, v in self._away]
        plateau = float(np.median(values))
        level, shape = plateau, "plateau"
        head = sorted(self._head)
        started = head[len(head) // 2] if head else None
        if plateau < k * self.best:
            # not a plateau yet: a steady climb, still rising, whose median lags behind it
            climb = _climbing(values[-self.MAX_WINDOW :], self.SMOOTH)
            if climb is None or climb < k * self.best:
                return None
            if started is not None and climb <= math.sqrt(k) * started:
                return None  # climbing back to where it started: not lost yet (see below)
            level, shape = climb, "climb"
        if self._start is not None and level < NOISE_FLOOR * self._start:
            return None  # at the float noise floor of the starting loss
        if _recovering(values[-self.MAX_WINDOW :], self.RECOVERING):
            return None  # on its way back down: learning again (new data), not lost
        if started is not None and level <= started:
            # back where it started is not lost: a GAN's discriminator, a harder curriculum
            return None
        home_step, home_loss = self._home if self._home is not None else (0, self.best)
        # the jump: from the last update at home to the first one at the plateau's level
        to_step, to_loss = next(((s, v) for s, v in self._away if v >= k * self.best),
                                self._away[0])  # fmt: skip
        jump_updates = max(1, to_step - home_step)
        needed = min(self.MAX_WINDOW, max(self.WINDOW, 2 * jump_updates))
        if shape == "climb":
            # no plateau to wait for: out of its range for as long as it took to get this high
            needed = min(self.MAX_WINDOW, max(self.WINDOW, jump_updates))
        return {
            "best": self.best,
            "best_step": self.best_step,
            "jump_from": home_loss,
            "jump_from_step": home_step,
            "jump_to": to_loss,
            "jump_to_step": to_step,
            "jump_updates": jump_updates,
            "plateau": plateau,
            "level": level,
            "climb": shape == "climb",
            "factor": level / self.best,
            "k": k,
            "window": self._away_n,
            "needed": needed,
            "start": self._start,
        }


def _climbing(values: list[float], smooth: int) -> float | None:
    """Where a steady climb through ``values`` has got to, or None when they do not climb.

    A climb: a least-squares line through their log rises by more than four times its standard
    error (a trend, not noise). Returns the lower of the line's end and the median of the last
    ``smooth`` values: how far up the loss is now (a climb that stopped is held at its level)."""
    if len(values) < 2 * smooth:
        return None
    level, slope, se, half = _log_line(values)
    if slope <= 4.0 * se or slope <= 0:
        return None
    end = float(math.exp(level + slope * half))
    return min(end, float(np.median(values[-smooth:])))


def _recovering(values: list[float], factor: float) -> bool:
    """The loss falls over ``values``: a least-squares line through their log takes them below
    ``factor`` times where they began, by more than twice its standard error (not noise)."""
    n = len(values)
    if n < 5:
        return False
    _, slope, se, _ = _log_line(values)
    return slope * (n - 1) < math.log(factor) and slope < -2.0 * se


def _log_line(values: list[float]) -> tuple[float, float, float, float]:
    """The least-squares line through the log of ``values`` (at least three), against their
    index centred on 0: ``(mean log, slope, the slope's standard error, the last index)``."""
    n = len(values)
    logs = np.log(np.asarray(values, dtype=float))
    x = np.arange(n, dtype=float)
    x -= x.mean()
    sxx = float(np.sum(x * x))
    level = float(logs.mean())
    slope = float(np.sum(x * (logs - logs.mean())) / sxx)
    resid = logs - logs.mean() - slope * x
    se = math.sqrt(float(np.sum(resid * resid)) / (n - 2) / sxx)
    return level, slope, se, float(x[-1])


def _direction(window: list[dict[str, Any]]) -> tuple[list[bool | None], list[bool | None]]:
    """Per update: did the gradient reverse / weights flip, and did the update point downhill."""
    osc_flags: list[bool | None] = []
    descent_flags: list[bool | None] = []
    for rec in window:
        grad_cos = finite_float(rec.get("grad_cos"))
        flip = finite_float(rec.get("flip_frac"))
        osc: bool | None = None
        if grad_cos is not None or flip is not None:
            osc = (grad_cos is not None and grad_cos < 0) or (flip is not None and flip >= 0.2)
        osc_flags.append(osc)
        # either convention (update vs previous or vs current gradient) saying "downhill" counts
        cosines = _update_cosines(rec)
        descent_flags.append(min(cosines) < 0 if cosines else None)
    return osc_flags, descent_flags


def _steady(losses: list[float]) -> bool:
    """Every rise multiplies the loss by a similar factor: no single update carries the growth."""
    if losses[0] <= 0:
        return False
    logs = [math.log(b / a) for a, b in itertools.pairwise(losses)]
    total = sum(logs)
    return total > 0 and max(logs) <= 0.5 * total


def _growth(losses: list[float]) -> float:
    first, last = losses[0], losses[-1]
    if first > 0:
        return last / first
    # losses that can be negative: compare the last increment with the first
    d0 = losses[1] - losses[0]
    return (losses[-1] - losses[-2]) / d0 if d0 > 0 else math.inf


class Explosion:
    """The loss jumped out of its whole history by orders of magnitude and stayed far above its
    start: a step that threw the weights out, under any optimizer (see the module docstring).

    It keeps three floats: the first loss, the largest loss before the last one, and a pending
    jump (the update, from, to). A jump is ``JUMP`` times the largest earlier loss in one update;
    it fires on the next update if that loss is still more than ``FAR`` times the start. Positive
    losses only (a jump ratio means nothing across zero)."""

    JUMP = 1e3

    def __init__(self) -> None:
        self._start: float | None = None
        self._max: float | None = None
        self._jump: tuple[int, float, float] | None = None  # (step, from, to)

    def quiet(self, record: dict[str, Any], rises: int, behind: int) -> bool:
        # it fires only on a loss far above the start (a jump is one too): below that, never
        loss = record.get("loss")
        start = self._start
        if start is None or start <= 0 or type(loss) is not float:
            return start is not None and start <= 0
        return loss <= FAR * start

    def step(self, record: dict[str, Any]) -> Alarm | None:
        loss = finite_float(record.get("loss"))
        if loss is None:
            self._jump = None
            return None
        if self._start is None:
            self._start = loss
        start = self._start
        if start <= 0:
            return None
        jump, self._jump = self._jump, None
        if jump is not None and loss > FAR * start:
            step = int(record["step"])
            at, before, after = jump
            return Alarm(
                AlarmKind.DIVERGING,
                step,
                f"the loss jumped {after / before:.3g}x in one update ({before:.4g} -> "
                f"{after:.4g} at update {at}) and stayed far above where it started "
                f"({start:.4g}): {loss:.4g} at update {step}",
                {"shape": "explosion", "jump_step": at, "jump_from": before, "jump_to": after,
                 "start": start, "now": loss},
            )  # fmt: skip
        top = self._max
        if top is not None and top > 0 and loss > self.JUMP * top and loss > FAR * start:
            self._jump = (int(record["step"]), top, loss)
        self._max = loss if top is None or loss > top else top
        return None


class Ascent:
    """The loss rises while every applied update points along the gradient."""

    ASCENT_RISES = 5

    def __init__(self) -> None:
        self._prev: float | None = None
        self._run = 0

    def quiet(self, record: dict[str, Any], rises: int, behind: int) -> bool:
        return rises < self.ASCENT_RISES

    def step(self, record: dict[str, Any]) -> Alarm | None:
        loss = record.get("loss")
        if not _finite(loss):
            self._prev = None
            self._run = 0
            return None
        assert isinstance(loss, (int, float))
        prev = self._prev
        self._prev = float(loss)
        if prev is None or not loss > prev:
            self._run = 0  # the common case: not rising, the cosines are not read
            return None
        along = _update_cosines(record)
        if along and max(along) > 0.5 and min(along) > 0:
            self._run += 1
        else:
            self._run = 0
        if self._run < self.ASCENT_RISES:
            return None
        step = int(record["step"])
        return Alarm(
            AlarmKind.ASCENDING,
            step,
            f"loss rose for {self._run} updates while each update pointed along the gradient",
            {"rises": self._run, "update_cos": max(along)},
        )


class Spikes:
    """Tags loss spikes and gradient-norm jumps against a moving history (in log space)."""

    WARMUP = 8
    LOSS_FACTOR = 10.0
    GRAD_FACTOR = 100.0

    def __init__(self) -> None:
        self._loss = _LogHistory()
        self._grad = _LogHistory()
        #: (record, (log loss, log grad norm)) of the records quiet() let wait, not stepped yet
        self._waiting: deque[tuple[dict[str, Any], tuple[float | None, float | None]]]
        self._waiting = deque(maxlen=64)
        # the lowest log loss and log gradient norm among the waiting records (kept as they
        # come: quiet() runs on every update), None after step() took some out
        self._waiting_low: list[float] | None = [math.inf, math.inf]
        self._log_loss_factor = math.log(self.LOSS_FACTOR)
        self._log_grad_factor = math.log(self.GRAD_FACTOR)

    def quiet(self, record: dict[str, Any], rises: int, behind: int) -> bool:
        # A spike's batch is probed while the caller's arrays still hold it (a loop that refills
        # one buffer in place would show a later batch): only a record that cannot be a jump
        # waits. The moving mean after the waiting records lies between its value now and their
        # lowest value (each update moves it toward the new value), so a value no more than the
        # factor above the lower of the two cannot be a jump. Written flat: it runs on every
        # update.
        log_loss, log_grad = _log_of(record.get("loss")), _log_of(record.get("grad_norm"))
        waiting = self._waiting
        low = self._waiting_low
        if low is None:  # step() took records out: the lowest of those left, again
            low = [math.inf, math.inf]
            for _, seen in waiting:
                for k in (0, 1):
                    value = seen[k]
                    if value is not None and value < low[k]:
                        low[k] = value
            self._waiting_low = low
        behind_count = len(waiting)
        history = self._loss
        if log_loss is not None and history.count + behind_count >= self.WARMUP:
            floor = low[0]
            if history.count and history.mean < floor:
                floor = history.mean
            if log_loss - floor > self._log_loss_factor:
                return False
        history = self._grad
        if log_grad is not None and history.count + behind_count >= self.WARMUP:
            floor = low[1]
            if history.count and history.mean < floor:
                floor = history.mean
            if log_grad - floor > self._log_grad_factor:
                return False
        if len(waiting) == waiting.maxlen:
            self._waiting_low = None  # the oldest falls out: count again next time
        waiting.append((record, (log_loss, log_grad)))
        if log_loss is not None and log_loss < low[0]:
            low[0] = log_loss
        if log_grad is not None and log_grad < low[1]:
            low[1] = log_grad
        return True

    def step(self, record: dict[str, Any]) -> Alarm | None:
        waiting = self._waiting
        if waiting and waiting[0][0] is record:  # the common case: the oldest waiting record
            log_loss, log_grad = waiting.popleft()[1]  # quiet() took its logs already
            self._waiting_low = None if waiting else [math.inf, math.inf]
        else:
            for k, item in enumerate(waiting):  # records are stepped in the order they waited
                if item[0] is record:
                    for _ in range(k + 1):
                        waiting.popleft()
                    self._waiting_low = None if waiting else [math.inf, math.inf]
                    log_loss, log_grad = item[1]
                    break
            else:
                log_loss = _log_of(record.get("loss"))
                log_grad = _log_of(record.get("grad_norm"))
        loss_spike = log_loss is not None and self._loss.is_jump(
            log_loss, self._log_loss_factor, self.WARMUP
        )
        grad_jump = log_grad is not None and self._grad.is_jump(
            log_grad, self._log_grad_factor, self.WARMUP
        )
        if loss_spike or grad_jump:
            events = record.setdefault("events", [])
            if loss_spike:
                events.append("loss_spike")
            if grad_jump:
                events.append("grad_jump")
        return None


class _LogHistory:
    """Exponential moving average of a log-quantity and of its absolute deviation."""

    ALPHA = 0.1

    def __init__(self) -> None:
        self.mean = 0.0
        self.dev = 0.0
        self.count = 0

    def is_jump(self, value: float, log_factor: float, warmup: int) -> bool:
        """Whether ``value`` is more than ``log_factor`` (and six deviations) above the moving
        mean as it was; the averages move to it either way."""
        count, mean = self.count, self.mean
        self.count = count + 1
        if count == 0:
            self.mean = value
            return False
        excess = value - mean
        # the moving averages move first; the jump is judged against them as they were
        dev = self.dev
        self.mean = mean + self.ALPHA * excess
        self.dev = dev + self.ALPHA * (abs(excess) - dev)
        return (
            count >= warmup
            and excess > log_factor
            and excess > 6.0 * (dev if dev > 1e-12 else 1e-12)
        )


#: this many exact zeros in a row, to the end, after at least as many finite non-zero losses (a
#: run that was learning): the run is stuck at 0
ZERO_RUN = 5


def stuck_at_zero(losses: Any) -> tuple[int, int] | None:
    """``(first index, count)`` of the exact zeros a loss series ends on after ``ZERO_RUN`` finite
    non-zero losses or more, or None. A loss of exactly 0.0 that stays there is a logger writing 0
    for NaN, a batch whose labels are all masked, or a loss saturated in float precision: nothing
    is learned any more. (A fit that separates its data at once, zero from its second update, is
    not a run that was learning and broke; nor is one that reached the float noise floor of its
    starting loss first, where exact zeros are rounding; nor one whose loss had read exactly 0
    before and come back from it, 0 0 0.26 1.4 0: a classifier whose margins saturate the loss
    in float precision on the batches it fits, and not on the few it does not, where a NaN
    written as 0 or a switch that masked every label never comes back.)"""
    values = [float(v) for v in losses]
    i = len(values)
    while i > 0 and values[i - 1] == 0.0:
        i -= 1
    count = len(values) - i
    before = [v for v in values[:i] if math.isfinite(v) and v != 0.0]
    if count < ZERO_RUN or len(before) < ZERO_RUN or 0.0 in values[:i]:
        return None
    last = sorted(abs(v) for v in before[-ZERO_RUN:])[ZERO_RUN // 2]
    if last < NOISE_FLOOR * abs(before[0]):
        return None  # it had already converged to the float noise floor: exact 0 is rounding
    return i, count


def default_detectors() -> list[Any]:
    """The detectors a Monitor runs, cheapest first."""
    return [NonFinite(), Spikes(), Ascent(), Divergence(), Departure(), Explosion()]


# ---------------------------------------------------------------------- the extension point
# (appended by core: the protocol every detector, and every wrapper of detectors, follows)


class Detector(Protocol):
    """What a :class:`nanscope.Monitor` runs on every update (``Monitor(detectors=...)``).

    ``step(record)`` reads one update's record (the keys of :mod:`nanscope.trace`) and returns an
    :class:`Alarm` to ask for a stop, or None. It must be cheap: a few floats of state, no arrays.
    A detector may also define ``reset()``, which forgets its history: the Monitor calls it after
    a rollback (:meth:`nanscope.Monitor.reset_detectors`), and ``quiet(record, rises, behind)``,
    True only when it cannot fire on ``record`` whatever its state: the loss rose ``rises``
    updates in a row up to it (finite losses), and ``behind`` records before it have not been
    shown to it yet (its state is that many updates old). Where every detector of a chain says
    quiet, :meth:`nanscope.Monitor.update` judges the record later, with the next few, in one
    warm loop (see ``DEFER_RECORDS`` there); a detector without ``quiet`` sees each record at its
    own update. Wrappers follow the same protocol and
    hold the detectors they wrap (``nanscope.torch.distributed.agree(inner)``), the way an optax
    transform wraps an inner one.
    """

    def step(self, record: dict[str, Any]) -> Alarm | None: ...
