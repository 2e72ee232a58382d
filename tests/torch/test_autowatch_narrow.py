"""``nanscope run``'s global module hooks run on every submodule call; once each watcher has its
model they give way to the model's own forward hooks, and come back for an optimizer made later."""

from __future__ import annotations

import math
import warnings

import pytest

import nanscope
import torch
from nanscope.torch import autowatch
from nanscope.torch.records import FULL_EVERY
from torch import nn


@pytest.fixture
def armed(tmp_path):
    nanscope.monitor.set_defaults(root=str(tmp_path))
    autowatch.enable()
    try:
        yield
    finally:
        autowatch.disarm()
        nanscope.monitor.set_defaults(root=None)


def _model():
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
                         nn.Linear(8, 1))  # fmt: skip


def _steps(model, opt, x, y, n):
    for _ in range(n):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


@pytest.mark.slow
def test_the_global_module_hooks_go_once_the_model_is_known(armed):
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    _steps(model, opt, x, y, 1)
    assert autowatch._MODULE_HANDLES  # looking for the model
    _steps(model, opt, x, y, 2)
    assert not autowatch._MODULE_HANDLES
    (watcher,) = autowatch.watchers()
    assert watcher.model is model and watcher.model_hooked
    _steps(model, opt, x, y, FULL_EVERY - 2)  # update FULL_EVERY + 1 is a full one: its batch
    records = watcher.monitor.trace.records
    assert [r["step"] for r in records] == list(range(1, FULL_EVERY + 2))
    assert records[FULL_EVERY]["input_absmax"] == pytest.approx(float(x.abs().max()))


@pytest.mark.slow
def test_a_nan_batch_after_the_narrowing_is_still_found_with_its_row(armed):
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    _steps(model, opt, x, y, 5)
    assert not autowatch._MODULE_HANDLES
    bad = x.clone()
    bad[7, 2] = math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(nanscope.DivergenceError) as info:
            _steps(model, opt, bad, y, 1)
    diagnosis = info.value.diagnosis
    assert diagnosis.cause == "nonfinite_input"
    assert diagnosis.step == 6
    assert any(r.get("batch_row") == 7 and r.get("column") == 2 for r in diagnosis.rows), \
        diagnosis.rows


def test_an_optimizer_made_after_the_narrowing_still_finds_its_model(armed):
    torch.manual_seed(0)
    first, second = _model(), _model()
    opt1 = torch.optim.SGD(first.parameters(), lr=0.01)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    _steps(first, opt1, x, y, 3)
    assert not autowatch._MODULE_HANDLES
    opt2 = torch.optim.Adam(second.parameters(), lr=1e-3)
    _steps(second, opt2, x, y, 1)
    assert autowatch._MODULE_HANDLES  # back on: the new optimizer's model is not known yet
    _steps(second, opt2, x, y, 3)
    watchers = {w.optimizer: w for w in autowatch.watchers()}
    assert watchers[opt2].model is second
    assert not autowatch._MODULE_HANDLES


def test_a_script_that_watches_its_optimizer_itself_gets_no_second_watcher(armed, tmp_path):
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    own = nanscope.watch(model, opt, run_dir=tmp_path / "own")
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    _steps(model, opt, x, y, 5)
    assert autowatch.watchers() == []
    assert [r["step"] for r in own.monitor.trace.records] == [1, 2, 3, 4, 5]
    own.close()


def test_an_lbfgs_script_that_watches_itself_is_not_taken_for_a_hand_loop(armed, tmp_path):
    """LBFGS moves the weights between the backward calls of one step: under nanscope run with
    the script's own watch, no second (hand-update) watcher may take its NaN."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    own = nanscope.watch(model, opt, run_dir=tmp_path / "own")
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    poison = {"on": False}

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y) * (math.nan if poison["on"] else 1.0)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    poison["on"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(nanscope.DivergenceError):
            opt.step(closure)
    assert own.step == 4 and autowatch.watchers() == []
