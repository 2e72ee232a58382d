"""watch(): real tiny models and real optimizers; each test asserts what would break."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import nanscope  # noqa: E402
from nanscope.errors import UsageError  # noqa: E402
from nanscope.torch.watch import FULL_EVERY  # noqa: E402


def _data(n=64, d=4, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * scale
    y = x @ torch.randn(d, 1, generator=g)
    return x, y


def _mlp(seed=0, d=4):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 8), nn.Tanh(), nn.Linear(8, 1))


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_diverging_sgd_stops_before_nan_reaches_weights(tmp_path):
    x, y = _data(scale=10.0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    loss_fn = nn.MSELoss()
    with pytest.raises(nanscope.DivergenceError) as info:
        for _ in range(200):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
    assert info.value.diagnosis.cause == "step_size_too_large"
    assert watcher.step < 30
    for value in model.state_dict().values():
        assert torch.isfinite(value).all()
    saved = torch.load(tmp_path / "last_good.pt", weights_only=True)
    assert watcher.monitor.meta["last_good"] == str(tmp_path / "last_good.pt")
    for name, value in model.state_dict().items():
        assert torch.equal(saved[name], value)
    rec = watcher.monitor.trace.records[-1]
    assert rec["lr"] == 0.5
    assert rec["flip_frac"] >= 0.0 and rec["update_cos"] < 0
    assert set(rec["grad_norms"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_measures_match_a_plain_reference():
    x, y = _data()
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watcher = nanscope.watch(model, opt, policy="warn", every=1)
    prev_w = prev_g = None
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        w = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        loss = float(nn.functional.mse_loss(model(x), y))
        opt.step()
        rec = watcher.monitor.trace.records[-1]
        assert math.isclose(rec["loss"], loss, rel_tol=1e-5)
        assert math.isclose(rec["grad_norm"], float(g.norm()), rel_tol=1e-5)
        assert math.isclose(rec["weight_norm"], float(w.norm()), rel_tol=1e-5)
        if prev_w is not None:
            u = w - prev_w
            assert math.isclose(rec["update_norm"], float(u.norm()), rel_tol=1e-4)
            cos = float(u @ prev_g / (u.norm() * prev_g.norm()))
            assert math.isclose(rec["update_cos"], cos, abs_tol=1e-4)
            assert rec["update_cos"] < -0.99  # plain SGD steps against the gradient
        prev_w, prev_g = w, g


@pytest.mark.slow
def test_default_thins_only_the_full_measures():
    x, y = _data()
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watcher = nanscope.watch(model, opt, policy="warn")
    for _ in range(2 * FULL_EVERY + 1):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    records = watcher.monitor.trace.records
    full = [r["step"] for r in records if "weight_norm" in r]
    assert full == [1, FULL_EVERY + 1, 2 * FULL_EVERY + 1]
    assert [r["step"] for r in records if "grad_norms" in r] == full
    assert [r["step"] for r in records if "input_absmax" in r] == full
    # the loss and the gradient norm are on every update
    assert all("loss" in r and "grad_norm" in r and r["nf_grads"] == 0 for r in records)
    # the sampled cosines on the update after each full one, and over any run of rising losses
    sampled = [r["step"] for r in records if "update_cos" in r and "flip_frac" in r]
    assert {2, FULL_EVERY + 2} <= set(sampled)
    for a, b, c in zip(records, records[1:], records[2:]):
        if b["loss"] > a["loss"] and c["loss"] > b["loss"]:
            assert "update_cos" in c and "grad_cos" in c


def test_nan_in_a_batch_stops_at_that_update(tmp_path):
    x, y = _data(n=64)
    x[37, 1] = float("nan")
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    before = None
    with pytest.raises(nanscope.DivergenceError) as info:
        for i in range(0, 64, 16):
            before = _params(model)
            opt.zero_grad()
            nn.functional.mse_loss(model(x[i : i + 16]), y[i : i + 16]).backward()
            opt.step()
    assert watcher.step == 3  # rows 32..47 are the third batch
    assert info.value.diagnosis.cause == "nonfinite_input"
    for name, value in model.state_dict().items():
        assert torch.equal(before[name], value)
    rec = watcher.monitor.trace.records[-1]
    assert rec["nf_inputs"] == 1
    rows = info.value.diagnosis.rows
    assert any(r.get("batch_row") == 5 for r in rows)
    assert watcher.failure is not None and watcher.failure.step == 3
    assert watcher.failure.args[0] is not None and torch.isnan(watcher.failure.args[0]).any()


def test_lbfgs_closure_checked_inside_the_closure(tmp_path):
    x, y = _data()
    model = _mlp()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    poison = {"on": False}

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if poison["on"]:
            loss = loss * float("nan")
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    assert watcher.step == 3
    assert all(math.isfinite(r["loss"]) for r in watcher.monitor.trace.records)
    good = _params(model)
    poison["on"] = True
    with pytest.raises(nanscope.DivergenceError):
        opt.step(closure)
    assert watcher.step == 4
    for name, value in model.state_dict().items():
        assert torch.equal(good[name], value)


@pytest.mark.slow
def test_adam_closure_loss_comes_from_the_closure():
    x, y = _data()
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watcher = nanscope.watch(model, opt, policy="warn")
    losses = []

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(float(loss))
        return loss

    for _ in range(4):
        opt.step(closure)
    got = [r["loss"] for r in watcher.monitor.trace.records]
    assert got == pytest.approx(losses, rel=1e-6)


def test_gradient_accumulation_one_record_per_step():
    x, y = _data(n=64)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, policy="warn")
    for step in range(3):
        opt.zero_grad()
        micro = []
        for k in range(4):
            xb = x[k * 16 : (k + 1) * 16]
            yb = y[k * 16 : (k + 1) * 16]
            loss = nn.functional.mse_loss(model(xb), yb)
            (loss / 4).backward()
            micro.append(float(loss) / 4)
        opt.step()
        rec = watcher.monitor.trace.records[-1]
        assert rec["step"] == step + 1
        # the loss whose gradient the step applied: the batch's loss, as the script would log it
        assert rec["loss"] == pytest.approx(sum(micro), rel=1e-5)
        assert rec["extra"]["micro_batches"] == 4
    assert len(watcher.monitor.trace) == 3


def test_param_groups_scheduler_and_clip():
    x, y = _data()
    model = _mlp()
    opt = torch.optim.SGD(
        [
            {"params": model[0].parameters(), "lr": 0.1},
            {"params": model[2].parameters(), "lr": 0.01},
        ],
        lr=0.1,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    watcher = nanscope.watch(model, opt, policy="warn")
    pre = []
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        pre.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)))
        opt.step()
        sched.step()
    recs = watcher.monitor.trace.records
    assert [r["lr"] for r in recs] == pytest.approx([0.1, 0.05, 0.025])
    assert [r["grad_norm"] for r in recs] == pytest.approx(pre, rel=1e-5)
    assert all(r["extra"]["grad_norm_source"] == "pre_clip" for r in recs)
    assert all(r["extra"]["grad_norm_clipped"] == pytest.approx(1e-3, rel=1e-3) for r in recs)
    assert len(recs[0]["grad_norms"]) == 4


def test_custom_optimizer_subclass():
    class SignSGD(torch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad.sign(), alpha=-group["lr"])

    x, y = _data()
    model = _mlp()
    opt = SignSGD(model.parameters(), lr=1e-3)
    watcher = nanscope.watch(model, opt, policy="warn")
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert len(watcher.monitor.trace) == 3
    assert watcher.monitor.trace.records[-1]["lr"] == 1e-3


@pytest.mark.slow
def test_gradscaler_skips_are_events_and_collapse_fires(tmp_path):
    if not hasattr(torch.amp, "GradScaler"):
        pytest.skip("no torch.amp.GradScaler")
    try:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=1000)
    except Exception:
        pytest.skip("GradScaler('cpu') not available")
    if not scaler.is_enabled():
        pytest.skip("GradScaler('cpu') disabled")
    x, y = _data()
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    inf_grad = {"on": False}

    def step():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if inf_grad["on"]:
            model[0].weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()

    for _ in range(2):
        step()
    recs = watcher.monitor.trace.records
    assert recs[-1]["extra"]["loss_scale"] == 16.0
    assert recs[-1]["loss"] == pytest.approx(float(nn.functional.mse_loss(model(x), y)), rel=0.2)
    inf_grad["on"] = True
    step()  # one skipped step: recorded, not a failure
    rec = watcher.monitor.trace.records[-1]
    assert rec["events"] == ["skipped_step"] and rec["extra"]["loss_scale"] == 16.0
    assert watcher.monitor.alarm is None
    with pytest.raises(nanscope.DivergenceError):
        for _ in range(40):
            step()
    rec = watcher.monitor.trace.records[-1]
    assert "loss_scale_collapse" in rec["events"]
    assert rec["extra"]["loss_scale"] < 1e-4 or rec["extra"]["consecutive_skips"] >= 25
    assert watcher.failure is not None and watcher.failure.grad_scaler is scaler


def test_a_fault_in_a_hook_is_swallowed(monkeypatch):
    x, y = _data()
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = nanscope.watch(model, opt)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(watcher, "check", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    texts = [str(w.message) for w in caught if "internal error" in str(w.message)]
    assert len(texts) == 1 and "Please report" in texts[0] and "boom" in texts[0]
    assert "step" in watcher.guard.off
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_frozen_params_and_params_without_grads():
    x, y = _data()
    model = _mlp()
    model[0].weight.requires_grad_(False)
    unused = nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([*model.parameters(), unused], lr=1e-2)
    watcher = nanscope.watch(model, opt, policy="warn")
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    rec = watcher.monitor.trace.records[0]  # a full update (per-name norms)
    assert set(rec["grad_norms"]) == {"0.bias", "2.weight", "2.bias"}
    for rec in watcher.monitor.trace.records:
        assert rec["nf_grads"] == 0 and math.isfinite(rec["grad_norm"])


def test_meta_device_model_does_not_crash():
    with torch.device("meta"):
        model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watcher = nanscope.watch(model, opt, policy="warn")
        out = model(torch.randn(3, 4, device="meta"))
        out.sum().backward()
        opt.step()
    assert any("meta device" in str(w.message) for w in caught)
    assert not any("internal error" in str(w.message) for w in caught)
    assert len(watcher.monitor.trace) == 1


def test_sparse_and_complex_params():
    emb = nn.Embedding(10, 3, sparse=True)
    z = nn.Parameter(torch.randn(4, dtype=torch.complex64))
    opt = torch.optim.SGD([*emb.parameters(), z], lr=0.1)
    model = nn.ModuleDict({"emb": emb})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watcher = nanscope.watch(model, opt, policy="warn")
        for _ in range(2):
            opt.zero_grad()
            loss = emb(torch.tensor([1, 2, 3])).sum() + (z.abs() ** 2).sum()
            loss.backward()
            opt.step()
    assert not any("internal error" in str(w.message) for w in caught)
    rec = watcher.monitor.trace.records[-1]
    assert rec["nf_grads"] == 0 and rec["grad_norm"] > 0
    assert any("complex" in n for n in watcher.notes)


def test_bad_arguments_are_usage_errors():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UsageError, match=r"model must be a torch\.nn\.Module"):
        nanscope.watch(object(), opt)
    with pytest.raises(UsageError, match=r"optimizer must be a torch\.optim\.Optimizer"):
        nanscope.watch(model, "adam")
    with pytest.raises(UsageError, match="every"):
        nanscope.watch(model, opt, every=0)


def test_rollback_skips_the_bad_update():
    x, y = _data()
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, policy="rollback")
    for i in range(4):
        opt.zero_grad()
        xb = x.clone()
        if i == 2:
            xb[0, 0] = float("inf")
        before = _params(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nn.functional.mse_loss(model(xb), y).backward()
            opt.step()
        if i == 2:
            for name, value in model.state_dict().items():
                assert torch.equal(before[name], value)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert watcher.monitor.alarm is None


def test_rollback_recovers_a_run_with_one_poisoned_batch_and_reports_it(tmp_path):
    x, y = _data(n=640)
    x[16 * 7 + 5, 2] = float("nan")  # one bad row, in batch 8
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)
    watcher = nanscope.watch(model, opt, policy="rollback", run_dir=tmp_path)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(40):
            batch = slice((i % 40) * 16, (i % 40 + 1) * 16)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[batch]), y[batch])
            loss.backward()
            opt.step()
            scheduler.step()
            losses.append(float(loss))
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the NaN never landed
    # a bad row: the batch is skipped, the lr kept (a smaller step cannot help a NaN row)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    monitor = watcher.monitor
    assert [r["step"] for r in monitor.rollbacks] == [8]
    entry = monitor.rollbacks[0]
    assert entry["cause"] == "nonfinite_input" and entry["rows"][0]["batch_row"] == 5
    assert "batch row 5, column 2 = nan" in entry["action"] and "lr unchanged" in entry["action"]
    diagnosis = watcher.close()
    assert diagnosis.extra["rollbacks"][0]["step"] == 8
    # the final advice still names the row it skipped
    assert diagnosis.cause == "nonfinite_input" and diagnosis.rows[0]["batch_row"] == 5
    # the trace on disk says what was done at that update
    trace = nanscope.read_trace(tmp_path / "trace.jsonl")
    marked = [r for r in trace if "rollback" in (r.get("events") or [])]
    assert [r["step"] for r in marked] == [8] and marked[0]["extra"]["rollback"]["action"]
    assert losses[-1] < losses[0]  # and the fit went on descending


def test_rollback_cuts_the_lr_of_a_step_size_and_says_it_in_one_line(tmp_path, capsys):
    x, y = _data(n=256, scale=10.0)  # a step too long for these features: it diverges
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, policy="rollback", run_dir=tmp_path)
    for i in range(60):
        batch = slice((i % 16) * 16, (i % 16 + 1) * 16)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        opt.step()
    recoveries = watcher.monitor.rollbacks
    assert recoveries and recoveries[0]["cause"] == "step_size_too_large"
    assert recoveries[0]["lr_before"] == 0.05 and recoveries[0]["lr_after"] == pytest.approx(0.005)
    assert opt.param_groups[0]["lr"] < 0.05
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "recovered" in ln]
    assert len(lines) == len(recoveries)  # one line per recovery, no warning beside it
    assert "cut the lr tenfold (0.05 -> 0.005)" in lines[0]
    watcher.close()


def test_deferred_reads_find_the_exact_update_and_restore(tmp_path):
    """The accelerator path (sync_every > 1), exercised on CPU."""
    x, y = _data(n=160)
    x[16 * 6 + 3, 0] = float("nan")  # batch 7
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path, sync_every=4)
    snapshots = {}
    with pytest.raises(nanscope.DivergenceError):
        for i in range(10):
            snapshots[i + 1] = _params(model)
            opt.zero_grad()
            batch = slice(i * 16, (i + 1) * 16)
            nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            opt.step()
    assert watcher.monitor.alarm.step == 7
    assert watcher.step == 8  # read at update 8: one late
    assert watcher.failure.step == 7
    assert torch.isnan(watcher.failure.args[0]).any()
    saved = torch.load(tmp_path / "last_good.pt", weights_only=True)
    for _name, value in saved.items():
        assert torch.isfinite(value).all()


def test_a_nan_loss_is_located_from_its_live_graph(tmp_path, monkeypatch):
    # at update 1 the first-update op watch would see the div first: this is the later-update path
    monkeypatch.setenv("NANSCOPE_FIRST_UPDATE", "0")
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path)
    x = torch.randn(4, 8)
    t = torch.randn(4, 8)
    t[2] = 0.0  # a padded position: its target is the zero vector
    with pytest.raises(nanscope.DivergenceError) as info:
        opt.zero_grad()
        o = model(x)
        cos = (o * t).sum(-1) / (o.norm(dim=-1) * t.norm(dim=-1))  # 0/0 on the padding
        (1 - cos).mean().backward()
        opt.step()
    assert watcher.step == 1
    located = info.value.diagnosis.located
    assert located["from"] == "live graph" and located["op"] == "div"
    assert located["inputs"] == "exactly zero" and not located.get("guessed")
    assert located["source"]["code"].startswith("cos = (o * t)")


@pytest.mark.slow
def test_a_stop_during_warm_up_names_the_optimizers_lr_and_the_adam_advice(tmp_path):
    """The live diagnosis reads what the watcher put in the Monitor's meta (the optimizer), and
    a run stopped in its warm-up is told to cut the lr it was built with, not the one reached."""
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = x @ torch.randn(16, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=30.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / 200))
    watcher = nanscope.watch(model, opt, policy="raise", run_dir=tmp_path)
    with pytest.raises(nanscope.DivergenceError) as info:
        for _ in range(200):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            sched.step()
    d = info.value.diagnosis
    assert d.cause == "step_size_too_large"
    assert watcher.step < 200  # stopped inside the warm-up
    assert "the optimizer's lr 30 -> 3" in d.actions[0]
    assert any("adaptive optimizer" in a for a in d.actions)
