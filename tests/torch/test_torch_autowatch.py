"""`nanscope run` watches a script's optimizers with no change to it: plain loop, Lightning, HF."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # nanscope run in subprocesses: plain loop, Lightning, HF

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, body: str, *, arm_directly: bool = False, timeout: int = 120,
         path: tuple[Path, ...] = ()):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    out = tmp_path / "diagnosis.json"
    python_path = os.pathsep.join(str(p) for p in (*path, ROOT / "src"))
    env = {**os.environ, "NANSCOPE_DIR": str(tmp_path / "runs"), "PYTHONPATH": python_path}
    env.pop("PYTHONWARNINGS", None)
    if arm_directly:
        cmd = [sys.executable, str(script)]
    else:
        cmd = [sys.executable, "-m", "nanscope.cli", "run", "--json", str(out), "--",
               "python", str(script)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    diagnosis = json.loads(out.read_text()) if out.exists() else None
    return proc, diagnosis


PLAIN = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(64, 4)
y = X @ torch.randn(4, 1)
if {poison}:
    X[21, 3] = float("nan")
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.MSELoss()
for epoch in range(3):
    for i in range(0, 64, 16):
        opt.zero_grad()
        loss = loss_fn(model(X[i:i + 16]), y[i:i + 16])
        loss.backward()
        opt.step()
print("script finished", round(float(loss), 3))
sys.exit(5)
"""


