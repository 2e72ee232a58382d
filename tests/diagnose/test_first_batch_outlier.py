"""A typo in the data (5e7 among values of order one) that breaks a fit at once: the log of a
probability meets the 0 the row's saturated score made, or the first loss is already absurd.
The row is seen in the batch, so it is named, not the log or the step."""

from __future__ import annotations

import numpy as np
import pytest

import nanscope


def _logistic(monitor: nanscope.Monitor, *, typo: float | None, at: int) -> None:
    """Logistic regression by hand, the loss written out with np.log, minibatches of 32."""
    rng = np.random.default_rng(7)
    n, d = 512, 6
    X = rng.normal(size=(n, d))
    y = (X @ rng.normal(size=d) > 0).astype(np.float64).reshape(-1, 1)
    if typo is not None:
        X[at, 2] = typo
    w = rng.normal(size=(d, 1)) / np.sqrt(d)
    b = np.zeros(1)
    with np.errstate(all="ignore"):
        for _ in range(3):
            for start in range(0, n, 32):
                xb, yb = X[start:start + 32], y[start:start + 32]
                p = 1 / (1 + np.exp(-(xb @ w + b)))
                loss = -np.mean(yb * np.log(p) + (1 - yb) * np.log(1 - p))
                dz = (p - yb) / len(xb)
                gw, gb = xb.T @ dz, dz.sum(axis=0)
                monitor.update(loss, params={"w": w, "b": b}, grads={"w": gw, "b": gb},
                               lr=0.05, inputs=xb, targets=yb)  # fmt: skip
                w -= 0.05 * gw
                b -= 0.05 * gb


@pytest.mark.parametrize("at", [3, 200], ids=["first_batch", "later_batch"])
def test_a_log_of_zero_made_by_a_typo_row_names_the_row(at: int) -> None:
    monitor = nanscope.Monitor(write=False)
    with pytest.raises(nanscope.DivergenceError):
        _logistic(monitor, typo=5e7, at=at)
    d = monitor.close()
    assert d.cause == "extreme_batch", d.evidence
    assert d.step == at // 32 + 1
    assert d.rows and d.rows[0]["batch_row"] == at % 32 and d.rows[0]["column"] == 2
    assert any(cause == "log_of_zero" for cause, _ in d.alternatives) or any(
        f["cause"] == "log_of_zero" for f in d.contributing), d


def test_the_same_fit_without_the_typo_is_healthy() -> None:
    monitor = nanscope.Monitor(write=False)
    _logistic(monitor, typo=None, at=0)
    assert monitor.close().verdict == "healthy"


MANUAL_TYPO = """
import torch

torch.manual_seed(2)
n, d = 256, 5
X = torch.randn(n, d)
y = X @ torch.randn(d, 1)
X[9, 0] = 5e7  # a typo in the first batch
w = (torch.randn(d, 1) / d ** 0.5).requires_grad_()
b = torch.zeros(1, requires_grad=True)
for epoch in range(3):
    for start in range(0, n, 64):
        loss = ((X[start:start + 64] @ w + b - y[start:start + 64]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in (w, b):
                p -= 0.02 * p.grad
                p.grad.zero_()
print("done")
"""


@pytest.mark.slow
def test_a_hand_written_loop_thrown_out_by_a_typo_in_its_first_batch_names_the_row(tmp_path):
    # the loop is found at its second update; its first batch was read at its backward, and
    # the 5e7 in it made the first loss absurd and the first step huge
    pytest.importorskip("torch")
    from tests.torch.test_torch_autowatch import _run

    proc, d = _run(tmp_path, MANUAL_TYPO)
    assert d is not None, proc.stderr
    assert d["cause"] == "extreme_batch", d["evidence"]
    assert d["rows"] and (d["rows"][0]["batch_row"], d["rows"][0]["column"]) == (9, 0)
    assert d["rows"][0]["step"] == 1
