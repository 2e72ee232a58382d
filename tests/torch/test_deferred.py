"""DeferredReads alone: late reads in one burst, in order, and the verified weights after it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from nanscope.torch.deferred import ACCELERATOR_SYNC_EVERY, DeferredReads  # noqa: E402


def test_the_interval_is_one_on_cpu_and_longer_on_an_accelerator():
    reads = DeferredReads()
    assert reads.interval(torch.device("cpu")) == 1
    assert reads.interval(torch.device("meta")) == 1
    assert reads.interval(torch.device("cuda")) == ACCELERATOR_SYNC_EVERY
    assert DeferredReads(sync_every=4).interval(torch.device("cpu")) == 4


def _fit(reads, model, opt, steps, *, interval, process):
    """A real SGD fit whose per-update vector (loss, grad norm) is read late, in bursts."""
    g = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        x = torch.randn(8, 3, generator=g)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm()
        vec = torch.stack([loss.detach(), grad])
        reads.remember(step, (x,), {}, None, interval)
        if reads.push(step, vec, {"interval": interval}, ("batch", step)):
            reads.drain(process, list(model.parameters()), allow_raise=True)
        opt.step()


def test_a_burst_is_read_in_order_with_the_late_ones_marked_and_the_weights_verified():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reads, seen = DeferredReads(), []

    def process(step, values, ctx, *, batch, late):
        seen.append((step, late, batch, len(values)))

    _fit(reads, model, opt, 8, interval=4, process=process)
    assert [(s, late) for s, late, _, _ in seen] == [
        (1, True), (2, True), (3, True), (4, False),
        (5, True), (6, True), (7, True), (8, False),
    ]  # fmt: skip
    assert all(batch == ("batch", s) and n == 2 for s, _, batch, n in seen)
    assert reads.verified_step == 8 and not reads.pending
    # the snapshot was taken at the read, before update 8's optimizer.step moved the weights
    assert not all(torch.equal(v, p) for v, p in zip(reads.verified, model.parameters()))
    assert reads.batch_at(8) is not None and reads.batch_at(1) is not None  # 64 kept
    replay = reads.replay_from()
    assert replay["step"] == 8 and replay["batches"] == []
    verified = [v.clone() for v in reads.verified]
    assert reads.restore(list(model.parameters()))
    assert all(torch.equal(v, p) for v, p in zip(verified, model.parameters()))


def test_a_stop_inside_a_burst_leaves_the_last_verified_weights_and_the_batches_since():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reads = DeferredReads()

    def process(step, values, ctx, *, batch, late):
        if step == 6:
            raise FloatingPointError("stop at 6")

    with pytest.raises(FloatingPointError):
        _fit(reads, model, opt, 8, interval=4, process=process)
    assert reads.verified_step == 4  # the burst of 5..8 was not clean: no new snapshot
    assert [s for s, _, _ in reads.replay_from()["batches"]] == [5, 6, 7, 8]
    args, kwargs, targets = reads.batch_at(6)
    assert args[0].shape == (8, 3) and kwargs == {} and targets is None


def test_closing_ends_a_failing_burst_quietly_and_every_update_keeps_only_its_own_batch():
    reads = DeferredReads()

    def process(step, values, ctx, *, batch, late):
        raise FloatingPointError

    reads.push(1, torch.zeros(2), {"interval": 4}, None)
    reads.drain(process, [], allow_raise=False)  # no raise
    assert not reads.pending and reads.verified is None and not reads.restore([])
    for step in (1, 2, 3):
        reads.remember(step, (), {}, None, 1)
    assert [s for s, *_ in reads.recent] == [3]
