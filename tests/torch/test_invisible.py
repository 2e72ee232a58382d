"""Nothing of nanscope's on a watched model changes what it does: copies of it (pickle,
``torch.save``, deepcopy) leave the hooks behind, torch's tracers and transforms run as bare, and
the updates around them are still watched (a NaN batch after them is still stopped)."""

from __future__ import annotations

import copy
import io
import math
import pickle
import warnings

import pytest
from torch.func import functional_call, grad, vmap
from torch.utils.checkpoint import checkpoint

import nanscope
import torch
from nanscope.probes import producer
from torch import nn


class Net(nn.Module):
    def __init__(self, ckpt: str | None = None) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)
        self.ckpt = ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        if self.ckpt is None:
            h = self.body(h)
        else:
            h = checkpoint(self.body, h, use_reentrant=self.ckpt == "reentrant")
        return self.head(h)


def _watched(tmp_path, ckpt: str | None = None):
    torch.manual_seed(0)
    model = Net(ckpt)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path / "run")
    return model, opt, watcher


def _fit(model, opt, steps: int, *, nan_at: int | None = None) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    for step in range(1, steps + 1):
        xb = x.clone()
        if step == nan_at:
            xb[5, 2] = math.nan
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), y).backward()
        opt.step()


def _still_watched(model, opt, watcher) -> None:
    """A NaN batch after whatever the test did is still stopped before its step."""
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(nanscope.DivergenceError) as stop:
        _fit(model, opt, 3, nan_at=3)
    assert stop.value.diagnosis.cause == "nonfinite_input"
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    watcher.close()


@pytest.mark.slow
def test_copies_of_a_watched_model_leave_its_hooks_behind(tmp_path) -> None:
    model, opt, watcher = _watched(tmp_path)
    _fit(model, opt, 4)
    assert model._forward_pre_hooks and model._forward_hooks  # watched through its own hooks
    pickled = pickle.loads(pickle.dumps(model))
    deep = copy.deepcopy(model)
    shallow = copy.copy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    with torch.serialization.safe_globals([Net, nn.Sequential, nn.Linear, nn.Tanh]):
        loaded = torch.load(buffer)  # weights_only: nothing but torch's own types in the file
    x = torch.randn(8, 4)
    for other in (pickled, deep, shallow, loaded):
        assert not other._forward_pre_hooks and not other._forward_hooks
        assert torch.equal(other(x), model(x))
    seen = len(watcher.monitor.trace)
    deep_opt = torch.optim.SGD(deep.parameters(), lr=0.05)
    _fit(deep, deep_opt, 3)  # an EMA / a teacher: trained or run, it is not the watched model
    assert len(watcher.monitor.trace) == seen
    assert model._forward_pre_hooks and model._forward_hooks  # the original keeps them
    _still_watched(model, opt, watcher)


@pytest.mark.slow
def test_a_state_dict_round_trip_keeps_the_model_watched(tmp_path) -> None:
    model, opt, watcher = _watched(tmp_path)
    _fit(model, opt, 4)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    assert sorted(model.state_dict()) == sorted(Net().state_dict())
    _fit(model, opt, 2)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    _still_watched(model, opt, watcher)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["script", "trace", "export"])
def test_torch_scripts_traces_and_exports_a_watched_model_as_bare(tmp_path, how) -> None:
    model, opt, watcher = _watched(tmp_path)
    _fit(model, opt, 4)
    x = torch.randn(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (jit is deprecated in torch 2.x)
        if how == "script":
            other = torch.jit.script(model)
        elif how == "trace":
            other = torch.jit.trace(model, x)  # its check_trace compares two traces: no hook
        else:
            other = torch.export.export(model, (x,)).module()
    with torch.no_grad():
        assert torch.allclose(other(x), model(x))
    assert model._forward_pre_hooks and model._forward_hooks  # put back after
    _still_watched(model, opt, watcher)


@pytest.mark.slow
@pytest.mark.parametrize("ckpt", ["reentrant", "non_reentrant"])
def test_activation_checkpointing_recomputes_as_bare_and_its_updates_are_watched(
    tmp_path, ckpt
) -> None:
    model, opt, watcher = _watched(tmp_path, ckpt)
    assert producer.FIRST_UPDATE_WATCH.active  # the first update's ops, around the checkpoints
    _fit(model, opt, 4)  # a different saved-tensor count in the recomputation would raise
    assert [r["step"] for r in watcher.monitor.trace.records] == [1, 2, 3, 4]
    _still_watched(model, opt, watcher)


def test_torch_func_transforms_of_a_watched_model_see_no_nanscope(tmp_path) -> None:
    model, opt, watcher = _watched(tmp_path)
    x, y = torch.randn(16, 4) * 3.0, torch.randn(16, 1)

    def sample_loss(params, xi, yi):
        return nn.functional.mse_loss(functional_call(model, params, (xi[None],)), yi[None])

    assert producer.FIRST_UPDATE_WATCH.active
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        # per-sample gradient norms between the backward and the step (logged, say): the model
        # runs inside vmap on batched stand-ins, the last forward before the step
        params = {k: v.detach() for k, v in model.named_parameters()}
        per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)
        assert per_sample["head.weight"].shape == (16, 1, 8)
        opt.step()
    assert producer.FIRST_UPDATE_WATCH.fault is None  # it read no batched tensor inside vmap
    assert not watcher.guard.faults
    first = watcher.monitor.trace.records[0]
    assert first["input_absmax"] == pytest.approx(float(x.abs().max()))  # the update's batch
    _still_watched(model, opt, watcher)
