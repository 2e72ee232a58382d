"""The decisive experiment in process: real fits that really fail, stopped by nanscope, the window
replayed from a snapshot unchanged and under each intervention, the cause what removed it."""

from __future__ import annotations

import pytest

import nanscope

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402


def _stopped(body):  # type: ignore[no-untyped-def]
    with pytest.raises(nanscope.DivergenceError) as info:
        body()
    return info.value.diagnosis


def _window(d: nanscope.Diagnosis) -> dict[str, dict]:  # type: ignore[type-arg]
    return {c["change"]: c for c in d.confirmation if c.get("scope") == "window"}


@pytest.mark.slow
def test_a_column_in_dollars_is_standardised_by_the_replay_and_named_first() -> None:
    # SGD on a price column (mean 5000): one step throws the loss up 1e17x, and no lr down to
    # a thousandth of the script's own trains it, while the same fit on the column
    # standardised does
    torch.manual_seed(0)
    n = 256
    price = torch.randn(n, 1) * 1000 + 5000
    other = torch.randn(n, 3)
    X = torch.cat([price, other], 1)
    y = 0.002 * price[:, 0] + other[:, 0]
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = nanscope.watch(model, opt, monitor=nanscope.Monitor(write=False))

    def fit() -> None:
        for _ in range(20):
            for i in range(0, n, 64):
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(X[i:i + 64]).squeeze(-1), y[i:i + 64])
                loss.backward()
                opt.step()

    try:
        d = _stopped(fit)
    finally:
        watcher.close()
    runs = _window(d)
    assert runs["control"]["reproduced"]
    assert runs["standardised"]["fixed"] and runs["standardised"]["columns"] == [0]
    assert not runs["lr_x0.1"]["fixed"]
    assert d.cause == "step_size_too_large" and d.confidence >= 0.9
    assert d.actions[0].startswith("Standardise input column") and " 0 " in d.actions[0]


@pytest.mark.slow
def test_adam_with_eps_zero_is_the_division_the_optimizer_makes() -> None:
    # a dead ReLU unit has a gradient of exactly 0 at the first step: Adam divides 0 by 0
    torch.manual_seed(3)
    X = torch.randn(512, 8)
    y = (X @ torch.randn(8, 1)).squeeze(1)
    model = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=8,
                                         shuffle=True)  # fmt: skip
    watcher = nanscope.watch(model, opt, monitor=nanscope.Monitor(write=False))

    def fit() -> None:
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(xb).squeeze(1), yb).backward()
            opt.step()

    try:
        d = _stopped(fit)
    finally:
        watcher.close()
    runs = _window(d)
    assert runs["optimizer_eps"]["fixed"]
    cuts = [runs[c] for c in ("lr_x0.1", "lr_x0.01", "lr_x0.001") if c in runs]
    assert not any(c["fixed"] for c in cuts)
    assert d.cause == "zero_division"


@pytest.mark.slow
def test_accumulation_over_loop_iterations_is_replayed_as_it_ran() -> None:
    # the step every fourth iteration of the loader (gradient accumulation), SGD too large: the
    # replay reruns each update's four iterations, its loss the sum of their (loss / 4), as the
    # record holds it, and a smaller lr removes the failure
    torch.manual_seed(1)
    X = torch.randn(512, 10)
    y = X @ torch.randn(10, 1)
    model = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=16,
                                         shuffle=True)  # fmt: skip
    watcher = nanscope.watch(model, opt, monitor=nanscope.Monitor(write=False))

    def fit() -> None:
        for _ in range(20):
            for i, (xb, yb) in enumerate(loader):
                loss = nn.functional.mse_loss(model(xb), yb) / 4
                loss.backward()
                if (i + 1) % 4 == 0:
                    opt.step()
                    opt.zero_grad()

    try:
        d = _stopped(fit)
        updates = list(watcher.history.updates)
    finally:
        watcher.close()
    assert [len(u.iterations) for u in updates[:3]] == [4, 4, 4]
    runs = _window(d)
    assert runs["control"]["reproduced"], runs["control"]["text"]
    assert runs["lr_x0.1"]["fixed"]
    assert d.cause == "step_size_too_large" and d.confidence >= 0.9


@pytest.mark.slow
def test_a_relu_recurrence_at_the_identity_is_the_gradient_not_the_step() -> None:
    # an IRNN (ReLU recurrence started at the identity) on long sequences: the gradient explodes
    # at once; clipping it trains at the script's own lr, a tenth of the lr does not
    torch.manual_seed(26)
    rnn = nn.RNN(4, 32, nonlinearity="relu", batch_first=True)
    with torch.no_grad():
        rnn.weight_hh_l0.copy_(torch.eye(32))
        rnn.bias_hh_l0.zero_()
    head = nn.Linear(32, 1)
    model = nn.ModuleDict({"rnn": rnn, "head": head})
    X = torch.randn(64, 150, 4)
    y = X[:, :, 0].mean(1, keepdim=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, monitor=nanscope.Monitor(write=False))

    def fit() -> None:
        for _ in range(60):
            opt.zero_grad()
            out, _ = model["rnn"](X)
            loss = nn.functional.mse_loss(model["head"](out[:, -1]), y)
            loss.backward()
            opt.step()

    try:
        d = _stopped(fit)
    finally:
        watcher.close()
    runs = _window(d)
    assert runs["clipped"]["fixed"] and not runs["lr_x0.1"]["fixed"]
    assert d.cause == "exploding_gradients"


TYPO = """
import torch
from torch import nn

torch.manual_seed(1)
n = 256
X = torch.randn(n, 4)
y = X @ torch.randn(4, 1)
{typo}
model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=32)
for epoch in range(5):
    for i, (xb, yb) in enumerate(loader):
        loss = ((model(xb) - yb) ** 2).mean()
        (loss / 2).backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
"""


@pytest.mark.slow
@pytest.mark.parametrize("typo", ["X[5, 0] = 3e8", "y[37, 0] = 3e8"], ids=["feature", "target"])
def test_a_typo_row_in_the_first_batches_is_left_out_and_its_column_is_not_standardised(
    tmp_path, typo: str
) -> None:
    # a 3e8 typo in one row of the first update's batches (a feature, or the target of a loss
    # written as an expression; the target's in the second micro-batch): the first step throws
    # the weights out and no smaller step helps. The typo is an outlier of its column, not the
    # column's units: the replay leaves its row out and standardises nothing for it
    from tests.torch.test_torch_autowatch import _run

    proc, d = _run(tmp_path, TYPO.format(typo=typo))
    assert d is not None, proc.stderr
    runs = {c["change"]: c for c in d["confirmation"] if c.get("scope") == "window"}
    assert runs["control"]["reproduced"]
    assert runs["without_rows"]["fixed"], runs["without_rows"]["text"]
    assert "standardised" not in runs
    assert not runs["lr_x0.1"]["fixed"]
    assert d["cause"] == "extreme_batch" and d["confidence"] >= 0.9
