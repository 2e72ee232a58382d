"""A loop on bare tensors, found by `nanscope run` only after its first update, still gets that
update's batch, gradient and initial weights: a first loss that is already absurd or inf is told
apart by them (weights scaled up, a column in dollars, one oversized first step)."""

from __future__ import annotations

import json

import pytest
from tests.torch.test_torch_autowatch import _run

pytestmark = pytest.mark.slow  # nanscope run in subprocesses

pytest.importorskip("torch")

#: a Poisson regression written by hand: an ``exp`` head on counts, plain SGD
LOOP = """
import numpy as np
import torch

torch.manual_seed(3)
rng = np.random.default_rng(3)
n, d = 256, 6
X = rng.normal(size=(n, d))
y = rng.poisson(np.exp(0.8 * X @ rng.normal(size=d) / np.sqrt(d))).astype(np.float64)
{data}
X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)

w = (torch.randn(d, 1) * {scale}).requires_grad_()
b = torch.zeros(1, requires_grad=True)
{optimizer}
for epoch in range(3):
    perm = torch.randperm(n)
    for start in range(0, n, 32):
        idx = perm[start:start + 32]
        out = X[idx] @ w + b
        loss = (torch.exp(out) - y[idx] * out).mean()
        loss.backward()
        {update}
print("done")
"""

BY_HAND = """with torch.no_grad():
            for p in (w, b):
                p -= 0.02 * p.grad
                p.grad.zero_()"""

CUSTOM = """
class PlainSGD(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"])


opt = PlainSGD([w, b], lr=0.02)
"""


def _loop(*, scale: str, data: str = "", custom: bool = False) -> str:
    update = "opt.step()\n        opt.zero_grad()" if custom else BY_HAND
    return LOOP.format(scale=scale, data=data, optimizer=CUSTOM if custom else "",
                       update=update)  # fmt: skip


def _first_record(tmp_path) -> dict:
    trace = next((tmp_path / "runs").rglob("trace.jsonl"))
    return json.loads(trace.read_text().splitlines()[1])


@pytest.mark.parametrize("custom", [False, True], ids=["by_hand", "torch_optim_subclass"])
def test_weights_scaled_up_on_bare_tensors_are_named_from_their_measured_scale(tmp_path, custom):
    # randn * 30 on 6 inputs: std(W) * sqrt(fan_in) = 73, and exp of the first output is inf
    proc, d = _run(tmp_path, _loop(scale="30.0", custom=custom))
    assert d is not None, proc.stderr
    assert d["cause"] == "bad_initialization", d["evidence"]
    assert d["step"] == 1
    scale = [e for e in d["evidence"] if "sqrt(fan_in)" in e["text"] and "ratio" in e["data"]]
    assert scale and 30 < scale[0]["data"]["ratio"] < 150, d["evidence"]
    first = _first_record(tmp_path)
    assert first["step"] == 1 and first["nf_inputs"] == 0 and first["input_absmax"] < 10


def test_a_first_loss_made_by_a_column_in_dollars_is_no_bad_initialisation(tmp_path):
    # a standard init (1/sqrt(d)) meets an income column: the first loss is absurd, and the
    # first batch was measured in raw units, so the weights are not blamed
    income = "X[:, 0] = 5000.0 + 1000.0 * X[:, 0]  # income, in dollars\ny = np.log1p(y)"
    proc, d = _run(tmp_path, _loop(scale="(1 / d ** 0.5)", data=income).replace(
        "(torch.exp(out) - y[idx] * out)", "((out - y[idx]) ** 2)"))
    assert d is not None, proc.stderr
    assert d["cause"] == "step_size_too_large", d["evidence"]
    assert all(e["rule"] != "D010" for e in d["evidence"]), d["evidence"]
    first = _first_record(tmp_path)
    assert first["input_absmax"] > 5000 and first["grad_norm"] > 0 and first["weight_norm"] > 0


