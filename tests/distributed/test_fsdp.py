"""FSDP2 (``fully_shard``, DTensor parameters) under torchrun: 2 CPU ranks on gloo.

Each torchrun test launches ``python -m torch.distributed.run --nproc-per-node 2`` on the small
FSDP2 fit of ``fsdp_train.py`` in a subprocess bounded by a timeout, on a free port of its own
(the same launch as ``test_distributed.py``). The in-process tests use a one-rank gloo group.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

import torch

from ._launch import run_root, torchrun

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch before FSDP2
    pytest.skip("torch.distributed.fsdp.fully_shard is not available", allow_module_level=True)

import torch.distributed as dist

from nanscope.errors import UsageError
from nanscope.torch import sharded
from torch import nn

pytestmark = pytest.mark.slow  # torchrun: two ranks in subprocesses

HERE = Path(__file__).parent
SCRIPT = HERE / "fsdp_train.py"
BOUND = 240  # seconds for a whole job (a guard against a hang; about 20 s on a quiet machine)
RUN = ["-m", "nanscope", "run"]  # torchrun ... -m nanscope run -- fsdp_train.py


def _torchrun(tmp_path: Path, entry: list[str], args: list[str], **env: str):
    return torchrun(tmp_path, entry, args, bound=BOUND, strip=("FSDP_", "NANSCOPE_"), **env)


def _records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "step" in rec and "loss" in rec:
            out.append(rec)
    return out


def _losses(stdout: str) -> list[tuple[str, ...]]:
    """(rank, step, loss) as printed (the ranks' lines may run into each other)."""
    return sorted(re.findall(r"rank (\d+) step (\d+) loss (-?\d+\.\d{4}|nan|inf)", stdout))


def _finished(proc) -> bool:
    """The plain script (no nanscope) ran to its end on both ranks. Gloo's threads still abort
    a process at exit now and then under load, after both ranks printed "done" ("terminate
    called without an active exception": torch's teardown, not the run); that counts as done."""
    if proc.returncode == 0:
        return True
    done = all(f"rank {rank} done" in proc.stdout for rank in (0, 1))
    return done and "terminate called without an active exception" in proc.stdout + proc.stderr


def _num(value) -> float:
    return float(value)  # the trace writes non-finite floats as "nan" / "inf"


# ---------------------------------------------------------------------- under torchrun


@pytest.mark.distributed
def test_healthy_fsdp2_run_every_update_recorded_and_equal_to_the_full_tensors(tmp_path):
    out = tmp_path / "h.json"
    proc, took = _torchrun(tmp_path, RUN, ["--json", str(out), "--", str(SCRIPT)],
                           FSDP_STEPS="12", FSDP_REFERENCE="1")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "internal error" not in log, log  # no hook of nanscope switched itself off
    for rank in (0, 1):
        # the recorded gradient and update norms equal those of the gathered full tensors
        assert f"rank {rank} reference ok 12" in proc.stdout, log
    assert json.loads(out.read_text())["verdict"] == "healthy"
    root = run_root(tmp_path)
    merged = json.loads((root / "diagnosis.json").read_text())
    assert merged["verdict"] == "healthy" and merged["ranks"] == []
    per_rank = []
    for rank in (0, 1):
        recs = _records(root / f"rank{rank}" / "trace.jsonl")
        assert [r["step"] for r in recs] == list(range(1, 13)), rank
        assert all(r["nf_grads"] == 0 and _num(r["grad_norm"]) > 0 for r in recs)
        assert all(r.get("update_norm") is not None for r in recs[1:])
        per_rank.append([r["grad_norm"] for r in recs])
    assert per_rank[0] == per_rank[1]  # one combined norm, the same on every rank
    assert took < BOUND
    # untouched: the same script without nanscope prints the same losses, digit for digit
    (tmp_path / "plain").mkdir()
    plain, _ = _torchrun(tmp_path / "plain", [], [str(SCRIPT)], FSDP_STEPS="12")
    assert _finished(plain), plain.stdout + plain.stderr
    assert _losses(plain.stdout) == _losses(proc.stdout) and len(_losses(plain.stdout)) == 24


@pytest.mark.distributed
def test_hsdp_replicated_shards_are_counted_once(tmp_path):
    """A 2 x 1 mesh (replicate x shard): every rank holds every parameter whole; the combined
    gradient and update norms must equal the full tensors', not sqrt(2) times them."""
    proc, _ = _torchrun(tmp_path, RUN, ["--", str(SCRIPT)], FSDP_HSDP="1", FSDP_STEPS="6",
                        FSDP_REFERENCE="1")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    for rank in (0, 1):
        assert f"rank {rank} reference ok 6" in proc.stdout, log


@pytest.mark.distributed
def test_nan_on_rank_1_stops_both_ranks_at_update_8_with_the_rank_named(tmp_path):
    out = tmp_path / "d.json"
    proc, took = _torchrun(tmp_path, RUN, ["--json", str(out), "--", str(SCRIPT)],
                           FSDP_NAN_RANK="1", FSDP_NAN_STEP="8", FSDP_NAN_ROW="5")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "exitcode  : 3" in log, log
    assert "internal error" not in log, log
    root = run_root(tmp_path)
    for rank in (0, 1):
        recs = _records(root / f"rank{rank}" / "trace.jsonl")
        assert [r["step"] for r in recs] == list(range(1, 9)), rank
        assert f"rank {rank} step 8" not in proc.stdout  # neither rank finished update 8
        last = recs[-1]
        assert last["grad_norm"] == "nan" and last["nf_grads"] > 0
        shards = last["extra"]["shards"]  # which ranks' gradient shards broke, where on this rank
        assert shards["nonfinite_grad_ranks"] == [0, 1]
        rows = {p["param"]: p["rows"] for p in shards["params"]}
        # 0.weight (32 x 8) is split in rows 0-15 on rank 0 and 16-31 on rank 1
        assert rows["0.weight"][0] == (0 if rank == 0 else 16), rows
        header = torch.load(root / f"rank{rank}" / "last_good.pt", weights_only=True)
        assert header["format"] == sharded.FORMAT and header["rank"] == rank
        assert header["step"] == 7 and header["shards"]["0.weight"].shape == (16, 8)
        assert all(bool(torch.isfinite(t).all()) for t in header["shards"].values())
    for path in (out, root / "diagnosis.json"):
        d = json.loads(path.read_text())
        assert d["rank"] == 1 and d["ranks"] == [1], path
        assert d["cause"] == "nonfinite_input" and d["step"] == 8, d
        assert (d["rows"][0]["batch_row"], d["rows"][0]["column"]) == (5, 3), d["rows"]
        assert any(e["rule"] == "distributed" and "rank 1 of 2" in e["text"]
                   for e in d["evidence"])  # fmt: skip
    assert took < BOUND


@pytest.mark.distributed
def test_large_learning_rate_diagnosed_diverging_on_both_ranks(tmp_path):
    out = tmp_path / "d.json"
    proc, _ = _torchrun(tmp_path, RUN, ["--json", str(out), "--", str(SCRIPT)],
                        FSDP_LR="1.0", FSDP_STEPS="40")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "exitcode  : 3" in log, log
    d = json.loads(out.read_text())
    assert d["verdict"] == "diverging" and d["cause"] == "step_size_too_large", d
    # no replay on one rank of a sharded step (its collectives): said, and the confidence capped
    assert 0.6 <= d["confidence"] <= 0.7
    assert any("not confirmed by a replay" in e["text"] and "several ranks" in e["text"]
               for e in d["evidence"]), d["evidence"]
    root = run_root(tmp_path)
    steps = [[r["step"] for r in _records(root / f"rank{rank}" / "trace.jsonl")]
             for rank in (0, 1)]  # fmt: skip
    assert steps[0] == steps[1] and steps[0][-1] == d["step"] < 40  # stopped together, early
    recs = _records(root / "rank0" / "trace.jsonl")
    assert all(r["nf_grads"] == 0 for r in recs)  # stopped before anything went non-finite


@pytest.mark.distributed
def test_mixed_fsdp2_and_plain_module(tmp_path):
    out = tmp_path / "d.json"
    proc, _ = _torchrun(tmp_path, RUN, ["--json", str(out), "--", str(SCRIPT)], FSDP_MIXED="1",
                        FSDP_NAN_RANK="1", FSDP_NAN_STEP="6", FSDP_REFERENCE="1")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "exitcode  : 3" in log, log
    assert "internal error" not in log, log
    d = json.loads(out.read_text())
    assert d["rank"] == 1 and d["cause"] == "nonfinite_input" and d["step"] == 6, d
    root = run_root(tmp_path)
    last = {rank: _records(root / f"rank{rank}" / "trace.jsonl")[-1] for rank in (0, 1)}
    for rank in (0, 1):
        assert last[rank]["step"] == 6
        assert last[rank]["grad_norms"]["0.weight"] == "nan"  # sharded: combined over the ranks
    # the plain head is measured on its own rank: finite on rank 0, NaN on rank 1
    assert _num(last[0]["grad_norms"]["4.weight"]) > 0
    assert last[1]["grad_norms"]["4.weight"] == "nan"
    for rank in (0, 1):  # updates 1-5 agree with the gathered full tensors
        assert f"rank {rank} reference checked 5" in proc.stdout, log


@pytest.mark.distributed
def test_a_fault_on_one_rank_turns_the_measures_off_on_both_and_nothing_hangs(tmp_path):
    proc, took = _torchrun(tmp_path, RUN, ["--", str(SCRIPT)], FSDP_BREAK_RANK="1",
                           FSDP_STEPS="10")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log  # the training run went on to its end on both ranks
    assert "rank 0 step 10" in proc.stdout and "rank 1 step 10" in proc.stdout
    root = run_root(tmp_path)
    for rank in (0, 1):
        recs = _records(root / f"rank{rank}" / "trace.jsonl")
        assert [r["step"] for r in recs] == list(range(1, 11))  # the loss is still recorded
        off = recs[0]["extra"]["shards"]
        assert off["failed_ranks"] == [1]
        why = "planted fault on rank 1" if rank == 1 else "rank(s) 1 failed"
        assert why in off["measures_off"]
        assert all("grad_norm" not in r for r in recs)  # off together, from the first update
    assert took < BOUND


@pytest.mark.distributed
def test_a_run_whose_hook_failed_on_every_rank_is_unobserved_not_healthy(tmp_path):
    out = tmp_path / "d.json"
    proc, _ = _torchrun(tmp_path, RUN, ["--json", str(out), "--", str(SCRIPT)],
                        FSDP_BREAK_HOOK="1", FSDP_STEPS="6")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert "rank 0 step 6" in proc.stdout and "rank 1 step 6" in proc.stdout, log  # it trained
    for path in (out, tmp_path / "d.json.rank1"):
        d = json.loads(path.read_text())
        assert d["verdict"] == "unobserved", (path, d)
        why = d["evidence"][0]["text"]  # which hook failed, and the error
        assert "step hook failed (RuntimeError: planted step-hook fault)" in why, why


@pytest.mark.distributed
def test_last_good_shards_load_back_into_a_fresh_fsdp2_model(tmp_path):
    proc, _ = _torchrun(tmp_path, [], [str(SCRIPT)], FSDP_WATCH="1", FSDP_NAN_RANK="1",
                        FSDP_NAN_STEP="8")  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "DivergenceError" in log, log
    for rank in (0, 1):
        assert f"rank {rank} last good step 7 format {sharded.FORMAT}" in proc.stdout, log
        assert f"rank {rank} roundtrip ok" in proc.stdout, log


# ---------------------------------------------------------------------- one rank, in process


@pytest.fixture
def group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _fit(tmp_path, steps: int = 4):
    import nanscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path / "run")
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), x[:, :1]).backward()
        opt.step()
    return model, watcher


