"""A PyTorch script whose data preparation takes numpy's log of counts that can be 0: the -inf
reaches the loss through the targets, and the producer is the preparation's log (seen by numpy's
floating-point error callback from the script's first line under ``nanscope run``), not the
loss op that met it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = """\
import numpy as np
import torch

rng = np.random.default_rng(3)
X = rng.normal(size=(64, 4))
counts = rng.poisson(np.exp(X[:, 0]))        # some counts are 0
y = np.log(counts)                           # model the log of the count
X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(5):
    for start in range(0, 64, 16):
        opt.zero_grad()
        loss = ((model(X[start:start + 16]) - y[start:start + 16]) ** 2).mean()
        loss.backward()
        opt.step()
"""


def test_a_log_of_zero_counts_in_the_data_preparation_is_the_producer(tmp_path: Path) -> None:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "nanscope", "run", "-q", "--json", "d.json", "--", "fit.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    found = json.loads((tmp_path / "d.json").read_text())
    assert found["cause"] == "log_of_zero"
    located = found["located"]
    assert located["phase"] == "preprocess" and located["op"] == "log"
    assert located["source"]["line"] == 7 and located["observed"] is True
    assert located["replay"]["op"]  # the op the replay saw meet the -inf is kept beside it


@contextlib.contextmanager
def _numpy_errors_recorded() -> Iterator[None]:
    """numpy's errors are recorded from the first Monitor on: one made and gone, warnings off."""
    import gc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nanscope.Monitor(write=False).close()
        gc.collect()
        yield


def _least_squares(X: Any, y: Any, batch: int) -> Any:
    """Least squares by gradient descent under a Monitor (policy warn), batch by batch in order;
    its diagnosis."""
    w = np.zeros(X.shape[1])
    monitor = nanscope.Monitor(write=False, policy="warn")
    for start in range(0, len(X), batch):
        idx = np.arange(start, start + batch)
        r = X[idx] @ w - y[idx]
        g = X[idx].T @ r / batch
        monitor.update(float(np.mean(r**2)), params={"w": w}, grads={"w": g}, lr=0.1,
                       inputs=X[idx], targets=y[idx], index=idx)  # fmt: skip
        w = w - 0.1 * g
    return monitor.close()


def test_another_files_numpy_error_is_not_this_runs_data_preparation(tmp_path) -> None:
    # a log of zero made by another file with no Monitor running (another fit, another test)
    # is not pinned on this run's NaN row, which is read from its own data
    import runpy

    other = tmp_path / "other_fit.py"
    other.write_text("import numpy as np\nlog_counts = np.log(np.zeros(3))\n")
    with _numpy_errors_recorded():
        runpy.run_path(str(other))
        rng = np.random.default_rng(0)
        X = rng.normal(size=(64, 2))
        X[40, 1] = np.nan
        diagnosis = _least_squares(X, X @ np.array([1.0, -1.0]), 8)
    assert diagnosis.cause == "nonfinite_input"
    assert (diagnosis.located or {}).get("op") != "log"


def test_a_standardisation_of_data_that_already_held_an_inf_made_no_nan_of_its_own() -> None:
    # the mean and std of a column holding -inf are NaN: numpy reports an invalid value in std,
    # but the std only propagated a value the data already held, so the rows are the cause
    with _numpy_errors_recorded():
        rng = np.random.default_rng(2)
        X = rng.normal(size=(64, 3))
        y = X @ np.array([1.0, -1.0, 0.5])
        X[21, 1] = -np.inf
        X = (X - X.mean(axis=0)) / X.std(axis=0)
        diagnosis = _least_squares(X, y, 16)
    assert diagnosis.cause == "nonfinite_input", diagnosis.message()
