"""The weights a numpy loop hands the Monitor at its first update are the initial ones (the
step comes after ``update``): their scale against a standard initialiser's is evidence about the
initialisation, measured, not guessed from the loss."""

from __future__ import annotations

import numpy as np
import pytest

import nanscope


def _poisson(monitor: nanscope.Monitor, *, scale: float) -> None:
    """Poisson regression by hand (an exp head on counts), minibatches of 32, plain SGD."""
    rng = np.random.default_rng(4)
    n, d = 256, 6
    X = rng.normal(size=(n, d))
    y = rng.poisson(np.exp(0.8 * X @ rng.normal(size=d) / np.sqrt(d))).reshape(-1, 1)
    w = rng.normal(size=(d, 1)) * scale
    b = np.zeros(1)
    with np.errstate(all="ignore"):
        for _ in range(4):
            for start in range(0, n, 32):
                xb, yb = X[start:start + 32], y[start:start + 32]
                z = xb @ w + b
                rate = np.exp(z)
                loss = np.mean(rate - yb * z)
                dz = (rate - yb) / len(xb)
                gw, gb = xb.T @ dz, dz.sum(axis=0)
                monitor.update(loss, params={"w": w, "b": b}, grads={"w": gw, "b": gb},
                               lr=0.05, inputs=xb, targets=yb)  # fmt: skip
                w -= 0.05 * gw
                b -= 0.05 * gb


def test_weights_thirty_times_too_large_are_named_from_their_measured_scale() -> None:
    # randn * 30 on 6 inputs: std(W) * sqrt(fan_in) = 73; exp of the first outputs is absurd
    # and the first step, made of that gradient, throws the weights out
    monitor = nanscope.Monitor(write=False)
    with pytest.raises(nanscope.DivergenceError):
        _poisson(monitor, scale=30.0)
    d = monitor.close()
    assert d.cause == "bad_initialization", d.evidence
    ratio = next(e.data["ratio"] for e in d.evidence if "sqrt(fan_in)" in e.text)
    assert 30 < ratio < 150
    assert d.confidence >= 0.75


def test_the_same_fit_from_a_standard_scale_is_healthy_and_says_nothing_of_the_init() -> None:
    monitor = nanscope.Monitor(write=False)
    _poisson(monitor, scale=1 / np.sqrt(6))
    d = monitor.close()
    assert d.verdict == "healthy"
    scale = monitor.evidence["initial_weight_scale"]
    assert 0.5 < scale["max_ratio"] < 2 and scale["layers"][0]["fan_in"] == 6


#: an MLP under LBFGS at lr 280, as the scenario bench drew it (seed 666): its first step throws
#: the weights 1e13 times past a standard scale, and update 2 breaks
LBFGS_THROWN = """
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(666)

rng = np.random.default_rng(666)
n, d = 384, 12
X = rng.normal(size=(n, d))
y = (X @ rng.normal(size=(d, 3))).argmax(axis=1)

X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)

model = nn.Sequential(
    nn.Linear(12, 32),
    nn.ReLU(),
    nn.Linear(32, 32),
    nn.ReLU(),
    nn.Linear(32, 32),
    nn.ReLU(),
    nn.Linear(32, 3),
)
opt = torch.optim.LBFGS(model.parameters(), lr=280.0, max_iter=5, history_size=10)
loss_fn = nn.CrossEntropyLoss()


def closure():
    opt.zero_grad()
    out = model(X)
    loss = loss_fn(out, y)
    loss.backward()
    return loss


losses = []
for epoch in range(30):
    loss = opt.step(closure)
    losses.append(loss.item())
    print(f"epoch {epoch}: loss {losses[-1]:.4g}")
"""


@pytest.mark.slow
def test_weights_a_step_threw_out_are_no_evidence_of_the_initialisation(tmp_path) -> None:
    # the probes measure the model's weights at the failure of update 2: they are what the first
    # step made (2.8e13 times a standard scale), not what the script initialised
    pytest.importorskip("torch")
    from tests.torch.test_torch_autowatch import _run

    proc, d = _run(tmp_path, LBFGS_THROWN)
    assert d is not None, proc.stderr
    assert d["first_nonfinite"]["step"] == 2
    assert d["cause"] != "bad_initialization", d["evidence"]
    assert not any("sqrt(fan_in)" in e["text"] for e in d["evidence"]), d["evidence"]


#: a regression on a target in its own units (mean 200, sd ~1000), squared error written by hand,
#: an MLP at PyTorch's default initialisation: the first loss is 1.6e7 because of the target, not
#: the weights ({scale} multiplies the initial weights)
RAW_TARGET = """
import numpy as np
import torch
from torch import nn

torch.manual_seed(3)
rng = np.random.default_rng(3)
X = rng.normal(size=(256, 8))
y = X @ rng.normal(size=8) + 0.1 * rng.normal(size=256)
y = {shift} + {spread} * y
X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
with torch.no_grad():
    for p in model.parameters():
        p.mul_({scale})
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
for epoch in range(3):
    for start in range(0, 256, 64):
        out = model(X[start:start + 64])
        loss = ((out - y[start:start + 64]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def _raw_target_fit(tmp_path, **values: float) -> dict:  # type: ignore[type-arg]
    """The fit of ``RAW_TARGET`` under ``nanscope run``, its diagnosis (its first loss above 1e6:
    the case the rules must tell apart)."""
    pytest.importorskip("torch")
    from tests.torch.test_torch_autowatch import _run

    proc, d = _run(tmp_path, RAW_TARGET.format(**values))
    assert d is not None, proc.stderr
    assert d["summary"]["first_loss"] > 1e6
    return d


@pytest.mark.slow
def test_a_target_in_its_own_units_is_no_evidence_of_a_bad_initialisation(tmp_path) -> None:
    # the weights were measured at the first update, at the default scale: the loss of 1e7 is
    # the target's, and the fit is healthy
    d = _raw_target_fit(tmp_path, shift=200.0, spread=1000.0, scale=1.0)
    assert d["cause"] != "bad_initialization", d["evidence"]
    assert d["verdict"] == "healthy", d["evidence"]


@pytest.mark.slow
def test_weights_scaled_up_at_initialisation_are_still_named(tmp_path) -> None:
    # the same fit on a standardised target with its initial weights multiplied by 30: measured
    # far from the default scale, the absurd first loss is the initialisation's
    d = _raw_target_fit(tmp_path, shift=0.0, spread=1.0, scale=30.0)
    assert d["cause"] == "bad_initialization", d["evidence"]
