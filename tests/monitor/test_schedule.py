"""The one schedule (``nanscope.schedule``), and the hot paths that write it out pinned to it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nanscope.capture.arrays import (
    BATCH_CHECKS,
    COLUMN_CHECKS,
    EXACT_WEIGHTS,
    WEIGHT_SAMPLES,
    BatchChecker,
    ParamTracker,
)
from nanscope.schedule import Every, Rises


def test_every_is_due_on_its_span_from_its_offset():
    assert [s for s in range(0, 140) if Every(64, 1).due(s)] == [1, 65, 129]
    assert [s for s in range(0, 40) if Every(16, 1, 2)(s)] == [1, 2, 17, 18, 33, 34]
    assert [s for s in range(0, 20) if Every(8).due(s)] == [0, 8, 16]
    assert [s for s in range(0, 10) if Every(4, 2).due(s)] == [2, 6]
    assert all(Every(1, 5).due(s) for s in range(-3, 10))
    assert all(Every(2, 1, span=2).due(s) for s in range(10))  # a span of n: always


@pytest.mark.parametrize("args", [(0,), (-1,), (True,), (4, 0, 0), (4, 1.5), (2.0,)])
def test_every_refuses_a_schedule_that_is_not_one(args):
    with pytest.raises(ValueError):
        Every(*args)


def test_rises_counts_the_rises_in_a_row():
    rises = Rises()
    seen = [rises.see(v) for v in (1.0, 2.0, 3.0, 3.0, 4.0, 5.0, math.nan, 6.0, None, 7.0, 8.0)]
    assert seen == [0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 1]
    assert rises.last == 8.0 and rises.count == 1
    rises.reset()
    assert (rises.count, rises.last, rises.see(9.0)) == (0, None, 0)


def _grads(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"w": rng.standard_normal((8, 4)), "b": rng.standard_normal(4)}


def test_the_numpy_weight_sample_follows_its_schedule():
    """``ParamTracker.measure`` writes ``WEIGHT_SAMPLES`` out (it runs on every update): on a
    falling loss the sample is taken exactly on the schedule, so the update's measures (which
    need this update's and the previous update's samples) appear where both were due."""
    rng = np.random.default_rng(0)
    tracker = ParamTracker()
    params = _grads(rng)
    with_update = []
    for count in range(1, 60):
        params = {k: v - 0.01 * rng.standard_normal(v.shape) for k, v in params.items()}
        out = tracker.measure(params, _grads(rng), loss=100.0 - count)
        if "update_norm" in out:
            with_update.append(count)
    due = [c for c in range(1, 60) if WEIGHT_SAMPLES.due(c) and WEIGHT_SAMPLES.due(c - 1)]
    assert with_update == due == [2, 18, 34, 50]
    assert EXACT_WEIGHTS.due(1) and EXACT_WEIGHTS.due(17) and not EXACT_WEIGHTS.due(2)


def test_the_numpy_batch_check_follows_its_schedule():
    """``BatchChecker.check`` writes ``BATCH_CHECKS`` out: a batch is checked (a non-empty
    result) exactly when it is due, counted from 0; the column maxima on ``COLUMN_CHECKS``."""
    rng = np.random.default_rng(1)
    checker = BatchChecker("inputs")
    checked, columns = [], []
    for seen in range(70):
        result = checker.check(rng.standard_normal((16, 3)), None)
        if result:
            checked.append(seen)
        if "input_absmax" in result:
            columns.append(seen)
    assert checked == [s for s in range(70) if BATCH_CHECKS.due(s)]
    assert columns == [s for s in range(70) if COLUMN_CHECKS.due(s)] == [0, 32, 64]
