"""A ``torch.compile``d model under nanscope: training runs, and a failure is still found.

The compiler traces the model's forward hooks, and the process-wide module hooks of the
first-update op watch, into its graph. Reading nanscope's own state there once tripped the
compiler's side-effect tracking and killed the fit at its first forward, and the RNG read of the
forward hook broke the graph (an error under ``fullgraph=True``). ``aot_eager`` traces as the
default backend does but needs no C compiler, so the test runs anywhere.
"""

from __future__ import annotations

import math
import warnings

import pytest

import nanscope
import torch
from nanscope.torch import autowatch
from torch import nn

pytestmark = pytest.mark.slow  # torch.compile: every test compiles graphs


@pytest.fixture(autouse=True)
def _fresh_compiler():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _fit(compiled, model, opt, *, bad_at=None, steps=40):
    torch.manual_seed(1)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    for step in range(1, steps + 1):
        xb = x.clone()
        if step == bad_at:
            xb[3, 1] = math.nan
        opt.zero_grad()
        nn.functional.mse_loss(compiled(xb), y).backward()
        opt.step()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 1))


def _compiled(model, style, fullgraph):
    if style == "wrapper":  # torch.compile(model): a new module around the model
        return torch.compile(model, backend="aot_eager", fullgraph=fullgraph)
    model.compile(backend="aot_eager", fullgraph=fullgraph)  # in place
    return model


@pytest.mark.parametrize("style", ["wrapper", "in_place"])
@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("how", ["watch", "run"])
def test_a_compiled_model_trains_and_its_nan_batch_is_found(tmp_path, how, fullgraph, style):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if how == "watch":
        watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    else:
        nanscope.monitor.set_defaults(root=str(tmp_path))
        autowatch.enable()
    try:
        # fullgraph=True: any graph break nanscope's hooks made would be an error
        compiled = _compiled(model, style, fullgraph)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the compiler's note on global module hooks
            with pytest.raises(nanscope.DivergenceError) as info:
                _fit(compiled, model, opt, bad_at=30)
        found = info.value.diagnosis.to_dict()
        assert (found["cause"], found["step"]) == ("nonfinite_input", 30)
        assert found["rows"][0]["batch_row"] == 3 and found["rows"][0]["column"] == 1
        # where the NaN first appears, from an eager replay of update 30 (a compiled graph
        # would hide its ops), named in the user's model, not in the compiler's wrapper
        assert (found["located"]["op"], found["located"]["module"]) == ("linear", "0")
        assert found["located"]["how"] == "replay of the failing update"
    finally:
        if how == "run":
            autowatch.disarm()
            nanscope.monitor.set_defaults(root=None)
    if how == "watch":
        records = watcher.monitor.trace.records
        assert [r["step"] for r in records] == list(range(1, 31))  # every update, none after


def test_a_healthy_compiled_fit_is_watched_to_the_end(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    compiled = torch.compile(model, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit(compiled, model, opt, steps=40)
    diagnosis = watcher.close()
    assert diagnosis.verdict == "healthy"
    records = watcher.monitor.trace.records
    assert len(records) == 40 and all(math.isfinite(r["loss"]) for r in records)
    assert not watcher.guard.faults  # no hook of the watch was turned off on the way


class _WithLoss(nn.Module):
    """A model that computes its own loss with a loss module (as the Hugging Face models do)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 1))
        self.loss_fn = nn.MSELoss()

    def forward(self, x, y):
        return self.loss_fn(self.net(x), y)


def test_a_loss_module_inside_the_compiled_graph_breaks_nothing(tmp_path):
    model = _WithLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.manual_seed(1)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    with pytest.raises(nanscope.DivergenceError) as info:
        for step in range(1, 41):
            xb = x.clone()
            if step == 25:
                xb[7, 0] = math.inf
            opt.zero_grad()
            compiled(xb, y).backward()
            opt.step()
    found = info.value.diagnosis.to_dict()
    assert (found["cause"], found["step"]) == ("nonfinite_input", 25)
    assert found["rows"][0]["batch_row"] == 7
    assert [r["step"] for r in watcher.monitor.trace.records] == list(range(1, 26))
