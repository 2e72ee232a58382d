"""A loss that climbs steadily out of its range and never comes back is not healthy, live and from
a log; a climb back to where the run started is (the data got harder, nothing was lost)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.diagnose._fits import logreg_ascent, noisier_targets, resumed_sgd, run

import nanscope
from nanscope import detectors
from nanscope.cli import main


class Keep:
    def __init__(self) -> None:
        self.losses: list[float] = []

    def update(self, loss: float, **_: object) -> None:
        self.losses.append(loss)


def _log(path: Path, losses: list[float]) -> Path:
    path.write_text("".join(f"[{i}] train loss: {v:.4f}\n" for i, v in enumerate(losses)))
    return path


def test_sgd_a_hair_past_its_stability_limit_is_stopped_on_its_climb() -> None:
    d, monitor = run(resumed_sgd, 1.003)
    assert (d.verdict, d.cause) == ("diverging", "step_size_too_large"), d.message()
    assert d.confidence >= 0.7
    data = d.evidence[0].data
    losses = monitor.trace.column("loss")
    assert data["climb"] and np.isfinite(losses).all()
    # the climb, not a plateau: the median of the updates out of range is still below k x best
    assert data["plateau"] < data["k"] * data["best_loss"] <= data["level"]
    assert data["level"] > 3 * data["best_loss"]
    assert "kept climbing" in d.evidence[0].text
    # the cosine between update and gradient tells it from a flipped sign: downhill
    assert any("the updates point downhill" in e.text for e in d.evidence)
    assert not any(a["cause"] == "update_sign_error" for a in d.alternatives)
    assert any("Cut the learning rate tenfold" in a for a in d.actions)


def test_the_same_resumed_fit_below_the_limit_is_healthy() -> None:
    d, _ = run(resumed_sgd, 0.5)
    assert (d.verdict, d.cause) == ("healthy", "healthy"), d.message()


def test_the_printed_log_of_the_climb_is_not_healthy(tmp_path: Path) -> None:
    keep = Keep()
    resumed_sgd(keep, 1.003)
    d = nanscope.diagnose(_log(tmp_path / "train.log", keep.losses))
    assert d.verdict == "diverging" and d.cause == "step_size_too_large", d.message()
    assert d.evidence[0].data["climb"]
    # only the loss: a flipped sign climbs the same way, and the diagnosis says so
    assert any(a["cause"] == "update_sign_error" for a in d.alternatives)
    assert any("only the loss was recorded" in e.text for e in d.evidence)


def test_gradient_ascent_from_log_2_is_stopped_live_as_a_sign_error() -> None:
    d, _ = run(logreg_ascent, 0.05)
    assert (d.verdict, d.cause) == ("diverging", "update_sign_error"), d.message()
    assert d.confidence >= 0.85


def test_its_log_climbing_from_069_is_not_healthy(tmp_path: Path) -> None:
    """The issue's log: a loss rising steadily from 0.69 to ~2.7 over 100 updates, its best at
    the start, was diagnosed healthy."""
    keep = Keep()
    logreg_ascent(keep, 0.05)
    assert keep.losses[0] == min(keep.losses[:5]) and keep.losses[-1] > 3 * keep.losses[0]
    log = _log(tmp_path / "train.log", keep.losses)
    d = nanscope.diagnose(log)
    assert d.verdict == "diverging", d.message()
    assert d.cause in ("step_size_too_large", "update_sign_error")
    assert {d.cause, *(a["cause"] for a in d.alternatives)} >= {
        "step_size_too_large",
        "update_sign_error",
    }
    assert main(["diagnose", str(log)]) == 1
    # the descending fit, logged the same way, is healthy
    keep = Keep()
    logreg_ascent(keep, 0.05, sign=-1.0)
    assert nanscope.diagnose(_log(tmp_path / "ok.log", keep.losses)).verdict == "healthy"


def test_a_short_climb_to_under_3x_its_best_is_not_a_departure(tmp_path: Path) -> None:
    keep = Keep()
    logreg_ascent(keep, 0.02)  # 0.69 -> ~1.2: rising, but not many times above its best
    assert 1.5 < keep.losses[-1] / keep.losses[0] < 2.5
    d = nanscope.diagnose(_log(tmp_path / "train.log", keep.losses))
    assert d.verdict == "healthy", d.message()


def test_a_climb_back_to_where_the_run_started_is_healthy() -> None:
    d, monitor = run(noisier_targets)
    losses = monitor.trace.column("loss")
    best = min(np.median(losses[i : i + 5]) for i in range(len(losses) - 5))
    assert losses[-20:].min() > 30 * best  # far above its best, still climbing
    climb = detectors._climbing(list(losses[-64:]), 5)
    assert climb is not None and climb > 100 * best
    assert (d.verdict, d.cause) == ("healthy", "healthy"), d.message()


def test_a_fit_thrown_out_of_its_start_is_judged_so_from_its_first_update_only() -> None:
    # the D012 fit: lr 30 throws the loss 60x up in two updates; it swings back but ends above
    # its untrained loss. A replay window may start on any minibatch: there such a swing is noise
    from nanscope.outcome import OutcomeKind, judge
    from nanscope.trace import read_trace

    fixture = Path(__file__).parent / "fixtures" / "D012_step_size_too_large.jsonl"
    losses = [float(v) for v in read_trace(fixture).column("loss")]
    assert max(losses) > 10 * losses[0] and np.median(losses[-3:]) > losses[0]
    assert judge(losses).kind == OutcomeKind.OK
    thrown = judge(losses, from_init=True)
    assert thrown.kind == OutcomeKind.RETURNED and thrown.end_ratio > 1
    # the same curve that came back below its start trained: nothing to say
    settled = losses + [losses[0] / 4] * len(losses)
    assert judge(settled, from_init=True).kind == OutcomeKind.OK


#: LBFGS at lr 0.2 on a feature in raw units (mileage, ~8000): each step throws the loss from one
#: wall of its valley to the other (513 -> 1.3e4 -> ... -> 2.7e3, 777, 451); the run stops on a
#: low swing, below its first loss, while its last three updates sit 1.5 times above it
LBFGS_SWINGING = """
import numpy as np
import torch
from torch import nn

torch.manual_seed(2)
rng = np.random.default_rng(2)
X = rng.normal(size=(256, 6))
y = (X @ rng.normal(size=(6, 3))).argmax(axis=1)
X[:, 2] = 8000.0 + 2500.0 * X[:, 2]
X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 3))
opt = torch.optim.LBFGS(model.parameters(), lr=0.2, max_iter=5, history_size=10)
loss_fn = nn.CrossEntropyLoss()


def closure():
    opt.zero_grad()
    loss = loss_fn(model(X), y)
    loss.backward()
    return loss


losses = [opt.step(closure).item() for _ in range(15)]
print("losses:", " ".join(f"{v:.4g}" for v in losses))
"""


@pytest.mark.slow
def test_a_short_fit_that_stops_on_a_low_swing_is_not_healthy(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.torch.test_torch_autowatch import _run

    proc, d = _run(tmp_path, LBFGS_SWINGING)
    assert d is not None, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("losses:"))
    losses = [float(v) for v in line.split()[1:]]
    # the shape: a climb past ten times the first loss, the last loss below the first, the
    # median of the last three above it
    assert max(losses) > 10 * losses[0] and losses[-1] < losses[0]
    assert sorted(losses[-3:])[1] > losses[0]
    assert d["verdict"] != "healthy", d["evidence"]
    assert d["cause"] == "step_size_too_large", d["evidence"]