def test_a_failing_step_hook_is_in_the_run_meta(group, tmp_path, monkeypatch):
    def broken(self, full, *, sample=True):
        raise RuntimeError("measure broke")

    monkeypatch.setattr(sharded.ShardedMeasure, "device_vector", broken)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, watcher = _fit(tmp_path)
    assert len(watcher.monitor.trace) == 0  # nothing observed ...
    faults = watcher.monitor.meta["hook_faults"]  # ... and the run says why
    assert "measure broke" in faults["step"]
    diagnosis = watcher.monitor.close()
    assert diagnosis.verdict == "unobserved"  # never healthy
    assert "step hook failed (RuntimeError: measure broke)" in diagnosis.evidence[0].text


def test_a_rank_whose_measures_fail_switches_them_off_and_keeps_the_loss(group, tmp_path,
                                                                         monkeypatch):  # fmt: skip
    def broken(self, *args, **kwargs):
        raise RuntimeError("pack broke")

    monkeypatch.setattr(sharded.ShardedMeasure, "_pack", broken)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, watcher = _fit(tmp_path)
    records = watcher.monitor.trace.records
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r.get("grad_norm") is None and r["loss"] > 0 for r in records)
    measure = watcher.records.measure
    assert measure is not None and measure.off and "pack broke" in (measure.fault or "")
    assert "pack broke" in records[0]["extra"]["shards"]["measures_off"]  # the trace says why


