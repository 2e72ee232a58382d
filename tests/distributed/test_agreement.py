"""The agreement's own logic, in this process (a one-rank gloo group), and the helpers."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from nanscope.errors import UsageError
from nanscope.torch import distributed as nd


@pytest.fixture
def group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_agree_ranks_kind_then_what(group):
    ag = nd.DistributedAgreement()
    assert ag.agree(False, None, 1) == (False, [])
    stop, ranks = ag.agree(True, "nonfinite", 2, what=["loss", "grad"])
    assert stop and ranks == [0]
    assert (ag.kind, ag.what, ag.first_step, ag.step_range) == ("nonfinite", "loss", 2, (2, 2))
    assert ag.combines == 2


def test_every_n_holds_a_local_alarm_until_its_check(group):
    ag = nd.DistributedAgreement(every=4)
    assert ag.agree(True, "diverging", 2) == (False, [])  # held, no collective
    assert ag.combines == 0
    assert ag.agree(False, None, 3) == (False, [])
    stop, ranks = ag.agree(False, None, 4)
    assert stop and ranks == [0] and ag.kind == "diverging" and ag.first_step == 2
    assert ag.combines == 1


def test_one_rank_is_not_distributed(group):
    from nanscope.monitor import Monitor

    assert not nd.is_distributed()
    assert nd.attach(Monitor(write=False)) is None


def test_agreement_needs_a_process_group():
    with pytest.raises(UsageError, match="init_process_group"):
        nd.DistributedAgreement()


def test_bad_every():
    with pytest.raises(UsageError, match="every"):
        nd.DistributedAgreement(every=0)


def test_sweep_refused_under_torchrun(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    nd.refuse_under_torchrun("sweep")  # not under torchrun: fine
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    with pytest.raises(UsageError, match="does not run under torchrun"):
        nd.refuse_under_torchrun("sweep")


def test_dead_ranks_from_rank_files(tmp_path):
    import json
    import socket
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    host = socket.gethostname()
    for rank, pid, finished in ((0, 1, False), (1, int(child.stdout), False),
                                (2, int(child.stdout), True)):  # fmt: skip
        (tmp_path / f"rank{rank}").mkdir()
        info = {"rank": rank, "pid": pid, "host": host, "finished": finished}
        (tmp_path / f"rank{rank}" / "rank.json").write_text(json.dumps(info))
    assert nd.dead_ranks(root=tmp_path) == [1]  # pid 1 runs; rank 2 finished cleanly


def test_agree_is_a_combinator_around_a_monitors_detectors(group):
    import numpy as np

    import nanscope
    from nanscope.monitor import Monitor

    mon = Monitor(write=False)
    local = mon.detectors
    wrapper = mon.wrap_detectors(nd.agree)
    assert isinstance(wrapper, nd.AgreeingDetectors) and wrapper.inner is local
    rng = np.random.default_rng(0)
    X = rng.normal(size=(32, 3))
    X[5, 1] = np.nan  # the third batch holds a NaN row
    y = X @ np.array([1.0, -1.0, 2.0])
    w = np.zeros(3)
    with pytest.raises(nanscope.DivergenceError):
        for i in range(0, 32, 2):
            xb, yb = X[i : i + 2], y[i : i + 2]
            r = xb @ w - yb
            g = 2 * xb.T @ r / len(yb)
            mon.update(float(np.mean(r**2)), params={"w": w}, grads={"w": g}, inputs=xb)
            w = w - 0.1 * g
    assert mon.alarm is not None and mon.alarm.step == 3
    assert mon.alarm.data["rank"] == 0 and mon.alarm.data["ranks"] == [0]
    assert wrapper.agreement.combines == 3 and wrapper.stops == 1
    before = list(local.detectors)
    mon.reset_detectors()  # a rollback: new local detectors, the same agreement
    assert mon.detectors is wrapper and all(a is not b for a, b in zip(before, local.detectors))


def test_the_agreement_does_not_import_the_watcher_nor_the_cli():
    import ast
    from pathlib import Path

    source = Path(nd.__file__).read_text(encoding="utf-8")
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert not {m for m in imported if m.startswith(("nanscope.torch.watch", "nanscope.cli",
                                                      "nanscope.commands"))}  # fmt: skip
    assert not hasattr(nd, "watch") and not hasattr(nd, "run_main")


def test_watch_refuses_a_bad_every_agree():
    import nanscope
    import torch

    model = torch.nn.Linear(2, 1)
    with pytest.raises(UsageError, match="every_agree"):
        nanscope.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), every_agree=0)
