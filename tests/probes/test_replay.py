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
def test_a_sequence_feature_in_raw_units_is_standardised_on_its_last_axis() -> None:
    # a ReLU RNN reading sequences whose feature 1 is in raw units (mean 3000): SGD overflows the
    # recurrence at the second update; clipping the gradient also survives, but only standardising
    # the feature (the last axis, as the recurrent layer reads it) trains at the script's lr
    torch.manual_seed(3)
    n, steps = 128, 12
    X = torch.randn(n, steps, 3)
    X[:, :, 1] = X[:, :, 1] * 1000 + 3000
    y = X[:, :, 0].mean(1, keepdim=True)

    class Reader(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.RNN(3, 16, nonlinearity="relu", batch_first=True)
            self.head = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

    model = Reader()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = nanscope.watch(model, opt, monitor=nanscope.Monitor(write=False))

    def fit() -> None:
        for _ in range(10):
            for i in range(0, n, 32):
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(X[i:i + 32]), y[i:i + 32])
                loss.backward()
                opt.step()

    try:
        d = _stopped(fit)
    finally:
        watcher.close()
    runs = _window(d)
    assert runs["control"]["reproduced"]
    assert runs["standardised"]["fixed"] and runs["standardised"]["columns"] == [1]
    assert d.cause == "step_size_too_large" and d.confidence >= 0.9
    assert d.actions[0].startswith("Standardise input column") and " 1 " in d.actions[0]
    if not any(runs[f"lr_x{f}"]["fixed"] for f in ("0.1", "0.01", "0.001")):
        # no smaller step alone cured it: no action may say one did
        assert not any("replay showed a smaller step" in a for a in d.actions)


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


#: a CNN on 8-bit pixels holding a NaN and two extreme pixels, as the scenario bench drew it
#: (seed 607): leaving out the NaN's row alone trains it
PIXELS_NAN_AND_TYPOS = """
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(607)

rng = np.random.default_rng(607)
n = 256
X = rng.normal(0.0, 0.3, size=(n, 1, 12, 12))
y = rng.integers(0, 3, size=n)
pos = rng.integers(2, 10, size=n)
for i in range(n):  # a horizontal bar, a vertical bar or the diagonal
    if y[i] == 0:
        X[i, 0, pos[i], :] += 1.0
    elif y[i] == 1:
        X[i, 0, :, pos[i]] += 1.0
    else:
        X[i, 0, np.arange(12), np.arange(12)] += 1.0
X = np.clip(np.round(100.0 + 80.0 * X), 0, 255)  # 8-bit pixel values
X[209, 0, 0, 5] = np.nan
X[137, 0, 3, 7] = 3e6
X[140, 0, 0, 7] = 1e5

X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * 3 * 3, 3)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc(x.flatten(1))


model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=0.00033, weight_decay=0.01)
loss_fn = nn.CrossEntropyLoss()
loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=(3 * len(loader) // 4))

losses = []
for epoch in range(3):
    for i, (xb, yb) in enumerate(loader):
        out = model(xb)
        loss = loss_fn(out, yb)
        (loss / 4).backward()
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
            sched.step()
        losses.append(loss.item())
    print(f"epoch {epoch}: loss {losses[-1]:.4g}")
"""


@pytest.mark.slow
def test_nan_rows_and_typo_rows_in_one_window_are_told_apart_by_leaving_out_each(
    tmp_path,
) -> None:
    # the failing batch holds a NaN pixel and a 3e6 pixel; D004's prior is extreme_batch. Both
    # rows left out cure it, so the NaN rows are left out alone too: that cures it as well, and
    # the NaN is the cause
    from tests.torch.test_torch_autowatch import _run

    proc, d = _run(tmp_path, PIXELS_NAN_AND_TYPOS)
    assert d is not None, proc.stderr
    runs = {c["change"]: c for c in d["confirmation"] if c.get("scope") == "window"}
    assert runs["without_rows"]["fixed"] and runs["without_rows"]["rows_nonfinite"]
    assert runs["without_rows"]["rows_extreme"] is True
    assert runs["without_nonfinite_rows"]["fixed"]
    assert d["cause"] == "nonfinite_input", d["evidence"]


def _lbfgs_stopped(lr: float) -> nanscope.Diagnosis:
    """An MLP fitted by LBFGS (five evaluations a step) at ``lr``, stopped by nanscope."""
    torch.manual_seed(1)
    n, d = 512, 6
    X = torch.randn(n, d)
    y = X @ torch.randn(d, 1) + 0.1 * torch.randn(n, 1)
    model = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 1))  # fmt: skip
    opt = torch.optim.LBFGS(model.parameters(), lr=lr, max_iter=5, history_size=10)
    watcher = nanscope.watch(model, opt, monitor=nanscope.Monitor(write=False))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        return loss

    def fit() -> None:
        for _ in range(20):
            opt.step(closure)

    try:
        return _stopped(fit)
    finally:
        watcher.close()


@pytest.mark.slow
def test_lbfgs_that_breaks_at_its_second_step_is_replayed_from_its_first() -> None:
    # at lr 30 the second step's evaluations overflow. The first step's own later evaluations
    # (its line of five) belong to it, not to the second update as micro-batches: the window
    # from update 1 is complete, and a smaller step cures it
    d = _lbfgs_stopped(30.0)
    assert d.step == 2
    runs = _window(d)
    assert runs["control"]["reproduced"] and runs["control"]["from_step"] == 1
    assert d.cause == "step_size_too_large" and d.confidence >= 0.9


@pytest.mark.slow
def test_lbfgs_whose_first_step_overflows_within_its_line_of_evaluations_is_replayed() -> None:
    # LBFGS at lr 85 on an MLP: update 1's own loss (its first closure evaluation) is finite,
    # the later evaluations inside its step overflow at weights the step moved. The recorded
    # loss of update 1 is the finite one, so the control is faithful; and the lr is tested
    # although the window is that one update (the value came after the step began)
    d = _lbfgs_stopped(85.0)
    assert d.step == 1
    runs = _window(d)
    assert runs["control"]["reproduced"]
    assert any(runs[f"lr_x{f}"]["fixed"] for f in ("0.1", "0.01", "0.001"))
    assert d.cause == "step_size_too_large" and d.confidence >= 0.9
    single = next(c for c in d.confirmation if c["change"] == "lr_x0.1" and not c.get("scope"))
    assert "within its step" in single["text"]