def test_load_last_good_checks_the_file(group, tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    fully_shard(model)
    bad = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(2, 4)}, bad)
    with pytest.raises(UsageError, match="not a nanscope local-shards file"):
        sharded.load_last_good(model, bad)
    with pytest.raises(UsageError, match="no last good weights"):
        sharded.load_last_good(model, tmp_path / "missing")
    state = {"format": sharded.FORMAT, "rank": 0, "world_size": 2, "shards": {}}
    torch.save(state, bad)
    with pytest.raises(UsageError, match="rank 0 of 2; this is rank 0 of 1"):
        sharded.load_last_good(model, bad)


def test_deferred_reads_restore_the_verified_shards(group, tmp_path):
    """``sync_every`` > 1 (the default on accelerators): a NaN seen late restores the shards of
    the last verified update, and those are what ``last_good.pt`` holds."""
    import nanscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path / "run", sync_every=4)
    gen = torch.Generator().manual_seed(1)
    with pytest.raises(nanscope.DivergenceError, match="update 10"):
        for step in range(1, 20):
            x = torch.randn(8, 4, generator=gen)
            if step == 10:
                x[2, 1] = float("nan")
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x[:, :1]).backward()
            opt.step()
    assert not watcher.guard.faults
    meta = watcher.monitor.meta
    assert meta["last_good_step"] == 8 and meta["last_good_restored"]
    shards = {n: p.to_local().clone() for n, p in model.named_parameters()}
    assert all(bool(torch.isfinite(t).all()) for t in shards.values())
    torch.manual_seed(5)
    fresh = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    fully_shard(fresh)
    header = sharded.load_last_good(fresh, watcher.last_good_path)
    assert header["step"] == 8
    for name, p in fresh.named_parameters():
        assert torch.equal(p.to_local(), shards[name]), name