LEAKED = """
import numpy as np
import torch

torch.manual_seed(5)
rng = np.random.default_rng(5)
n, d = 384, 5
X = rng.normal(size=(n, d))
y = (X @ rng.normal(size=d) > 0).astype(np.float64)
X[:, 0] = 3.0 * (2 * y - 1) + 0.5 * rng.normal(size=n)  # recorded after the outcome
X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)

w = (torch.randn(d, 1) / d ** 0.5).requires_grad_()
b = torch.zeros(1, requires_grad=True)
for epoch in range(5):
    perm = torch.randperm(n)
    for start in range(0, n, 64):
        idx = perm[start:start + 64]
        p = torch.sigmoid(X[idx] @ w + b)
        loss = -(y[idx] * torch.log(p) + (1 - y[idx]) * torch.log(1 - p)).mean()
        loss.backward()
        with torch.no_grad():
            for q in (w, b):
                q -= {lr} * q.grad
                q.grad.zero_()
print("done")
"""


def test_a_log_of_zero_right_after_one_big_step_is_the_log_when_an_epsilon_cures_it(tmp_path):
    # the first step moves the weights by many times their norm (lr 7): at update 2 the
    # sigmoid saturates and the log meets 0. The hand-written loop is replayed from before
    # update 1: an epsilon at the log trains at lr 7 (the data are separable: a stable loss
    # just goes to 0), and so does a tenth of the step; the op's cure decides, the step is
    # the alternative
    proc, d = _run(tmp_path, LEAKED.format(lr=7.0))
    assert d is not None, proc.stderr
    assert d["cause"] == "log_of_zero", d["evidence"]
    assert d["first_nonfinite"]["step"] == 2
    runs = {c["change"]: c for c in d["confirmation"] if c.get("scope") == "window"
            and c.get("ran")}  # fmt: skip
    assert runs["control"]["reproduced"] and runs["eps"]["fixed"] and runs["lr_x0.1"]["fixed"]
    assert runs["eps"]["from_step"] == 1
    assert any(a["cause"] == "step_size_too_large" for a in d["alternatives"]), d
    # a tenth of that step trains
    proc, d = _run(tmp_path, LEAKED.format(lr=0.7))
    assert d is not None and d["verdict"] == "healthy", d and d["evidence"]


#: an Adam fit on a ReLU RNN, warm-up and accumulation, as the scenario bench drew it (seed 1172)
ADAM_RNN = """
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(1172)

rng = np.random.default_rng(1172)
n, T, f = 192, 10, 3
X = rng.normal(size=(n, T, f))
y = X[:, -5:, 0].mean(axis=1) + 0.5 * X[:, :, 1].mean(axis=1)

X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(3, 32, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1]).squeeze(1)


model = Net()
opt = torch.optim.Adam(model.parameters(), lr={lr})
loss_fn = nn.MSELoss()
loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda i: min(1.0, (i + 1) / 5))

losses = []
for epoch in range(4):
    for i, (xb, yb) in enumerate(loader):
        out = model(xb)
        loss = loss_fn(out, yb)
        (loss / 2).backward()
        if (i + 1) % 2 == 0:
            opt.step()
            opt.zero_grad()
            sched.step()
        losses.append(loss.item())
    print(f"epoch {{epoch}}: loss {{losses[-1]:.4g}}")
"""


def test_a_gradient_that_climbs_under_adam_is_the_step_size_adam_took(tmp_path):
    # Adam at lr 0.49: the gradient norm climbs 1e9x at update 3, but Adam's step is about lr
    # per weight whatever the gradient's size (clipping does not cure this fit; lr / 100 does)
    proc, d = _run(tmp_path, ADAM_RNN.format(lr=0.49))
    assert d is not None, proc.stderr
    assert d["verdict"] != "healthy" and d["cause"] == "step_size_too_large", d["evidence"]
    assert any(c["cause"] == "exploding_gradients" for c in d["contributing"]) or any(
        a["cause"] == "exploding_gradients" for a in d["alternatives"]), d
    proc, d = _run(tmp_path, ADAM_RNN.format(lr=0.0049))
    assert d is not None and d["verdict"] == "healthy", d and d["evidence"]
