"""LastGood alone: the saved last good weights and the rollback of one bad update."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from nanscope.detectors import Alarm  # noqa: E402
from nanscope.monitor import Monitor  # noqa: E402
from nanscope.torch.deferred import DeferredReads  # noqa: E402
from nanscope.torch.rollback import ROLLBACK_LIMIT, ROLLBACK_LR_FACTOR, LastGood  # noqa: E402

ALARM = Alarm("nonfinite", 3, "non-finite loss at update 3", {"what": ["loss"]})


def _fit(steps=2, lr=0.1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 3)).pow(2).mean().backward()
        opt.step()
    return model, opt


def test_save_writes_the_models_weights_as_they_are(tmp_path):
    model, _ = _fit()
    monitor = Monitor(run_dir=tmp_path)
    last = LastGood(monitor)
    notes = last.save(model, list(model.parameters()), {"step": 3}, ALARM, DeferredReads())
    assert notes == [] and last.path == tmp_path / "last_good.pt"
    saved = torch.load(last.path, weights_only=True)
    for name, value in model.state_dict().items():
        assert torch.equal(saved[name], value)
    assert monitor.meta["last_good"] == str(last.path) and monitor.meta["last_good_step"] == 2


def test_nonfinite_weights_are_not_saved_and_say_why(tmp_path):
    model, _ = _fit()
    with torch.no_grad():
        model[0].weight[0, 0] = math.nan
    last = LastGood(Monitor(run_dir=tmp_path))
    notes = last.save(model, list(model.parameters()), {"step": 3}, ALARM, DeferredReads())
    assert notes and "non-finite" in notes[0] and last.path is None
    assert not (tmp_path / "last_good.pt").exists()


def test_after_a_late_stop_the_verified_weights_are_put_back_first(tmp_path):
    model, opt = _fit(steps=1)
    reads = DeferredReads()
    reads.verified = [p.detach().clone() for p in model.parameters()]
    reads.verified_step = 1
    verified = [v.clone() for v in reads.verified]
    for _ in range(2):  # two more updates the late read judged only afterwards
        opt.zero_grad()
        model(torch.randn(8, 3)).pow(2).mean().backward()
        opt.step()
    monitor = Monitor(run_dir=tmp_path)
    LastGood(monitor).save(model, list(model.parameters()), {"step": 3, "late": True}, ALARM,
                           reads)  # fmt: skip
    assert all(torch.equal(v, p) for v, p in zip(verified, model.parameters()))
    assert monitor.meta["last_good_step"] == 1 and monitor.meta["last_good_restored"]


def test_rollback_drops_the_gradients_and_cuts_the_lr_up_to_the_limit():
    model, opt = _fit(lr=0.5)
    opt.param_groups[0]["initial_lr"] = 0.5
    last = LastGood(Monitor(write=False))
    params = list(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the Monitor says it, in one line: no warning here
        for i in range(ROLLBACK_LIMIT):
            opt.zero_grad()
            model(torch.randn(8, 3)).pow(2).mean().backward()
            alarm = Alarm("nonfinite", 3 + i, "non-finite loss", {})
            before = opt.param_groups[0]["lr"]
            assert last.rollback(opt, params, {"step": 3 + i}, alarm)
            assert all(p.grad is None for p in params)
            assert alarm.data["lr_before"] == before
            assert alarm.data["lr_after"] == pytest.approx(before * ROLLBACK_LR_FACTOR)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * ROLLBACK_LR_FACTOR**ROLLBACK_LIMIT)
    assert opt.param_groups[0]["initial_lr"] == opt.param_groups[0]["lr"]
    assert not last.rollback(opt, params, {"step": 9}, ALARM)  # the limit: the next one stops


def test_a_bad_row_skips_the_batch_and_keeps_the_lr():
    model, opt = _fit(lr=0.5)
    last = LastGood(Monitor(write=False))
    params = list(model.parameters())
    for i in range(ROLLBACK_LIMIT + 2):  # skips are not lr cuts: the cut's limit is not spent
        opt.zero_grad()
        model(torch.randn(8, 3)).pow(2).mean().backward()
        alarm = Alarm("nonfinite", 3 + i, "non-finite loss", {"lr_factor": 1.0})
        assert last.rollback(opt, params, {"step": 3 + i}, alarm)
        assert all(p.grad is None for p in params) and "lr_before" not in alarm.data
    assert opt.param_groups[0]["lr"] == 0.5 and last.skips == ROLLBACK_LIMIT + 2


def test_no_rollback_after_a_late_stop_or_with_nonfinite_weights():
    model, opt = _fit()
    last = LastGood(Monitor(write=False))
    params = list(model.parameters())
    assert not last.rollback(opt, params, {"step": 3, "late": True}, ALARM)
    assert not last.rollback(opt, params, {"step": 3, "nf_params": True}, ALARM)
    assert last.rollbacks == 0 and opt.param_groups[0]["lr"] == 0.1
