"""locate() on TorchFailure objects built by hand: the op, phase, module, inputs and source."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from nanscope.probes.failure import CallSite, TorchFailure  # noqa: E402
from nanscope.probes.locate import locate  # noqa: E402
from torch import nn  # noqa: E402


class Siamese(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(((self.enc(a) - self.enc(b)) ** 2).sum(-1))  # the sqrt line


def test_backward_only_nan_of_sqrt_at_zero_is_named_with_its_line() -> None:
    torch.manual_seed(0)
    model = Siamese()
    a = torch.randn(5, 4)
    b = a + 1.0
    b[1] = a[1]
    found = locate(TorchFailure(model=model, args=(a, b)))["located"]
    assert found["phase"] == "backward"
    assert found["op"] == "SqrtBackward0"
    assert found["module"] == "Siamese"
    assert found["inputs"] == "exactly zero"
    assert found["source"]["file"] == __file__
    with open(__file__) as fh:
        line = fh.read().splitlines()[found["source"]["line"] - 1]
    assert "the sqrt line" in line
    assert model.enc.weight.grad is None  # the replay never writes .grad


def test_forward_division_by_zero_in_the_loss_graph() -> None:
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    x, t = torch.randn(6, 4), torch.randn(6, 4)
    t[4:] = 0  # zero padding
    out = enc(x)
    loss = (1 - (out * t).sum(-1) / (out.norm(dim=-1) * t.norm(dim=-1))).mean()
    found = locate(TorchFailure(model=enc, args=(x,), output=out, loss=loss))["located"]
    assert found["phase"] == "forward"
    assert found["op"] == "div"
    assert found["inputs"] == "exactly zero"


def test_freed_graph_still_names_the_likeliest_op_and_scans_the_backward_function() -> None:
    torch.manual_seed(0)
    enc = nn.Linear(4, 4)
    x = torch.randn(6, 4)

    def step() -> tuple[torch.Tensor, torch.Tensor, CallSite]:
        out = enc(x)
        d = torch.sqrt(((out - out.detach()) ** 2).sum(-1)).mean()
        d.backward()
        import inspect

        return out, d, CallSite(__file__, inspect.currentframe().f_lineno - 3, "step")  # type: ignore[union-attr]

    out, d, site = step()
    found = locate(TorchFailure(model=enc, args=(x,), output=out, loss=d, backward_site=site))
    located = found["located"]
    assert located["phase"] == "backward"
    assert located["op"] == "SqrtBackward0"
    assert "sqrt" in located["source"]["code"]


def test_log_of_an_exact_zero_from_a_saturated_sigmoid() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 1))
    x = torch.randn(8, 4) * 1e4
    p = torch.sigmoid(model(x))
    loss = -torch.log(p).mean()
    found = locate(TorchFailure(model=model, args=(x,), output=p, loss=loss))["located"]
    assert found["op"] == "log"
    assert found["input_zero"] is True


def test_half_precision_overflow_names_the_module_and_dtype() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).half()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(300)
    x = (torch.randn(4, 8) * 10).half()
    found = locate(TorchFailure(model=model, args=(x,)))["located"]
    assert found["phase"] == "forward"
    assert found["dtype"] == "float16"
    assert found["inputs"] == "past the half range"
    assert found["module"] == "2"


def test_nan_input_rows_carry_the_dataset_row() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x = torch.randn(6, 4)
    x[3, 2] = math.nan
    found = locate(TorchFailure(model=model, args=(x,), batch_index=[10, 11, 12, 13, 14, 15],
                                step=7))  # fmt: skip
    assert found["rows"][0]["batch_row"] == 3
    assert found["rows"][0]["dataset_row"] == 13
    assert found["rows"][0]["column"] == 2
    assert found["located"]["inputs"].startswith("non-finite")


def test_bad_init_evidence_activations_and_weight_scale() -> None:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(50)
    found = locate(TorchFailure(model=model, args=(torch.randn(16, 32),)))
    assert found["activations"]["growth"] > 1e6
    assert found["activations"]["rising"] >= 6
    assert found["weight_scale"]["max_ratio"] > 10


def test_buffers_restored_and_rng_replayed() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    before = model[1].running_mean.clone()
    state = torch.get_rng_state()
    locate(TorchFailure(model=model, args=(torch.randn(8, 4),), extra={"rng_state": state}))
    assert torch.equal(model[1].running_mean, before)


def test_a_probe_bug_returns_empty_with_a_warning() -> None:
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    with pytest.warns(RuntimeWarning, match="localisation replay failed"):
        assert locate(TorchFailure(model=Broken(), args=(torch.ones(2),))) == {}


def test_healthy_update_locates_nothing() -> None:
    model = nn.Linear(3, 1)
    found = locate(TorchFailure(model=model, args=(torch.randn(4, 3),)))
    assert "located" not in found
