"""Divergence as adaptive optimizers show it (a jump to a plateau), live and from a log, and the
float noise floor that is never divergence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tests.diagnose._fits import adam_mlp, converged_float32, run

import nanscope
from nanscope import detectors


def test_adam_at_too_large_an_lr_is_stopped_on_its_plateau() -> None:
    diagnosis, monitor = run(adam_mlp, 3.0)
    assert (diagnosis.verdict, diagnosis.cause) == ("diverging", "step_size_too_large")
    assert diagnosis.confidence >= 0.7
    data = diagnosis.evidence[0].data
    losses = monitor.trace.column("loss")
    # the evidence numbers are the run's own: best, the jump, the plateau
    head = losses[: data["jump_from_step"]]
    assert head.min() <= data["best_loss"] <= head.max()
    assert data["factor"] >= 3.0 and data["plateau"] >= 3.0 * data["best_loss"]
    assert data["jump_to_step"] > data["jump_from_step"] >= data["best_step"]
    assert data["plateau_updates"] >= detectors.Departure.WINDOW
    assert diagnosis.step == monitor.trace.records[-1]["step"]
    assert "the loss left its range" in diagnosis.evidence[0].text
    assert any("Cut the learning rate tenfold" in a for a in diagnosis.actions)


def test_the_same_fit_at_a_sane_lr_is_healthy() -> None:
    diagnosis, _ = run(adam_mlp, 1e-2)
    assert (diagnosis.verdict, diagnosis.cause) == ("healthy", "healthy")


def test_a_log_of_the_run_gets_the_same_verdict(tmp_path: Path) -> None:
    live, monitor = run(adam_mlp, 3.0)
    log = tmp_path / "train.log"
    log.write_text("".join(
        f"step {r['step']} | loss {r['loss']:.6f} | lr 3.0\n" for r in monitor.trace.records
    ))  # fmt: skip
    offline = nanscope.diagnose(log)
    assert (offline.verdict, offline.cause) == (live.verdict, live.cause)
    assert offline.step == live.step
    assert offline.evidence[0].data["best_step"] == live.evidence[0].data["best_step"]


def test_a_log_that_ends_on_the_plateau_is_not_healthy(tmp_path: Path) -> None:
    """A printed log of the same run kept going after the jump: it ends far above its best."""
    import numpy as np

    class Keep:
        def __init__(self) -> None:
            self.losses: list[float] = []

        def update(self, loss: float, **_: object) -> None:
            self.losses.append(loss)

    keep = Keep()
    adam_mlp(keep, 3.0, updates=60)
    assert np.isfinite(keep.losses).all()
    log = tmp_path / "train.log"
    log.write_text("".join(f"iter {i + 1}: loss {v:.5f}\n" for i, v in enumerate(keep.losses)))
    d = nanscope.diagnose(log)
    assert d.verdict != "healthy" and d.cause == "step_size_too_large", d.message()


def test_a_fit_at_the_float_noise_floor_is_healthy() -> None:
    diagnosis, monitor = run(converged_float32)
    losses = monitor.trace.column("loss")
    assert losses[-100:].max() < 1e-10 and losses[-100:].max() / losses[-100:].min() > 10
    assert (diagnosis.verdict, diagnosis.cause) == ("healthy", "healthy"), diagnosis.message()


def test_a_loss_back_at_its_starting_level_is_not_a_departure() -> None:
    """A new task half-way (other labels): the loss goes back up to where the run started and
    stays there a while, far above its best -- it has not lost more than it knew at the start,
    which is what a too-large step does (a discriminator as its generator improves, a harder
    curriculum look the same)."""
    diagnosis, monitor = run(adam_mlp, 1e-2, updates=170, new_task_at=120)
    losses = monitor.trace.column("loss")
    best = min(sorted(losses[i : i + 5])[2] for i in range(115))
    assert np.median(losses[125:145]) > 3 * best  # far above its best for 20 updates
    assert (diagnosis.verdict, diagnosis.cause) == ("healthy", "healthy"), diagnosis.message()
