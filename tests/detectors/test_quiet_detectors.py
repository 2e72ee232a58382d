"""A detector's ``quiet`` lets a record wait only when stepping it could not fire or tag it.

Monitor.update judges the records ``quiet`` lets through later, in a batch; a ``quiet`` that says
yes to a record the detector would have tagged delays the probe of its batch (whose buffer the
loop may refill by then). Checked on long runs of noisy losses with spikes, judged in batches of
every size up to the spike tagger's whole waiting room (64), where its lowest waiting values are
counted again."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nanscope.detectors import NonFinite, Spikes


def _series(seed: int, n: int = 3000) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    loss = 2.0 * np.exp(-np.arange(n) / 800) + 0.05 * rng.random(n)
    grad = 1.0 + 0.2 * rng.random(n)
    spikes = rng.random(n) < 0.02
    loss[spikes] *= rng.uniform(1.5, 40.0, spikes.sum())  # some below the factor, most above
    grad[rng.random(n) < 0.02] *= 30.0
    records = [{"step": i + 1, "loss": float(a), "grad_norm": float(b)} for i, (a, b) in
               enumerate(zip(loss, grad, strict=True))]  # fmt: skip
    records[n // 2]["loss"] = 0.0  # a log of zero is no number: neither waits on it nor breaks
    records[n // 3].pop("grad_norm")
    return records


def _could_jump(spikes: Spikes, record: dict[str, float]) -> bool:
    """The rule quiet() keeps, counted out in full: the moving mean after the waiting records
    lies between its value now and their lowest value, so only a value more than the factor
    above the lower of the two can be a jump. (Reads the tagger's state; writes nothing.)"""
    waiting = list(spikes._waiting)
    for k, (value, history, factor) in enumerate(
        [
            (record.get("loss"), spikes._loss, Spikes.LOSS_FACTOR),
            (record.get("grad_norm"), spikes._grad, Spikes.GRAD_FACTOR),
        ]
    ):
        if value is None or not value > 0 or history.count + len(waiting) < Spikes.WARMUP:
            continue
        low = history.mean if history.count else math.inf
        for _, logs in waiting:
            if logs[k] is not None:
                low = min(low, logs[k])
        if math.log(value) - low > math.log(factor):
            return True
    return False


@pytest.mark.parametrize("batch", [1, 3, 8, 64, 70])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_spike_never_waits(seed: int, batch: int) -> None:
    spikes = Spikes()
    waited = tagged = 0
    pending: list[dict[str, float]] = []
    for record in _series(seed):
        could_jump = _could_jump(spikes, record)
        quiet = spikes.quiet(record, 0, len(pending))
        assert quiet is not could_jump, f"update {record['step']}: quiet() {quiet}"
        if quiet:
            pending.append(record)
            waited += 1
            if len(pending) >= batch:
                for late in pending:
                    spikes.step(late)
                    assert "events" not in late, f"update {late['step']} waited but was tagged"
                pending.clear()
            continue
        for late in pending:  # a record that may fire: the waiting ones go first, in order
            spikes.step(late)
            assert "events" not in late, f"update {late['step']} waited but was tagged"
        pending.clear()
        spikes.step(record)
        tagged += "events" in record
    assert tagged >= 25, "the series has spikes: the test needs them tagged"
    assert waited > 2000, "nearly every update can wait: a quiet that never says yes is no use"


def test_the_tags_are_those_of_stepping_every_update() -> None:
    every, batched = Spikes(), Spikes()
    first, second = _series(2), _series(2)
    pending: list[dict[str, float]] = []
    for now, later in zip(first, second, strict=True):
        every.step(now)
        if batched.quiet(later, 0, len(pending)):
            pending.append(later)
            if len(pending) >= 8:
                for late in pending:
                    batched.step(late)
                pending.clear()
            continue
        for late in pending:
            batched.step(late)
        pending.clear()
        batched.step(later)
    for late in pending:
        batched.step(late)
    assert [r.get("events") for r in first] == [r.get("events") for r in second]


@pytest.mark.parametrize(
    "record",
    [
        {"loss": math.nan},
        {"loss": math.inf},
        {"loss": 1.0, "nf_grads": 3},
        {"loss": 1.0, "nf_params": 1},
        {"loss": 1.0, "nf_loss": 1},
        {"loss": np.float32("nan")},
    ],
)
def test_a_nonfinite_update_never_waits(record: dict[str, float]) -> None:
    assert NonFinite().quiet(record, 0, 0) is False
    assert NonFinite().step({"step": 1, **record}) is not None


def test_a_finite_update_waits() -> None:
    assert NonFinite().quiet({"loss": 1.0, "nf_grads": 0, "nf_params": 0}, 0, 0)
    assert NonFinite().quiet({"loss": 3}, 0, 0)


def test_a_low_value_that_left_the_waiting_room_no_longer_holds_a_record_back() -> None:
    spikes = Spikes()
    for step in range(1, 21):
        spikes.step({"step": step, "loss": 1.0})
    waiting = [{"step": 21, "loss": 0.1}] + [{"step": s, "loss": 1.0} for s in range(22, 86)]
    for record in waiting:  # 65: the dip at 0.1 is pushed out of the 64 places by the last
        assert spikes.quiet(record, 0, 0)
    # against the dip this would be a jump; against what waits now (and the mean) it is not
    between = {"step": 86, "loss": 0.5 * Spikes.LOSS_FACTOR}
    assert not _could_jump(spikes, between)
    assert spikes.quiet(between, 0, 0)
