"""The training loop's preprocessing of a later update, re-evaluated (``nanscope.probes.loop``):
real fits in-process under ``nanscope.torch.watch``, each with its loop written in the test."""

from __future__ import annotations

import pytest

import nanscope

torch = pytest.importorskip("torch")
from nanscope.torch.watch import watch  # noqa: E402
from torch import nn  # noqa: E402

HOW = "the training loop's preprocessing lines"



def _single(entries: list) -> list:  # type: ignore[type-arg]
    """The reruns of the failing update alone (the window replays have scope "window")."""
    return [c for c in entries if c.get("scope") != "window"]

def _line_of(marker: str) -> int:
    with open(__file__) as fh:
        lines = fh.read().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if marker in line and "_line_of" not in line)


def _counts() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    counts = torch.poisson(torch.full((256, 4), 40.0)) + 1.0
    counts[100, 1] = 0.0  # in the fourth batch of 32
    return counts, torch.randn(256, 1)


@pytest.mark.slow
def test_a_later_log_in_the_loop_is_the_producer_at_its_own_line() -> None:
    counts, y = _counts()
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    w = watch(model, opt, monitor=nanscope.Monitor(write=False))
    try:
        with pytest.raises(nanscope.DivergenceError) as info:
            for step in range(8):
                xb, yb = counts[32 * step : 32 * (step + 1)], y[32 * step : 32 * (step + 1)]
                xb = torch.log(xb)  # the log line
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(xb), yb)
                loss.backward()
                opt.step()
    finally:
        w.close()
    d = info.value.diagnosis
    located = d.located
    assert d.cause == "log_of_zero" and d.step == 4
    assert located["phase"] == "preprocess" and located["op"] == "log" and located["observed"]
    assert HOW in located["how"]
    assert located["source"]["line"] == _line_of("# the log line")
    assert located["why"]["kind"] == "log_domain"
    rerun = {c["change"]: c for c in _single(d.confirmation)}["without_rows"]
    assert rerun["ran"] and rerun["finite"] and rerun["rows"] == [4]


@pytest.mark.slow
def test_a_batch_rebound_from_itself_is_not_re_evaluated() -> None:
    counts, y = _counts()
    batches = [(counts[i : i + 32], y[i : i + 32]) for i in range(0, 256, 32)]
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    w = watch(model, opt, monitor=nanscope.Monitor(write=False))
    try:
        with pytest.raises(nanscope.DivergenceError) as info:
            for xb, yb in batches:
                xb = torch.log(xb)  # the frame now holds the log, not the counts it was made of
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(xb), yb)
                loss.backward()
                opt.step()
    finally:
        w.close()
    located = info.value.diagnosis.located or {}
    assert HOW not in str(located.get("how")), located


PREPARED: list[int] = []


def _prepare(x: torch.Tensor) -> torch.Tensor:
    PREPARED.append(len(PREPARED))
    return torch.log(x)


@pytest.mark.slow
def test_a_user_function_in_the_loop_is_not_called_again() -> None:
    counts, y = _counts()
    PREPARED.clear()
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    w = watch(model, opt, monitor=nanscope.Monitor(write=False))
    try:
        with pytest.raises(nanscope.DivergenceError) as info:
            for step in range(8):
                xb, yb = counts[32 * step : 32 * (step + 1)], y[32 * step : 32 * (step + 1)]
                feats = _prepare(xb)
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(feats), yb)
                loss.backward()
                opt.step()
    finally:
        w.close()
    located = info.value.diagnosis.located or {}
    assert HOW not in str(located.get("how")), located
    assert PREPARED == [0, 1, 2, 3]  # called by the loop only, once per iteration
