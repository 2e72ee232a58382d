"""A loss stuck at exactly 0.0 after finite losses is a failure, live and from a log."""

from __future__ import annotations

from pathlib import Path

from tests.diagnose._fits import masked_regression, run

import nanscope


def test_a_loss_stuck_at_exact_zero_is_not_healthy() -> None:
    diagnosis, monitor = run(masked_regression)
    losses = monitor.trace.column("loss")
    assert losses[0] > 1 and (losses[30:] == 0.0).all()
    assert (diagnosis.verdict, diagnosis.cause) == ("suspect", "unknown"), diagnosis.message()
    text = diagnosis.evidence[0].text
    assert "exactly 0.0 at update 31" in text and "last 30 updates" in text
    assert "update 31" in diagnosis.actions[0]


def test_a_log_of_it_says_the_same(tmp_path: Path) -> None:
    _, monitor = run(masked_regression)
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {r['step']}, loss: {r['loss']:.4f}\n"
                           for r in monitor.trace.records))  # fmt: skip
    d = nanscope.diagnose(log)
    assert (d.verdict, d.cause) == ("suspect", "unknown"), d.message()
    assert "exactly 0.0 at update 31" in d.evidence[0].text


def test_a_loss_that_only_touches_zero_once_is_not_stuck() -> None:
    from nanscope.detectors import stuck_at_zero

    assert stuck_at_zero([3.0, 1.0, 0.0, 0.5, 0.2]) is None
    assert stuck_at_zero([0.0] * 8) is None  # never a finite non-zero loss before: nothing lost
    assert stuck_at_zero([0.7] + [0.0] * 9) is None  # separated at once: not a run that broke
    assert stuck_at_zero([3.0, 2.0, 1.5, 1.2, 1.0] + [0.0] * 5) == (5, 5)
    converged = [14.0, 1.0, 1e-4, 1e-9, 3e-13, 1e-13, 4e-14, 2e-13, 1e-13]
    assert stuck_at_zero(converged + [0.0] * 9) is None  # zeros at the noise floor: rounding