def test_arm_never_imports_torch_for_a_numpy_script(tmp_path):
    proc, _ = _run(tmp_path, """
        import sys
        from nanscope.torch import autowatch
        autowatch.arm()
        import numpy as np
        print("torch imported:", "torch" in sys.modules, np.ones(2).sum())
        """, arm_directly=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "torch imported: False 2.0" in proc.stdout


def test_plain_loop_healthy_keeps_output_and_exit_code(tmp_path):
    proc, diagnosis = _run(tmp_path, PLAIN.format(poison=False))
    assert proc.returncode == 5, proc.stderr
    assert "script finished" in proc.stdout
    assert diagnosis is not None and diagnosis["verdict"] == "healthy"


def test_plain_loop_nan_batch_stops(tmp_path):
    proc, diagnosis = _run(tmp_path, PLAIN.format(poison=True))
    assert proc.returncode == 3, proc.stderr
    assert "script finished" not in proc.stdout
    assert diagnosis["cause"] == "nonfinite_input"
    assert diagnosis["step"] == 2
    assert any(r.get("batch_row") == 5 for r in diagnosis["rows"])
    last_good = diagnosis["run"]["last_good"]
    import torch

    state = torch.load(last_good, weights_only=True)
    assert all(torch.isfinite(v).all() for v in state.values())


LIGHTNING = """
import torch
from torch import nn
import lightning as L

torch.manual_seed(0)
X = torch.randn(64, 4)
y = X @ torch.randn(4, 1)
X[40, 0] = float("inf")


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, idx):
        xb, yb = batch
        return nn.functional.mse_loss(self.net(xb), yb)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=16)
trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), loader)
print("fit finished")
"""


def test_lightning_trainer_fit(tmp_path):
    proc, diagnosis = _run(tmp_path, LIGHTNING)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "fit finished" not in proc.stdout
    assert diagnosis["cause"] == "nonfinite_input"
    assert diagnosis["step"] == 3
    rows = diagnosis["rows"]
    assert any(r.get("batch_row") == 8 for r in rows)


HF = """
import torch
from torch import nn
from transformers import Trainer, TrainingArguments

torch.manual_seed(0)
X = torch.randn(64, 4)
y = X @ torch.randn(4, 1)
if {poison}:
    X[50, 1] = float("nan")


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        loss = nn.functional.mse_loss(out, labels)
        return {{"loss": loss, "logits": out}}


data = [{{"x": X[i], "labels": y[i]}} for i in range(64)]
args = TrainingArguments(output_dir="out", per_device_train_batch_size=16, max_steps=8,
                         learning_rate=1e-2, report_to=[], save_strategy="no", use_cpu=True,
                         logging_steps=1, disable_tqdm=True, dataloader_num_workers=0)
Trainer(model=Tiny(), args=args, train_dataset=data).train()
print("train finished")
"""


def test_hf_trainer(tmp_path):
    proc, diagnosis = _run(tmp_path, HF.format(poison=True), timeout=180)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "train finished" not in proc.stdout
    assert diagnosis["cause"] == "nonfinite_input"
    assert any(r.get("source") == "inputs" for r in diagnosis["rows"])
    # the Trainer shuffles, so the batch row is random; the value is the planted NaN in column 1
    nan_rows = [r for r in diagnosis["rows"] if r.get("column") == 1 and r.get("value") == "nan"]
    assert nan_rows
    # accelerate's DataLoaderShard prefetches a batch ahead: the rows are still those of the
    # failing batch (dataset row 50), never the next batch's
    assert {r.get("dataset_row") for r in nan_rows} == {50}
    assert all(r.get("dataset_row") in (None, 50) for r in diagnosis["rows"])
    lines = Path(diagnosis["run"]["trace"]).read_text().splitlines()[1:]
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == list(range(1, diagnosis["step"] + 1))
    # HF clips at max_grad_norm=1.0: the recorded norm is the pre-clip one
    assert all(r["extra"]["grad_norm_source"] == "pre_clip" for r in records)
    assert all("loss" in r for r in records)


MANUAL_LOG_COUNTS = """
import numpy as np
import torch

rng = np.random.default_rng(3)
X = rng.normal(size=(256, 3))
counts = rng.poisson(np.exp(0.5 * X[:, 0]))  # some counts are 0
y = np.log(counts)  # the log of the count: -inf where it is 0
X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)
w = torch.zeros(3, 1, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
for epoch in range(3):
    for start in range(0, 256, 32):
        loss = ((X[start:start + 32] @ w + b - y[start:start + 32]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in (w, b):
                p -= 0.01 * p.grad
                p.grad.zero_()
print("done")
"""


def test_a_hand_written_loop_on_a_log_of_zero_counts_names_the_data_preparation(tmp_path):
    # the loop updates by hand: it is found at its second update; update 1 failed and is
    # probed then. numpy saw log(0) before the loop, so the log is named (numpy's error is what
    # was seen); the replay of the step could not reach the data it slices, so it decides
    # nothing and the rules' answer stays below a confirmed one
    proc, d = _run(tmp_path, MANUAL_LOG_COUNTS)
    assert d is not None, proc.stderr
    assert (d["verdict"], d["cause"], d["first_nonfinite"]) == (
        "nonfinite", "log_of_zero", {"step": 1, "what": "loss"})
    located = d["located"]
    assert (located["phase"], located["op"], located["source"]["line"]) == ("preprocess", "log", 8)
    assert "numpy" in located["how"]
    control = next(c for c in d["confirmation"] if c.get("change") == "control")
    assert control["reproduced"] and control["data_nonfinite"]
    assert d["confidence"] < 0.9


ACCUMULATED_NAN_ROW = """
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(128, 6)
y = (X[:, 0] > 0).long()
X[5, 2] = float("nan")  # in the first micro-batch of the first update
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(2):
    for i in range(8):
        xb, yb = X[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)]
        loss = loss_fn(model(xb), yb)
        (loss / 4).backward()
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
print("done")
"""


def test_the_first_updates_micro_batches_are_replayed_though_the_model_was_found_at_its_step(
    tmp_path,
):
    # the model is found at the first optimizer step, after the four micro-batches of update 1:
    # each was kept (not only the last), so the replay reproduces the NaN and, without the row
    # that holds it, removes it
    proc, d = _run(tmp_path, ACCUMULATED_NAN_ROW)
    assert d is not None, proc.stderr
    assert (d["verdict"], d["cause"], d["step"]) == ("nonfinite", "nonfinite_input", 1)
    assert d["confidence"] >= 0.9
    control = next(e for e in d["confirmation"] if e["change"] == "control")
    assert control["reproduced"] is True
    rows = next(e for e in d["confirmation"]
                if e["change"] == "without_rows" and e.get("scope") == "window")  # (the replay's)
    assert rows["fixed"] and rows["rows_nonfinite"]


MANUAL_EXTREME_ROW = """
import torch

torch.manual_seed(1)
X = torch.randn(256, 4)
y = (X[:, 0] > 0).float().unsqueeze(1)
X[77, 2] = 3e8  # one extreme value, reached in the fifth batch
w = (torch.randn(4, 1) / 2).requires_grad_()
b = torch.zeros(1, requires_grad=True)
loss_fn = torch.nn.BCEWithLogitsLoss()
for epoch in range(2):
    for start in range(0, 256, 16):
        xb, yb = X[start:start + 16], y[start:start + 16]
        loss = loss_fn(xb @ w + b, yb)
        loss.backward()
        with torch.no_grad():
            for p in (w, b):
                p -= 0.05 * p.grad
                p.grad.zero_()
print("done")
"""


def test_a_hand_written_loop_calls_no_model_and_its_batch_is_still_read(tmp_path):
    # the data the weights were applied to (xb of xb @ w) is read off the loss's graph: the
    # extreme row of the batch that threw the loss is named
    proc, d = _run(tmp_path, MANUAL_EXTREME_ROW)
    assert d is not None, proc.stderr
    assert d["cause"] == "extreme_batch", d["evidence"]
    assert d["rows"] and d["rows"][0]["batch_row"] == 77 - 64 and d["rows"][0]["column"] == 2


SCALER_SKIPS_EVERY_STEP = """
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(64, 4)
y = torch.randn(64, 1)
X[:, 1] = float("inf")  # every batch: every scaled gradient holds inf or NaN
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu")
for i in range(0, 64, 8):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(X[i:i + 8]), y[i:i + 8])
    scaler.scale(loss).backward()
    scaler.step(opt)  # skips optimizer.step every time: the gradients are never finite
    scaler.update()
print("done")
"""


def test_a_scaler_that_skips_every_step_is_watched_though_the_optimizer_never_steps(tmp_path):
    # nanscope run makes an optimizer's watcher at its first step; a GradScaler that skips
    # every one never runs it: the watcher is made at the scaler's step instead
    proc, d = _run(tmp_path, SCALER_SKIPS_EVERY_STEP)
    assert d is not None, proc.stderr
    assert d["verdict"] == "nonfinite" and d["cause"] != "unknown", d["evidence"]
    assert d["first_nonfinite"]["step"] == 1


def test_a_held_step_up_leaves_the_detectors_watching_the_rest_of_the_run(tmp_path):
    # with snapshots 43 updates apart, the warm-up's first climb is held as the data's step (the
    # weights from before it, frozen, give the same higher loss); the divergence that follows at
    # the peak lr must still be stopped and replayed, not run to the end unseen
    case = ROOT / "tests" / "zoo" / "torch" / "step_size_warmup_peak_momentum.py"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import nanscope.torch.history as history\nhistory.SNAPSHOT_EVERY = 43\n")
    proc, d = _run(tmp_path, case.read_text(), path=(site,), timeout=300)
    assert d is not None, proc.stderr
    trace = (Path(d["run"]["trace"])).read_text()
    assert '"event": "held"' in trace or '"event":"held"' in trace
    assert (d["verdict"], d["cause"]) == ("diverging", "step_size_too_large")
    assert d["confidence"] >= 0.9
