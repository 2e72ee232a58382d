"""A loss stuck at exactly 0.0 after finite losses is a failure, live and from a log; one that
reads 0 on the batches a saturated classifier fits, and came back from 0 before, is not."""

from __future__ import annotations

from pathlib import Path

import pytest
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
    # zeros it came back from before: the loss of batches fitted beyond float precision
    assert stuck_at_zero([3.0, 2.0, 0.0, 0.0, 1.4, 0.3, 0.0, 0.6, 0.2] + [0.0] * 6) is None


def test_a_classifier_whose_loss_saturates_to_zero_and_comes_back_is_healthy() -> None:
    # a CNN drawn at std 1 on bars and diagonals: its logits are wide, so the cross-entropy of a
    # batch it classifies reads exactly 0.0 in float32, and that of a batch it misses does not
    # (0 0 0.58 0.19 0 ... 0). It ends on seven zeros, but it had come back from exact zeros
    # before: saturation, not a switch that masked every label
    torch = pytest.importorskip("torch")
    from torch import nn

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # exact zeros depend on the last bit: one thread, one summation order
    try:
        losses, d = _saturating_cnn(torch, nn)
    finally:
        torch.set_num_threads(threads)
    assert (losses[-5:] == 0.0).all() and (losses[:-7] == 0.0).any()
    assert d.verdict == "healthy", d.message()


def _saturating_cnn(torch, nn):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    n = 192
    X = torch.randn(n, 1, 12, 12) * 0.3
    y = torch.randint(0, 3, (n,))
    pos = torch.randint(2, 10, (n,))
    for i in range(n):  # a horizontal bar, a vertical bar or the diagonal
        if y[i] == 0:
            X[i, 0, pos[i], :] += 1.0
        elif y[i] == 1:
            X[i, 0, :, pos[i]] += 1.0
        else:
            X[i, 0, torch.arange(12), torch.arange(12)] += 1.0
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 3 * 3, 3))  # fmt: skip
    with torch.no_grad():
        for m in model:
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                m.weight.normal_(0, 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = nanscope.Monitor(write=False)
    watcher = nanscope.watch(model, opt, monitor=monitor)
    for _ in range(5):
        perm = torch.randperm(n)
        for i in range(0, n, 16):
            idx = perm[i:i + 16]
            opt.zero_grad()
            nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
            opt.step()
    watcher.close()
    return monitor.trace.column("loss"), monitor.close()