def test_a_measure_that_cannot_be_set_up_is_off_not_a_crash(group, tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("setup broke")

    monkeypatch.setattr(sharded.ShardedMeasure, "_setup", broken)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, watcher = _fit(tmp_path)
    assert not watcher.guard.faults  # the step hook stayed on ...
    assert [r["step"] for r in watcher.monitor.trace.records] == [1, 2, 3, 4]  # ... losses kept
    measure = watcher.records.measure
    assert measure is not None and "setup broke" in (measure.fault or "")


def test_clip_grad_norm_under_fsdp2_is_read_as_the_pre_clip_norm(group, tmp_path):
    """FSDP2's ``clip_grad_norm_`` returns a replicated DTensor: its value is the record's
    pre-clip norm, and the combined norm after clipping is the clip threshold."""
    import nanscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path / "run")
    gen = torch.Generator().manual_seed(1)
    totals = []
    for _ in range(4):
        x = torch.randn(8, 4, generator=gen) * 10
        opt.zero_grad()
        nn.functional.mse_loss(model(x), x[:, :1]).backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        totals.append(float(total.to_local()))
        opt.step()
    assert not watcher.guard.faults
    records = watcher.monitor.trace.records
    assert [r["grad_norm"] for r in records] == pytest.approx(totals, rel=1e-5)
    assert all(t > 0.5 for t in totals)  # so every update was clipped, to 0.5
    assert [r["extra"]["grad_norm_clipped"] for r in records] == pytest.approx([0.5] * 4, rel=1e-4)
