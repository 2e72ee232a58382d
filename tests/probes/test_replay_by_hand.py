"""The decisive experiment on loops nobody wrote for it: parameters updated by hand (found only
after their first update), a loss written out in the loop, state the script keeps itself.

Each fit is a real one that fails the way its test says; the replay's entries are what decide."""

from __future__ import annotations

import json

import pytest
from tests.torch.test_torch_autowatch import _run

pytestmark = pytest.mark.slow  # nanscope run in subprocesses

pytest.importorskip("torch")


def _window(d: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {c["change"]: c for c in d["confirmation"] if c.get("scope") == "window"
            and c.get("ran")}  # fmt: skip


BY_HAND_SGD = """
import torch

torch.manual_seed(0)
n, d = 512, 6
X = torch.randn(n, d)
y = X @ torch.randn(d, 1) + 0.1 * torch.randn(n, 1)
w = (torch.randn(d, 1) / d ** 0.5).requires_grad_()
b = torch.zeros(1, requires_grad=True)
lr = 1.1
for epoch in range(4):
    perm = torch.randperm(n)
    for start in range(0, n, 32):
        idx = perm[start:start + 32]
        xb, yb = X[idx], y[idx]
        loss = ((xb @ w + b - yb) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in (w, b):
                p -= lr * p.grad
                p.grad.zero_()
    print(epoch, loss.item())
"""


def test_a_hand_written_sgd_at_too_large_a_step_is_replayed_from_before_its_first_update(
        tmp_path):  # fmt: skip
    # linear regression, w -= lr * grad at lr 1.1: the loss grows geometrically. The loop is
    # found at its second update; update 1's weights, kept at its backward, are the snapshot
    proc, d = _run(tmp_path, BY_HAND_SGD)
    assert d is not None, proc.stderr
    assert (d["cause"], d["confidence"]) == ("step_size_too_large", 0.95), d["evidence"]
    runs = _window(d)
    assert runs["control"]["reproduced"] and runs["control"]["from_step"] == 1
    # the control's first pass is the run itself, batch for batch (each update's own batch,
    # the second's too, which is checked from inside its backward)
    trace = next((tmp_path / "runs").rglob("trace.jsonl")).read_text().splitlines()[1:]
    recorded = [json.loads(line)["loss"] for line in trace]
    span = runs["control"]["to_step"]
    replayed = runs["control"]["losses"][:span]
    assert all(abs(a - b) <= 1e-3 * abs(b) for a, b in zip(replayed, recorded[:span])), (
        replayed, recorded[:span])
    # a tenth of the applied update (the script's own lr, scaled) trains; turned round it does not
    assert runs["lr_x0.1"]["fixed"] and not runs["sign_flipped"]["fixed"]
    assert not runs["standard_init"]["fixed"]
    proc, d = _run(tmp_path, BY_HAND_SGD.replace("lr = 1.1", "lr = 0.11"))
    assert d is not None and d["verdict"] == "healthy", d and d["evidence"]


BY_HAND_MOMENTUM = """
import torch

torch.manual_seed(0)
n, d = 512, 6
X = torch.randn(n, d)
y = X @ torch.randn(d, 1) + 0.1 * torch.randn(n, 1)
w = (torch.randn(d, 1) / d ** 0.5).requires_grad_()
b = torch.zeros(1, requires_grad=True)
velocity = [torch.zeros_like(w), torch.zeros_like(b)]
lr = 0.6
for epoch in range(4):
    perm = torch.randperm(n)
    for start in range(0, n, 32):
        idx = perm[start:start + 32]
        xb, yb = X[idx], y[idx]
        loss = ((xb @ w + b - yb) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p, v in zip((w, b), velocity):
                v.mul_(0.9).add_(p.grad)
                p -= lr * v
                p.grad.zero_()
    print(epoch, loss.item())
"""


def test_a_hand_written_update_with_its_own_velocity_is_not_replayed(tmp_path):
    # the velocity lives in the script: no snapshot holds its earlier values, so no rerun is
    # trusted, and it says so (the rules answer, below a confirmed answer)
    proc, d = _run(tmp_path, BY_HAND_MOMENTUM)
    assert d is not None, proc.stderr
    assert d["verdict"] != "healthy"
    refused = [c for c in d["confirmation"] if c.get("change") == "replay" and not c.get("ran")]
    assert refused and "changes tensors besides the weights" in refused[0]["text"]
    assert not any(c.get("change", "").startswith("lr_x") and c.get("scope") == "window"
                   for c in d["confirmation"])  # fmt: skip
    assert d["confidence"] < 0.95


RAW_UNITS_AT_UPDATE_1 = """

import numpy as np
import torch

torch.manual_seed(1486)

rng = np.random.default_rng(1486)
n, d = 512, 5
X = rng.normal(size=(n, d))
y = (X @ rng.normal(size=d) + 0.3 * rng.normal(size=n) > 0).astype(np.float64)
X[:, 4] = (rng.random(n) < 0.03).astype(np.float64)  # a rarely-set flag
X[:, 0] = 8000.0 + 2500.0 * X[:, 0]  # annual mileage
X[:, 3] = 1500.0 + 400.0 * X[:, 3]  # floor area, in square feet

X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)

w = (torch.randn(d, 1) / d ** 0.5).requires_grad_()
b = torch.zeros(1, requires_grad=True)
params = [w, b]
lr = 0.013

losses = []
for epoch in range(4):
    perm = torch.randperm(n)
    for start in range(0, n, 32):
        idx = perm[start:start + 32]
        xb, yb = X[idx], y[idx]
        out = xb @ w + b
        p = torch.sigmoid(out)
        loss = -(yb * torch.log(p) + (1 - yb) * torch.log(1 - p)).mean()
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
                p.grad.zero_()
        losses.append(loss.item())
    print(f"epoch {epoch}: loss {losses[-1]:.4g}")
"""


def test_a_hand_written_fit_broken_at_update_1_by_raw_columns_is_standardised_by_the_replay(
        tmp_path):  # fmt: skip
    # mileage and floor area in raw units: the first loss is already NaN (the sigmoid saturates
    # and the log meets 0). The replay of update 1 with those columns standardised trains; the
    # epsilon at the log only holds the loss where it was
    proc, d = _run(tmp_path, RAW_UNITS_AT_UPDATE_1)
    assert d is not None, proc.stderr
    assert d["cause"] == "step_size_too_large", d["evidence"]
    runs = _window(d)
    assert runs["standardised"]["fixed"] and runs["standardised"]["columns"] == [0, 3]
    assert runs["eps"]["ran"] and not runs["eps"]["fixed"]
    assert d["actions"][0].startswith("Standardise input column(s) 0, 3")


LOG_OF_SOFTMAX_BF16 = """
import torch
from torch import nn

torch.manual_seed(0)
n = 512
X = torch.randn(n, 8)
y = (X[:, :3].argmax(1))
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3)).to(torch.bfloat16)
opt = torch.optim.Adam(model.parameters(), lr=0.3)
for epoch in range(6):
    perm = torch.randperm(n)
    for start in range(0, n, 32):
        idx = perm[start:start + 32]
        xb, yb = X[idx].to(torch.bfloat16), y[idx]
        opt.zero_grad()
        logp = torch.log(torch.softmax(model(xb), dim=-1))
        loss = -logp.gather(-1, yb.unsqueeze(-1)).mean()
        loss.backward()
        opt.step()
    print(epoch, loss.item())
"""


def test_a_log_written_in_the_loop_is_located_by_the_control_and_cured_by_an_epsilon(tmp_path):
    # the model is bf16 and the loss takes the log of its softmax in the loop: a class's
    # probability rounds to 0. The model's replay cannot see that op; the control reruns the
    # whole step op by op and sees the log make -inf from a finite input
    proc, d = _run(tmp_path, LOG_OF_SOFTMAX_BF16)
    assert d is not None, proc.stderr
    assert d["cause"] == "log_of_zero", d["evidence"]
    located = d["located"]
    line = next(i + 1 for i, t in enumerate(LOG_OF_SOFTMAX_BF16.splitlines()) if "torch.log(" in t)
    assert (located["op"], located["phase"], located["source"]["line"]) == ("log", "loss", line)
    assert "control" in located["how"] and located["observed"]
    runs = _window(d)
    assert runs["eps"]["fixed"] and runs["eps"]["op"] == "log"
    assert not runs["float32"]["fixed"]


NAN_TARGETS_SLICED = """
import torch

torch.manual_seed(3)
n, d = 256, 4
X = torch.randn(n, d)
y = X @ torch.randn(d, 1)
y[200:203] = float("nan")  # three targets lost in an export
w = torch.zeros(d, 1, requires_grad=True)
for epoch in range(2):
    for start in range(0, n, 32):
        loss = ((X[start:start + 32] @ w - y[start:start + 32]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.05 * w.grad
            w.grad.zero_()
print("done")
"""


def test_nan_targets_the_step_slices_itself_are_the_data_s_as_the_control_saw(tmp_path):
    # the step slices its batch out of a tensor made before the loop: the control saw the NaN
    # come in, and the rerun with the table's NaN rows overwritten by a clean row removes the
    # failure, which none of the step's own changes does
    proc, d = _run(tmp_path, NAN_TARGETS_SLICED)
    assert d is not None, proc.stderr
    assert d["cause"] == "nonfinite_input", d["evidence"]
    runs = _window(d)
    assert runs["control"]["reproduced"] and runs["control"]["data_nonfinite"]
    rows = runs["without_rows"]
    assert rows["fixed"] and "[200, 201, 202] of y (the table the step slices" in rows["text"]
    assert not any(e["fixed"] for c, e in runs.items() if c not in ("control", "without_rows"))


POISSON_BY_HAND = """
import torch

torch.manual_seed(11)
n, d = 256, 5
X = torch.randn(n, d)
y = torch.poisson(torch.exp(0.8 * X @ torch.randn(d, 1) / d ** 0.5))
w = (torch.randn(d, 1) * 3.0).requires_grad_()
b = torch.zeros(1, requires_grad=True)
lr = 0.07
for epoch in range(6):
    perm = torch.randperm(n)
    for start in range(0, n, 16):
        idx = perm[start:start + 16]
        out = X[idx] @ w + b
        loss = (torch.exp(out) - y[idx] * out).mean()
        loss.backward()
        with torch.no_grad():
            for p in (w, b):
                p.data.add_(p.grad, alpha=-lr)
                p.grad.zero_()
    print(epoch, loss.item())
"""


def test_weights_drawn_at_std_3_by_hand_are_the_init_when_a_standard_draw_cures_the_fit(
        tmp_path):  # fmt: skip
    # a Poisson regression's exp head with weights drawn at std 3 (6.7 times randn/sqrt(5)): the
    # rate overflows within a few updates. The standard draw trains at the script's own lr, and
    # the drawn scale is beyond the spread of the standard initialisers (if far short of 8, the
    # bar a rule needs with no experiment): the init, whatever a smaller step also does
    proc, d = _run(tmp_path, POISSON_BY_HAND)
    assert d is not None, proc.stderr
    runs = _window(d)
    assert runs["standard_init"]["fixed"]
    assert 3 <= runs["standard_init"]["initial_scale"]["ratio"] < 8
    assert d["cause"] == "bad_initialization", d["evidence"]
    proc, d = _run(tmp_path, POISSON_BY_HAND.replace("* 3.0)", "/ d ** 0.5)"))
    assert d is not None and d["verdict"] == "healthy", d and d["evidence"]


RAW_COLUMN_AND_TARGET = """
import numpy as np
import torch

rng = np.random.default_rng(4)
torch.manual_seed(4)
n, d = 384, 6
X = rng.normal(size=(n, d))
y = 5000.0 + 1000.0 * (X @ rng.normal(size=d))  # a price, in its own units
X[:, 2] = 1500.0 + 400.0 * X[:, 2]  # floor area, in square feet
X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)
w = (torch.randn(d, 1) / d ** 0.5).requires_grad_()
b = torch.zeros(1, requires_grad=True)
opt = torch.optim.SGD([w, b], lr=0.1)
for epoch in range(3):
    perm = torch.randperm(n)
    for start in range(0, n, 16):
        idx = perm[start:start + 16]
        xb, yb = X[idx], y[idx]
        loss = ((xb @ w + b - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(epoch, loss.item())
"""


def test_a_model_less_step_on_a_raw_column_is_cured_by_standardising_that_column_once(
        tmp_path):  # fmt: skip
    # a linear fit written out over a table X that the step slices itself (no module): floor
    # area in square feet throws SGD out. The replay standardises the column in X, the name the
    # step both reads and holds in the loop's values, once: standardised twice, the column would
    # be a constant near -4 that throws the same step out again
    proc, d = _run(tmp_path, RAW_COLUMN_AND_TARGET)
    assert d is not None, proc.stderr
    runs = _window(d)
    assert runs["standardised"]["fixed"] and runs["standardised"]["columns"] == [2]
    assert d["cause"] == "step_size_too_large", d["evidence"]
    assert d["actions"][0].startswith("Standardise input column") and " 2 " in d["actions"][0]


def test_an_epsilon_and_a_smaller_step_that_both_cure_the_window_leave_the_cause_unconfirmed(
        tmp_path):  # fmt: skip
    # the zoo's hand-written BCE: the log meets a saturated sigmoid's 0. In the replayed window
    # both an epsilon at the log and a tenth of the lr remove the failure; which one the whole
    # run needs (an epsilon that only postpones the NaN of weights thrown out by the step, or a
    # smaller step that only postpones the log's 0) the window cannot show: the op is named, not
    # confirmed, and the step is the alternative
    from pathlib import Path

    script = Path(__file__).parents[1] / "zoo" / "torch" / "log_of_zero_manual_bce.py"
    proc, d = _run(tmp_path, script.read_text())
    assert d is not None, proc.stderr
    runs = _window(d)
    assert runs["eps"]["fixed"] and runs["lr_x0.1"]["fixed"]
    assert d["cause"] == "log_of_zero" and d["confidence"] <= 0.7
    assert any(a["cause"] == "step_size_too_large" for a in d["alternatives"])
    assert any("not confirmed over step_size_too_large" in e["text"] for e in d["evidence"])
