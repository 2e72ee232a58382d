"""One record builder: the same real fit watched by nanscope.watch and through a trainer callback
gives the same records (keys and values), so it is diagnosed the same whichever way it was watched.

Each trainer test runs one small fit twice from the same initial weights on the same batches: once
as a plain loop under ``nanscope.watch``, once under the trainer with its ``NanscopeCallback``. A
trainer that is not installed is skipped.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import nanscope  # noqa: E402
from nanscope.trace import RECORD_KEYS  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 8
BATCH = 8
LR = 0.3  # large enough that the loss rises on some updates: the sampled cosines appear too


def _rows(nan_row=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * BATCH, 4, generator=g) * 2.0
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.01 * torch.randn(len(x), 1, generator=g)
    if nan_row is not None:
        x[nan_row, 2] = math.nan
    return x, y


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.loss_fn = nn.MSELoss()

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": None if labels is None else self.loss_fn(out, labels), "logits": out}


def _plain(tmp_path, x, y, *, policy="raise"):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    watcher = nanscope.watch(model, opt, run_dir=tmp_path / "plain", policy=policy)
    try:
        for i in range(STEPS):
            xb, yb = x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]
            opt.zero_grad()
            model(xb, labels=yb)["loss"].backward()
            opt.step()
    except nanscope.DivergenceError:
        pass
    watcher.close()
    return watcher.monitor.trace.records


def _same(plain, other, *, ignore=("logged",)):
    assert len(plain) == len(other) > 0
    for a, b in zip(plain, other):
        a = {k: v for k, v in a.items() if k != "extra"} | {"extra": _extra(a, ignore)}
        b = {k: v for k, v in b.items() if k != "extra"} | {"extra": _extra(b, ignore)}
        assert set(a) == set(b), (a["step"], set(a) ^ set(b))
        assert set(a) <= set(RECORD_KEYS), set(a) - set(RECORD_KEYS)
        for key, value in a.items():
            _close(value, b[key], (a["step"], key))


def _extra(record, ignore):
    return {k: v for k, v in (record.get("extra") or {}).items() if k not in ignore}


def _close(a, b, where):
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _close(a[k], b[k], (*where, k))
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b)):
            _close(u, v, (*where, i))
    elif isinstance(a, float):
        assert isinstance(b, (int, float)), where
        if math.isnan(a):
            assert math.isnan(b), where
        else:
            assert b == pytest.approx(a, rel=1e-5, abs=1e-7), where
    else:
        assert a == b, where


# ---------------------------------------------------------------------- Lightning


def _lightning(tmp_path, x, y, *, policy="raise"):
    pl = pytest.importorskip("lightning.pytorch")
    from nanscope.integrations.lightning import NanscopeCallback

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Net()  # the same initial weights as the plain loop's

        def training_step(self, batch, batch_idx):
            xb, yb = batch
            return self.inner.loss_fn(self.inner.net(xb), yb)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    callback = NanscopeCallback(run_dir=tmp_path / "lightning", policy=policy)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[callback])  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(nanscope.DivergenceError):
            trainer.fit(Lit(), loader)
    return callback.monitor.trace.records


def _renamed(records, prefix):
    """The Lightning module holds the net one level deeper: ``inner.net.0.weight``."""
    out = []
    for record in records:
        record = dict(record)
        if "grad_norms" in record:
            record["grad_norms"] = {k.removeprefix(prefix): v
                                    for k, v in record["grad_norms"].items()}  # fmt: skip
        out.append(record)
    return out


def test_lightning_records_are_those_of_nanscope_watch(tmp_path):
    x, y = _rows()
    lit = _renamed(_lightning(tmp_path, x, y), "inner.")
    plain = _plain(tmp_path, x, y)
    assert len(plain) == STEPS
    assert any("update_cos" in r for r in plain) and any("weight_norm" in r for r in plain)
    assert any("target_absmax" in r for r in plain)
    _same(plain, lit)


def test_lightning_stops_on_the_same_record_as_nanscope_watch(tmp_path):
    x, y = _rows(nan_row=3 * BATCH + 5)  # the fourth batch
    lit = _renamed(_lightning(tmp_path, x, y), "inner.")
    plain = _plain(tmp_path, x, y)
    assert len(plain) == 4 and plain[-1]["nf_inputs"] >= 1 and plain[-1]["nf_loss"] == 1
    _same(plain, lit)


# ---------------------------------------------------------------------- Hugging Face


def _hf(tmp_path, x, y, *, policy="raise"):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from nanscope.integrations.transformers import NanscopeCallback

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return {"x": x[i], "labels": y[i]}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, num_train_epochs=1,
        learning_rate=LR, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
        weight_decay=0.0, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, train_sampling_strategy="sequential",
    )  # fmt: skip
    callback = NanscopeCallback(run_dir=tmp_path / "hf", policy=policy)
    trainer = transformers.Trainer(model=Net(), args=args, train_dataset=Rows(),
                                   callbacks=[callback])  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(nanscope.DivergenceError):
            trainer.train()
    return callback.monitor.trace.records


def test_hf_trainer_records_are_those_of_nanscope_watch(tmp_path):
    x, y = _rows()
    hf = _hf(tmp_path, x, y)
    plain = _plain(tmp_path, x, y)
    assert len(plain) == STEPS
    _same(plain, hf)
    # what the Trainer logged travels next to the records, and only there
    assert hf[1]["extra"]["logged"]["learning_rate"] == LR


# ---------------------------------------------------------------------- fp16 evidence


def _scaled_fit(tmp_path, name, watch):
    """A fit on a real GradScaler whose gradients overflow from update 3 on, until it stops."""
    try:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=1000)
    except Exception:
        pytest.skip("GradScaler('cpu') not available")
    if not scaler.is_enabled():
        pytest.skip("GradScaler('cpu') disabled")
    x, y = _rows()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = watch(model, opt, tmp_path / name)
    with contextlib.suppress(nanscope.DivergenceError):
        for i in range(60):
            opt.zero_grad()
            scaler.scale(model(x[:BATCH], labels=y[:BATCH])["loss"]).backward()
            if i >= 2:
                model.net[0].weight.grad[0, 0] = math.inf
            scaler.step(opt)
            scaler.update()
    return monitor.trace.records


def test_the_trainer_path_gives_the_same_loss_scale_evidence(tmp_path):
    from nanscope.integrations import TorchSteps
    from nanscope.monitor import Monitor

    def plain(model, opt, run_dir):
        return nanscope.watch(model, opt, run_dir=run_dir).monitor

    def trainer(model, opt, run_dir):
        steps = TorchSteps(Monitor(run_dir=run_dir))
        steps.model = model
        steps.watch(opt)
        return steps.monitor

    a = _scaled_fit(tmp_path, "plain", plain)
    b = _scaled_fit(tmp_path, "trainer", trainer)
    assert a[2]["events"] == ["skipped_step"] and "loss_scale_collapse" in a[-1]["events"]
    assert a[-1]["nf_grads"] == 1 and "fp16_story" in a[-1]["extra"]
    _same(a, b)
