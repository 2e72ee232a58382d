"""The gradient the backward sends into the model's output, kept for the replay of a failing
update whose loss is an expression in the training loop (``extra["output_grad"]``)."""

from __future__ import annotations

import pytest

import nanscope

torch = pytest.importorskip("torch")
from nanscope.probes.locate import locate  # noqa: E402
from nanscope.torch import window as window_mod  # noqa: E402
from nanscope.torch.watch import watch  # noqa: E402
from torch import nn  # noqa: E402

SCALE = 2.0**14


class Half(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.half()).float().squeeze(-1)  # the cast line


def _line_of(marker: str) -> int:
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if marker in line and "_line_of" not in line)


def _scaled_fit() -> tuple[object, object]:
    """A float16 body under a static loss scale; a large target at update 19 overflows the cast
    of the output's gradient back to float16 in the backward; the loss is the loop's own."""
    torch.manual_seed(0)
    X = torch.randn(512, 8)
    y = X[:, 0] - 0.5 * X[:, 1] + 0.1 * torch.randn(512)
    y[300] = 40.0
    model = Half()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = watch(model, opt, monitor=nanscope.Monitor(write=False))
    try:
        with pytest.raises(nanscope.DivergenceError) as info:
            for step in range(32):
                xb, yb = X[16 * step : 16 * step + 16], y[16 * step : 16 * step + 16]
                opt.zero_grad()
                loss = ((model(xb) - yb) ** 2).mean()
                (loss * SCALE).backward()
                for p in model.parameters():
                    p.grad.div_(SCALE)
                opt.step()
    finally:
        w.close()
    return info.value.diagnosis, w.failure


def test_a_backward_producer_behind_a_loss_expression_is_found_from_the_kept_gradient() -> None:
    d, failure = _scaled_fit()
    loc = d.located
    assert d.step == 19 and loc["phase"] == "backward" and loc["observed"]
    assert loc["op"] == "ToCopyBackward0" and loc["module"] == "Half" and loc["dtype"] == "float16"
    assert loc["source"]["file"] == __file__
    assert loc["source"]["line"] == _line_of("# the cast line")
    assert loc["precision"]["value"] > 65504 and "sent into" in loc["gradient_at_output"]
    assert d.cause == "fp16_overflow"
    # the kept gradient is the one the backward made, scaled: ones would not reach the limit
    grad = failure.extra["output_grad"]
    assert float(grad.abs().max()) > 65504
    failure.extra.pop("output_grad")
    blind = locate(failure).get("located") or {}
    assert blind.get("op") != "ToCopyBackward0" and not blind.get("observed")


def test_the_window_keeps_a_reference_to_the_output_gradient_until_the_update_is_checked() -> None:
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[torch.Tensor] = []
    w = watch(model, opt, monitor=nanscope.Monitor(write=False))
    try:
        out = model(torch.randn(5, 4))
        out.register_hook(lambda g: seen.append(g))  # the user's own hook sees the same tensor
        (out**2).sum().backward()
        kept = w.window.output_grad
        assert kept is seen[0]  # a reference, not a copy
        opt.step()  # the check of the update ends what the window held of it
        assert w.window.output_grad is None
        with torch.no_grad():
            model(torch.randn(5, 4))  # no graph, no hook
        assert w.window.output_grad is None
    finally:
        w.close()


def test_a_large_output_gets_no_gradient_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(window_mod, "OUTPUT_GRAD_MAX", 9)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = watch(model, opt, monitor=nanscope.Monitor(write=False))
    try:
        model(torch.randn(5, 4)).sum().backward()  # 10 elements: past the limit
        assert w.window.output_grad is None
        model(torch.randn(4, 2 * 2)[:, :4]).sum().backward()  # 8 elements
        assert w.window.output_grad is not None
    finally:
        w.close()
