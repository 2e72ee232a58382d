"""The producer (first op with finite inputs and a non-finite output), on real fits in-process.

Each test trains a real model under ``nanscope.torch.watch`` (or a numpy fit under a Monitor) until
nanscope stops it, then checks the op, phase, module, source line and the input values it names,
and that the first-update watch leaves nothing behind.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import nanscope

torch = pytest.importorskip("torch")
from torch.overrides import _get_current_function_mode  # noqa: E402

from nanscope.probes import producer  # noqa: E402
from nanscope.torch.watch import watch  # noqa: E402
from torch import nn  # noqa: E402


def _single(entries: list) -> list:  # type: ignore[type-arg]
    """The reruns of the failing update alone (the window replays have scope "window")."""
    return [c for c in entries if c.get("scope") != "window"]

def _marked(located: dict, marker: str) -> None:
    source = located["source"]
    assert source["file"] == __file__
    with open(__file__) as fh:
        line = fh.read().splitlines()[source["line"] - 1]
    assert marker in line, line


def _fit(model, opt, steps, body):  # type: ignore[no-untyped-def]
    monitor = nanscope.Monitor(write=False)
    w = watch(model, opt, monitor=monitor)
    try:
        with pytest.raises(nanscope.DivergenceError) as info:
            for step in range(steps):
                body(step)
    finally:
        w.close()
    assert _get_current_function_mode() is None, "the first-update watch left its mode behind"
    assert not producer.FIRST_UPDATE_WATCH.active
    return info.value.diagnosis


class Rate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 1)
        nn.init.normal_(self.lin.weight, std=40.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.lin(x))  # the exp line


def test_forward_producer_at_update_one_is_exp_with_its_line_and_module() -> None:
    torch.manual_seed(0)
    model = Rate()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    X, counts = torch.randn(32, 8), torch.ones(32, 1)

    def body(step: int) -> None:
        opt.zero_grad()
        rate = model(X)
        (rate - counts * torch.log(rate)).mean().backward()
        opt.step()

    d = _fit(model, opt, 5, body)
    loc = d.located
    assert (loc["op"], loc["phase"], loc["module"], loc["observed"]) == ("exp", "forward", "Rate",
                                                                         True)  # fmt: skip
    assert loc["why"]["kind"] == "past_range" and loc["input_absmax"] > 88
    _marked(loc, "the exp line")
    assert [c["op"] for c in loc["chain"]][:1] == ["log"]  # the log only propagated it
    assert d.cause == "bad_initialization"
    assert not any(a["cause"] == "log_of_zero" for a in d.alternatives)


def test_preprocessing_division_is_the_producer_not_the_rows() -> None:
    torch.manual_seed(0)
    X = torch.randn(64, 4)
    X[:, 2] = 7.0  # a constant column
    y = X[:, :1]
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def body(step: int) -> None:
        xb = X[16 * step : 16 * step + 16]
        xb = (xb - xb.mean(0)) / xb.std(0)  # the standardise line
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), y[16 * step : 16 * step + 16]).backward()
        opt.step()

    d = _fit(model, opt, 4, body)
    loc = d.located
    assert (loc["op"], loc["phase"], loc["why"]["kind"]) == ("div", "preprocess",
                                                             "zero_denominator")  # fmt: skip
    _marked(loc, "the standardise line")
    assert d.cause == "zero_division"
    assert "not read from the data" in " ".join(e.text for e in d.evidence)
    assert not any("Drop or impute" in a for a in d.actions)
    # nonfinite_input defers to the observed producer: a weak alternative at most
    assert all(a["confidence"] <= 0.3 for a in d.alternatives if a["cause"] == "nonfinite_input")
    rows = [c for c in _single(d.confirmation) if c["change"] == "without_rows"]
    assert rows and not rows[0]["ran"] and "column 2" in rows[0]["text"]


def test_a_column_nan_in_every_row_is_not_drop_these_rows_without_a_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NANSCOPE_FIRST_UPDATE", "0")  # no first-update watch: no producer seen
    torch.manual_seed(0)
    X = torch.randn(64, 4)
    X[:, 1] = 3.0
    y = X[:, :1]
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def body(step: int) -> None:
        xb = X[16 * step : 16 * step + 16]
        xb = (xb - xb.mean(0)) / xb.std(0)
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), y[16 * step : 16 * step + 16]).backward()
        opt.step()

    d = _fit(model, opt, 4, body)
    assert d.cause == "nonfinite_input" and d.confidence <= 0.6
    text = " ".join(e.text for e in d.evidence)
    assert "column 1 of the inputs is non-finite in every row (16 of 16)" in text
    assert not any("Drop or impute" in a for a in d.actions)


def test_optimizer_step_producer_from_finite_gradients() -> None:
    torch.manual_seed(0)
    X = torch.randn(32, 5)
    X[:, 3] = 0.0  # its weights get a gradient of exactly 0
    y = X[:, :1]
    model = nn.Linear(5, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=0.0)

    def body(step: int) -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        opt.step()  # the step line

    d = _fit(model, opt, 4, body)
    loc = d.located
    assert loc["phase"] == "optimizer" and loc["op"] == "addcdiv" and loc["observed"]
    assert loc["detected"] in ("weight", "loss") and d.step == 2  # NaN weights: NaN loss too
    _marked(loc, "the step line")
    assert d.cause == "zero_division"
    assert "eps" in d.actions[0]


@pytest.mark.slow
def test_half_squared_error_overflow_is_measured_in_float32() -> None:
    torch.manual_seed(0)
    X = torch.randn(64, 4).half()
    y = (400 + 10 * torch.randn(64, 1)).half()
    model = nn.Linear(4, 1).half()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def body(step: int) -> None:
        opt.zero_grad()
        loss = ((model(X) - y) ** 2).mean()  # the square line
        loss.backward()
        opt.step()

    d = _fit(model, opt, 3, body)
    loc = d.located
    assert (loc["op"], loc["phase"], loc["dtype"]) == ("pow", "loss", "float16")
    _marked(loc, "the square line")
    assert loc["precision"]["limit"] == 65504.0
    assert 65504.0 < loc["precision"]["value"] < 1e6  # finite in float32, past the half range
    assert d.cause == "fp16_overflow"
    f32 = next(c for c in _single(d.confirmation) if c["change"] == "float32")
    assert f32["ran"] and f32["finite"] is True


@pytest.mark.slow
def test_static_loss_scale_is_named_as_the_overflowing_scale() -> None:
    torch.manual_seed(0)
    X = torch.randn(64, 10).half()
    y = torch.randint(0, 3, (64,))
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3)).half()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def body(step: int) -> None:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X).float(), y)
        (loss * 2.0**24).backward()
        opt.step()

    d = _fit(model, opt, 3, body)
    loc = d.located
    assert loc["phase"] == "backward" and loc["dtype"] == "float16" and loc["observed"]
    assert loc["loss_scale"] == 2.0**24
    assert d.cause == "fp16_overflow"
    assert any("loss scale of 2^24" in e.text for e in d.evidence)
    assert d.actions[0].startswith("Drop the fixed loss scale")


def test_without_rows_rerun_makes_a_nan_row_update_finite() -> None:
    torch.manual_seed(0)
    X = torch.randn(32, 3)
    y = X.sum(1, keepdim=True)
    X[5, 1] = float("nan")
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()

    def body(step: int) -> None:
        opt.zero_grad()
        loss_fn(model(X), y).backward()
        opt.step()

    d = _fit(model, opt, 3, body)
    entry = next(c for c in _single(d.confirmation) if c["change"] == "without_rows")
    assert entry["ran"] and entry["finite"] is True and entry["rows"] == [5]
    assert entry["scope"] == "forward, loss and backward"
    assert isinstance(entry["loss"], float)
    lr = next(c for c in _single(d.confirmation) if c["change"] == "lr_x0.1")
    assert lr["finite"] is False and not lr["ran"]
    assert "confirm [without_rows]" in nanscope_report(d)
    assert d.to_dict()["confirmation"] == d.confirmation


def nanscope_report(d: nanscope.Diagnosis) -> str:
    from nanscope.report.terminal import render

    return str(render(d))


def test_a_healthy_first_update_stops_the_watch_after_the_step() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = watch(model, opt, monitor=nanscope.Monitor(write=False))
    assert producer.FIRST_UPDATE_WATCH.active
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    assert not producer.FIRST_UPDATE_WATCH.active and _get_current_function_mode() is None
    assert producer.FIRST_UPDATE_WATCH.result() is None  # nothing was born non-finite
    w.close()


# ---------------------------------------------------------------------------------- numpy


def test_numpy_overflow_is_named_with_numpy_line_and_still_warns() -> None:
    monitor = nanscope.Monitor(write=False)
    w = np.ones(2, np.float32)
    with pytest.raises(nanscope.DivergenceError) as info:
        for step in range(3):
            r = np.array([1.0, 3e19 if step == 2 else 1.0], np.float32)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                loss = float(np.mean(r ** 2))  # the numpy square line
            if step == 2:
                assert any("overflow encountered in square" in str(s.message) for s in seen)
            monitor.update(loss, params={"w": w}, grads={"w": np.zeros(2, np.float32)})
    loc = info.value.diagnosis.located
    assert loc["op"] == "square" and loc["observed"] and loc["why"]["kind"] == "past_range"
    _marked(loc, "the numpy square line")
    assert not any(a["cause"] == "log_of_zero" for a in info.value.diagnosis.alternatives)
    # the confirming experiment: the square recomputed from its operand in float64
    wide = [c for c in _single(info.value.diagnosis.confirmation) if c["change"] == "float64"]
    assert wide and wide[0]["ran"] and wide[0]["finite"], info.value.diagnosis.confirmation
    assert "precision overflow of float32" in wide[0]["text"] and wide[0]["largest"] > 3.4e38


def test_numpy_without_rows_recomputes_the_producer_without_the_extreme_row() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5])).astype(np.float32)
    y[57] = np.float32(4e19)  # a mis-keyed target
    w = np.zeros(3, np.float32)
    monitor = nanscope.Monitor(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(nanscope.DivergenceError) as info:
            for step in range(10):
                idx = np.arange(20 * step, 20 * step + 20)
                Xb, yb = X[idx], y[idx]
                r = Xb @ w - yb
                loss = float(np.mean(r ** 2))
                g = (Xb.T @ r / np.float32(20)).astype(np.float32)
                monitor.update(loss, params={"w": w}, grads={"w": g}, inputs=Xb, targets=yb,
                               index=idx)  # fmt: skip
                w = (w - np.float32(0.1) * g).astype(np.float32)
    d = info.value.diagnosis
    rows = [c for c in _single(d.confirmation) if c["change"] == "without_rows"]
    assert rows and rows[0]["ran"] and rows[0]["finite"] and rows[0]["rows"] == [17], rows
    lr = [c for c in _single(d.confirmation) if c["change"] == "lr_x0.1"]
    assert lr and not lr[0]["ran"] and "no function to rerun" in lr[0]["text"]


def test_numpy_nan_row_gets_honest_not_run_entries() -> None:
    X = np.ones((8, 2))
    X[5, 1] = np.nan
    w = np.zeros(2)
    monitor = nanscope.Monitor(write=False)
    with pytest.raises(nanscope.DivergenceError) as info:
        r = X @ w - 1.0
        monitor.update(float(np.mean(r ** 2)), params={"w": w}, grads={"w": X.T @ r}, inputs=X)
    d = info.value.diagnosis
    assert d.cause == "nonfinite_input"
    changes = {c["change"]: c for c in _single(d.confirmation)}
    assert set(changes) == {"float64", "without_rows", "lr_x0.1"}
    assert not any(c["ran"] for c in _single(d.confirmation))
    assert changes["without_rows"]["rows"] == [5]
    assert "no function to rerun" in changes["without_rows"]["text"]


def test_numpy_errstate_ignore_is_respected_and_gives_no_producer() -> None:
    monitor = nanscope.Monitor(write=False)
    w = np.ones(2, np.float32)
    with pytest.raises(nanscope.DivergenceError) as info:
        for step in range(3):
            r = np.array([1.0, 3e19 if step == 2 else 1.0], np.float32)
            with np.errstate(over="ignore"):
                loss = float(np.mean(r ** 2))
            monitor.update(loss, params={"w": w}, grads={"w": np.zeros(2, np.float32)})
    assert info.value.diagnosis.located is None


def test_a_later_loss_expression_producer_is_recomputed_from_the_live_graph() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).half()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    X = torch.randn(64, 4).half()

    def body(step: int) -> None:
        y = torch.full((64, 1), 400.0 if step == 3 else 1.0).half()  # one batch in the hundreds
        opt.zero_grad()
        loss = ((model(X) - y) ** 2).mean()
        loss.backward()
        opt.step()

    d = _fit(model, opt, 5, body)
    loc = d.located
    assert d.step == 4 and loc["op"] == "pow" and loc["observed"] and loc["dtype"] == "float16"
    assert loc["how"].startswith("the loss's autograd graph")
    assert 65504.0 < loc["precision"]["value"] < 1e6
    assert d.cause == "fp16_overflow"


def test_without_rows_recomputes_a_loss_expression_producer_without_the_extreme_row() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X = torch.randn(16, 3)

    def body(step: int) -> None:
        xb = X.clone()
        if step == 4:
            xb[6, 0] = 1e22  # a sentinel typed into a feature
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), X[:, :1]).backward()  # a functional loss: user code
        opt.step()

    d = _fit(model, opt, 6, body)
    assert d.located["op"] == "mse_loss" and d.located["observed"] and d.step == 5
    entry = next(c for c in _single(d.confirmation) if c["change"] == "without_rows")
    assert entry["rows"] == [6] and entry["finite"] is True
    assert entry["scope"] == "forward, and the producer op recomputed without those rows"
    assert "log_of_zero" not in [d.cause] + [a["cause"] for a in d.alternatives]


def test_the_watch_leaves_the_stack_even_under_a_mode_the_user_pushed_after_it() -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = watch(model, opt, monitor=nanscope.Monitor(write=False))
    with torch.device("cpu"):  # a TorchFunctionMode on top of the watch's
        nn.functional.mse_loss(model(torch.randn(4, 3)), torch.randn(4, 1)).backward()
        opt.step()
        assert torch._C._len_torch_function_stack() == 1  # only the user's is left
    assert _get_current_function_mode() is None
    w.close()


def test_a_replayed_loss_module_producer_gets_the_line_that_called_the_loss() -> None:
    torch.manual_seed(0)
    X = torch.randn(64, 4)
    y = X[:, :1].clone()
    y[40] = 3e20  # a mis-keyed target, in the third batch: its square passes float32's range
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    def body(step: int) -> None:
        xb, yb = X[16 * step : 16 * step + 16], y[16 * step : 16 * step + 16]
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)  # the loss module line
        loss.backward()
        opt.step()

    d = _fit(model, opt, 4, body)
    loc = d.located
    assert loc["op"] == "mse_loss" and loc["step"] == 3 and loc["observed"], loc
    _marked(loc, "the loss module line")
    assert loc["source"]["call"] == "loss module"


@pytest.mark.slow
def test_a_replayed_backward_producer_in_a_torch_module_gets_the_model_call_line() -> None:
    torch.manual_seed(0)
    X = (300 + 100 * torch.randn(64, 16)).half()
    y = torch.randn(64, 1).half()
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 1)).half()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def body(step: int) -> None:
        opt.zero_grad()
        out = model(X)  # the model call line
        nn.functional.mse_loss(out, y).backward()
        opt.step()

    d = _fit(model, opt, 20, body)
    loc = d.located
    assert loc["phase"] == "backward" and d.cause == "fp16_overflow", loc
    _marked(loc, "the model call line")
    assert loc["source"]["call"] == "model"


class HalfMoment(torch.optim.Optimizer):
    """Momentum SGD whose buffer is float16: a gradient past 65504 overflows it."""

    def __init__(self, params, lr: float = 1e-3) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["m"] = torch.zeros_like(p, dtype=torch.float16)
                m = state["m"]
                m.mul_(0.9).add_(p.grad)  # the half buffer line
                p.sub_(group["lr"] * m.float() / m.float().abs().clamp_min(1e-12))


def test_a_float16_optimizer_state_overflow_is_recomputed_in_float32() -> None:
    torch.manual_seed(0)
    X = 1000 * torch.randn(64, 3)
    y = 1e5 * torch.randn(64, 1)
    model = nn.Linear(3, 1)
    opt = HalfMoment(model.parameters(), lr=1e-3)

    def body(step: int) -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        opt.step()

    d = _fit(model, opt, 4, body)
    loc = d.located
    assert loc["phase"] == "optimizer" and loc["op"] == "add" and loc["dtype"] == "float16"
    _marked(loc, "the half buffer line")
    assert d.cause == "fp16_overflow"
    f32 = {c["change"]: c for c in _single(d.confirmation)}["float32"]
    assert f32["ran"] and f32["finite"] and f32["producer_value"] > producer.HALF_MAX
    assert "not rerun" in f32["scope"]


class Standardise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin((x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True))


def test_without_rows_leaves_out_the_rows_the_replayed_producer_broke() -> None:
    torch.manual_seed(0)
    X = torch.randn(160, 16)
    X[70] = 3.0  # a flat row in the third batch: its std is exactly 0
    y = torch.randn(160, 1)
    model = Standardise()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def body(step: int) -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(X[32 * step : 32 * (step + 1)]),
                               y[32 * step : 32 * (step + 1)]).backward()  # fmt: skip
        opt.step()

    d = _fit(model, opt, 5, body)
    assert d.cause == "zero_division" and d.step == 3
    assert d.located["op"] == "div" and d.located["producer_rows"] == [6]
    rerun = {c["change"]: c for c in _single(d.confirmation)}["without_rows"]
    assert rerun["ran"] and rerun["finite"] and rerun["rows"] == [6]
    assert rerun["rows_from"] == "producer"
