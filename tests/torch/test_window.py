"""StepWindow alone: what one step's hooks leave behind, read the way the check reads it."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from nanscope.torch.window import StepWindow, pick_input  # noqa: E402


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


def _never(tensor, site):
    raise AssertionError("a finite loss needs no live-graph read")


def test_micro_batches_give_the_summed_loss_and_a_scale_divides_it():
    model, window = _model(), StepWindow()
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    losses = []
    for part in (slice(0, 4), slice(4, 8)):  # two micro-batches, one step
        loss = nn.functional.mse_loss(model(x[part]), y[part])
        window.on_backward(loss, None, None, _never)
        loss.backward()
        losses.append(float(loss.detach()))
    assert window.micro == 2
    # the loss whose gradient the step applies: the sum of what backward() was called on
    assert float(window.loss()) == pytest.approx(sum(losses))
    scale = torch.tensor(8.0)
    assert float(window.loss(None, scale)) == pytest.approx(sum(losses) / 8)
    window.reset()
    assert window.micro == 0 and window.loss() is None
    closure_loss = torch.tensor(3.0)  # no backward seen: what step(closure) returned
    assert float(window.loss(closure_loss)) == 3.0


def test_a_nonfinite_cpu_loss_is_inspected_while_its_graph_is_alive():
    model, window = _model(), StepWindow()
    x = torch.randn(4, 3)
    x[1, 0] = math.nan
    seen = []
    loss = model(x).mean()
    window.on_backward(loss, None, None, lambda t, site: seen.append(t))
    assert seen == [loss] and window.last_loss is loss


def test_targets_come_from_the_loss_module_then_keywords_then_the_callback():
    window = StepWindow()
    x, y, labels, given = torch.randn(4, 3), torch.randn(4, 1), torch.randn(4, 1), torch.ones(4, 1)
    window.on_batch(x, given)
    assert window.targets() is given
    window.on_forward((), {"x": x, "labels": labels}, rng=False)
    assert window.targets() is labels and window.inputs() is x
    window.on_loss_module(nn.MSELoss(), (torch.randn(4, 1),), {"target": y})
    assert window.targets() is y


def test_the_input_is_the_first_float_argument_else_a_known_keyword():
    ids, x = torch.arange(4), torch.randn(4, 3)
    assert pick_input((ids, x), {}) is x
    assert pick_input((ids,), {}) is ids
    assert pick_input((), {"pixel_values": x}) is x
    window = StepWindow()
    window.on_batch(x, None)
    assert window.inputs() is x  # nothing from a forward: the callback's batch


def test_forward_keeps_the_cpu_rng_state_and_rows_must_fit_the_batch():
    window, x = StepWindow(), torch.randn(4, 3)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    window.on_forward((x,), {}, "out", rng=True)
    assert torch.equal(window.rng, state) and window.output == "out"
    window.on_forward((x,), {}, rng=False)
    assert window.rng is None
    window.index = [10, 11, 12, 13]
    assert window.rows_of(x) == [10, 11, 12, 13]
    window.index = [10, 11]
    assert window.rows_of(x) is None  # rows for another batch: not this one's


def test_a_probed_forward_says_whether_the_forward_draws_from_the_rng():
    x = torch.randn(4, 3)
    for drop, used in ((nn.Dropout(0.5), True), (nn.Identity(), False)):
        model, window = nn.Sequential(nn.Linear(3, 3), drop), StepWindow()
        window.on_forward((x,), {}, rng=True, probe=True)
        window.output = model(x)
        window.probe_rng()
        assert window.rng_used is used
        window.on_forward((x,), {}, rng=True, probe=False)
        # kept where a replay needs it; a forward that draws nothing is replayed without it
        assert (window.rng is not None) is used


def test_clip_keeps_the_pre_clip_norm_and_reset_keeps_the_batch():
    model, window = _model(), StepWindow()
    x = torch.randn(8, 3)
    window.on_forward((x,), {}, rng=False)
    model(x).pow(2).mean().mul(100).backward()
    total = nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    window.on_clip(total)
    assert float(window.clip_norm) == pytest.approx(float(total)) and float(total) > 0.1
    window.reset()
    assert window.clip_norm is None and window.inputs() is x
