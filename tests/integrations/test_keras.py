"""NanscopeCallback on a real Keras 3 fit, torch backend (tiny linear regression on CPU)."""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytest

if "keras" not in sys.modules:
    os.environ["KERAS_BACKEND"] = "torch"  # must be set before keras is first imported
pytest.importorskip("torch")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "torch":  # pragma: no cover - keras imported earlier elsewhere
    pytest.skip("keras was already imported with another backend", allow_module_level=True)

import nanscope  # noqa: E402
from nanscope.integrations.keras import NanscopeCallback  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    # keras's own torch-to-numpy conversion (np.array on a tensor) under numpy 2
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]


def _data(nan_row: int | None = None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + 0.01 * rng.standard_normal((64, 1)))
    if nan_row is not None:
        x[nan_row, 2] = np.nan
    return x, y.astype("float32")


def _fit(tmp_path, lr: float, epochs: int, nan_row: int | None = None, policy=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr), loss="mse")
    callback = NanscopeCallback(run_dir=tmp_path / "run", policy=policy)
    x, y = _data(nan_row)
    return callback, model, lambda: model.fit(
        x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=[callback]
    )


def test_too_large_lr_raises_step_size_too_large(tmp_path):
    callback, model, fit = _fit(tmp_path, lr=3.0, epochs=20)
    with pytest.raises(nanscope.DivergenceError) as info:
        fit()
    diagnosis = info.value.diagnosis
    assert diagnosis.cause == "step_size_too_large"
    assert callback.diagnosis is diagnosis
    assert model.stop_training
    saved = json.loads((tmp_path / "run" / "diagnosis.json").read_text())
    assert saved["cause"] == "step_size_too_large"
    trace = nanscope.read_trace(tmp_path / "run")
    assert len(trace) == diagnosis.step
    assert trace.has("update_norm") and trace.has("flip_frac") and not trace.has("grad_norm")
    assert math.isclose(trace[0]["lr"], 3.0)
    # the callback's per-batch loss is the loss of that batch, not Keras' running mean
    x, y = _data()
    keras.utils.set_random_seed(0)
    fresh = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    first = float(np.mean((keras.ops.convert_to_numpy(fresh(x[:8])) - y[:8]) ** 2))
    assert math.isclose(trace[0]["loss"], first, rel_tol=1e-4)


def test_per_batch_loss_recovered_from_running_mean(tmp_path):
    # a healthy fit: each record's loss must equal the loss of that batch at those weights
    callback, model, _ = _fit(tmp_path, lr=0.05, epochs=2)
    x, y = _data()
    seen: list[tuple[float, float]] = []
    weights = [[keras.ops.convert_to_numpy(v) for v in model.trainable_weights]]

    class Keep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            weights.append([keras.ops.convert_to_numpy(v) for v in model.trainable_weights])

    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback, Keep()])
    trace = nanscope.read_trace(tmp_path / "run")
    assert len(trace) == 16
    for i in (0, 5, 8, 15):  # 8 starts the second epoch: the running mean was reset
        kernel, bias = weights[i]
        b = i % 8
        xb, yb = x[8 * b : 8 * b + 8], y[8 * b : 8 * b + 8]
        expect = float(np.mean((xb @ kernel + bias - yb) ** 2))
        seen.append((trace[i]["loss"], expect))
        assert math.isclose(trace[i]["loss"], expect, rel_tol=1e-3), seen
    assert callback.diagnosis.verdict == "healthy" and callback.diagnosis.cause == "healthy"
    assert json.loads((tmp_path / "run" / "diagnosis.json").read_text())["verdict"] == "healthy"
    assert "train_step" not in vars(model)  # the batch tap is removed after the fit


def test_nan_batch_is_nonfinite_input_with_its_row(tmp_path):
    callback, model, fit = _fit(tmp_path, lr=0.05, epochs=3, nan_row=21)
    with pytest.raises(nanscope.DivergenceError) as info:
        fit()
    assert callback.error is info.value
    diagnosis = info.value.diagnosis
    assert diagnosis.cause == "nonfinite_input"
    assert diagnosis.step == 3
    assert any(r.get("batch_row") == 5 for r in diagnosis.rows)
    assert model.stop_training
    # Keras applied the NaN batch before the callback ran; the last good weights are saved
    last_good = np.load(tmp_path / "run" / "last_good.npz")
    assert all(np.isfinite(last_good[k]).all() for k in last_good.files)


def test_lazy_export():
    import nanscope.integrations as integrations

    assert integrations.KerasCallback is NanscopeCallback
    assert issubclass(NanscopeCallback, keras.callbacks.Callback)
