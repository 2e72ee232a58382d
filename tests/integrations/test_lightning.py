"""NanscopeCallback on a real Lightning fit (tiny linear regression on CPU)."""

from __future__ import annotations

import json
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

import nanscope  # noqa: E402
from nanscope.integrations.lightning import NanscopeCallback  # noqa: E402

pytestmark = pytest.mark.slow


class Regression(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _data(nan_row: int | None = None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.01 * torch.randn(64, 1, generator=g)
    if nan_row is not None:
        x[nan_row, 2] = math.nan
    ds = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(ds, batch_size=8, shuffle=False)


def _fit(tmp_path, lr: float, epochs: int, nan_row: int | None = None, **kw):
    callback, model, trainer = _setup(tmp_path, lr, epochs, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's num_workers and log-interval advice
        trainer.fit(model, _data(nan_row))
    return callback, model, trainer


def _setup(tmp_path, lr: float, epochs: int, **kw):
    torch.manual_seed(0)
    callback = NanscopeCallback(run_dir=tmp_path / "run", **kw)
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.callbacks.append(callback)
    return callback, Regression(lr), trainer


def test_too_large_lr_raises_step_size_too_large_before_nan(tmp_path):
    with pytest.raises(nanscope.DivergenceError) as info:
        _fit(tmp_path, lr=3.0, epochs=20)
    diagnosis = info.value.diagnosis
    assert diagnosis is not None
    assert diagnosis.cause == "step_size_too_large"
    saved = json.loads((tmp_path / "run" / "diagnosis.json").read_text())
    assert saved["cause"] == "step_size_too_large"
    trace = nanscope.read_trace(tmp_path / "run" / "trace.jsonl")
    assert len(trace) == diagnosis.step
    assert trace.has("grad_norm") and trace.has("lr") and trace.has("update_cos")
    assert trace[0]["lr"] == 3.0
    assert (tmp_path / "run" / "last_good.pt").exists()


def test_nan_batch_is_nonfinite_input_with_its_row_and_weights_stay_finite(tmp_path):
    callback, model, trainer = _setup(tmp_path, lr=0.05, epochs=3)
    with pytest.raises(nanscope.DivergenceError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, _data(nan_row=19))
    assert trainer.should_stop
    assert callback.diagnosis is info.value.diagnosis
    # the check ran before optimizer.step: the NaN gradient never reached the weights
    assert all(torch.isfinite(p).all() for p in model.parameters())
    diagnosis = info.value.diagnosis
    assert diagnosis.cause == "nonfinite_input"
    assert diagnosis.step == 3  # rows 16..23 are the third batch
    assert any(r.get("batch_row") == 3 for r in diagnosis.rows)
    saved = torch.load(tmp_path / "run" / "last_good.pt")
    assert all(torch.isfinite(v).all() for v in saved.values())


def test_healthy_fit_completes_healthy(tmp_path):
    callback, _, trainer = _fit(tmp_path, lr=0.05, epochs=3)
    assert trainer.global_step == 24
    diagnosis = callback.diagnosis
    assert diagnosis is not None and diagnosis.verdict == "healthy"
    assert diagnosis.cause == "healthy"
    trace = nanscope.read_trace(tmp_path / "run")
    assert len(trace) == 24
    losses = trace.column("loss")
    assert losses[-1] < losses[0] / 10
    assert json.loads((tmp_path / "run" / "diagnosis.json").read_text())["verdict"] == "healthy"


def test_lazy_export():
    import nanscope.integrations as integrations

    assert integrations.LightningCallback is NanscopeCallback
    assert issubclass(NanscopeCallback, pl.Callback)
