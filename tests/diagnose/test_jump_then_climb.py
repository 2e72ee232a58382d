"""A typo row late in a fit: the loss jumps on its batch and the thrown weights carry it further
up for an update or two. That is one jump and its aftermath, named at the typo's update with the
row, whether the run ended during it or a growth detector stopped it; not a step size's climb."""

from __future__ import annotations

import numpy as np

import nanscope

#: the typo's row sits in the batch of update 15 (rows 448-479, batches of 32)
ROW, UPDATE = 460, 15


def _least_squares(n: int, typo: float | None) -> nanscope.Diagnosis:
    """Minibatch least squares by hand at lr 0.05, one pass over ``n`` rows, feature 3 of one
    row ``typo`` (the others are of order one)."""
    rng = np.random.default_rng(5)
    d = 6
    X = rng.normal(size=(n, d))
    y = X @ rng.normal(size=d) + 0.1 * rng.normal(size=n)
    if typo is not None:
        X[ROW, 3] = typo
    w = rng.normal(size=d) / np.sqrt(d)
    monitor = nanscope.Monitor(write=False)
    try:
        for start in range(0, n, 32):
            xb, yb = X[start:start + 32], y[start:start + 32]
            r = xb @ w - yb
            g = 2 * xb.T @ r / len(xb)
            monitor.update(float(np.mean(r ** 2)), params={"w": w}, grads={"w": g}, lr=0.05,
                           inputs=xb, targets=yb)  # fmt: skip
            w = w - 0.05 * g
    except nanscope.DivergenceError as exc:
        return exc.diagnosis
    return monitor.close()


def test_a_jump_the_run_ended_during_is_named_where_it_began() -> None:
    # 17 updates: 1.4 -> 50 at the typo's batch, 4.9e3 the update after, 5.2e3 at the end. The
    # largest spike against the recent level is the second update of the cascade; it began at
    # the first, whose batch holds the row
    d = _least_squares(544, typo=600.0)
    assert (d.verdict, d.cause) == ("diverging", "extreme_batch"), d.evidence
    assert d.step == UPDATE
    assert d.rows and (d.rows[0]["batch_row"], d.rows[0]["column"]) == (ROW - 448, 3)


def test_a_jump_a_growth_detector_stopped_is_the_row_not_a_climb() -> None:
    # 18 updates: 1.13 -> 1144 at the typo's batch (most of the growth in that one update), then
    # 2.9e4 and 3.1e4: stopped as a fast growth, but it is one jump and its aftermath
    d = _least_squares(576, typo=300.0)
    assert (d.verdict, d.cause) == ("diverging", "extreme_batch"), d.evidence
    assert any(r["step"] == UPDATE and r["column"] == 3 for r in d.rows)


def test_the_same_fits_without_the_typo_are_healthy() -> None:
    for n in (544, 576):
        assert _least_squares(n, typo=None).verdict == "healthy"
