"""NanscopeCallback on a real transformers.Trainer fit (tiny regression module on CPU)."""

from __future__ import annotations

import json
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import nanscope  # noqa: E402
from nanscope.integrations.transformers import NanscopeCallback  # noqa: E402

pytestmark = pytest.mark.slow


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.net(x)
        loss = None if labels is None else torch.nn.functional.mse_loss(out, labels)
        return {"loss": loss, "logits": out}


class Rows(torch.utils.data.Dataset):
    def __init__(self, nan_row: int | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=g)
        w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        self.y = self.x @ w + 0.01 * torch.randn(64, 1, generator=g)
        if nan_row is not None:
            self.x[nan_row, 1] = math.nan

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def _trainer(tmp_path, lr, epochs, nan_row=None, policy=None, **kw):
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_train_epochs=epochs,
        learning_rate=lr,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        train_sampling_strategy="sequential",
        **kw,
    )
    callback = NanscopeCallback(run_dir=tmp_path / "run", policy=policy)
    model = Regression()
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Rows(nan_row), callbacks=[callback]
    )
    return callback, model, trainer


def _train(trainer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trainer.train()


def test_too_large_lr_raises_step_size_too_large(tmp_path):
    callback, model, trainer = _trainer(tmp_path, lr=3.0, epochs=20)
    with pytest.raises(nanscope.DivergenceError) as info:
        _train(trainer)
    diagnosis = info.value.diagnosis
    assert diagnosis.cause == "step_size_too_large"
    assert callback.diagnosis is diagnosis
    assert json.loads((tmp_path / "run" / "diagnosis.json").read_text())["cause"] == (
        "step_size_too_large"
    )
    trace = nanscope.read_trace(tmp_path / "run")
    assert trace[0]["lr"] == 3.0 and trace.has("grad_norm") and trace.has("update_cos")
    # what the Trainer logged travels next to the real loss
    assert trace[1]["extra"]["logged"]["learning_rate"] == 3.0
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_row_is_nonfinite_input_and_never_reaches_the_weights(tmp_path):
    # logging_nan_inf_filter stays at its default (True): the Trainer would log 0.0 here
    _, model, trainer = _trainer(tmp_path, lr=0.05, epochs=2, nan_row=21)
    assert trainer.args.logging_nan_inf_filter
    with pytest.raises(nanscope.DivergenceError) as info:
        _train(trainer)
    diagnosis = info.value.diagnosis
    assert diagnosis.cause == "nonfinite_input"
    assert diagnosis.step == 3  # sequential batches of 8: row 21 is row 5 of the third
    assert any(r.get("batch_row") == 5 for r in diagnosis.rows)
    assert trainer.control.should_training_stop
    assert trainer.state.global_step == 2  # the third optimizer step never ran
    assert all(torch.isfinite(p).all() for p in model.parameters())
    last = nanscope.read_trace(tmp_path / "run")[-1]
    assert math.isnan(last["loss"])  # the real loss, not the filtered 0.0
    saved = torch.load(tmp_path / "run" / "last_good.pt")
    assert all(torch.isfinite(v).all() for v in saved.values())


def test_healthy_fit_completes_healthy(tmp_path):
    callback, _, trainer = _trainer(tmp_path, lr=0.05, epochs=3)
    _train(trainer)
    assert trainer.state.global_step == 24
    assert callback.diagnosis is not None and callback.diagnosis.verdict == "healthy"
    trace = nanscope.read_trace(tmp_path / "run")
    assert len(trace) == 24
    losses = trace.column("loss")
    assert losses[-1] < losses[0] / 10
    assert json.loads((tmp_path / "run" / "diagnosis.json").read_text())["cause"] == "healthy"


def test_warn_policy_shows_what_logging_nan_inf_filter_hides(tmp_path):
    callback, _, trainer = _trainer(tmp_path, lr=0.05, epochs=1, nan_row=21, policy="warn")
    with pytest.warns(RuntimeWarning, match="nonfinite_input|non-finite|NaN"):
        trainer.train()
    logged = {e["step"]: e for e in trainer.state.log_history if "loss" in e}
    assert logged[3]["loss"] == 0.0  # the filter's stand-in after a log at every step
    assert math.isnan(logged[3]["grad_norm"])  # the gradient norm is not filtered
    trace = nanscope.read_trace(tmp_path / "run")
    assert math.isnan(trace[2]["loss"])  # the callback saw the real loss
    assert trace[3]["extra"]["logged"]["hidden_nan_loss"] == 1.0
    assert callback.diagnosis.cause == "nonfinite_input"


def test_lazy_export():
    import nanscope.integrations as integrations

    assert integrations.TransformersCallback is NanscopeCallback
    assert issubclass(NanscopeCallback, transformers.TrainerCallback)
