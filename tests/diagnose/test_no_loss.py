"""A log whose records carry no training loss is ``unobserved``, never ``healthy``: nothing in it
says whether the fit learned or diverged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import nanscope
from nanscope.cli import main


def _logreg_epochs(epochs: int = 19, seed: int = 0) -> list[dict[str, float]]:
    """A real fit: logistic regression by minibatch SGD, its accuracy, training and validation
    loss per epoch, as a Keras-style CSV logger would see them."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((600, 5))
    y = (X @ rng.standard_normal(5) + 0.3 * rng.standard_normal(600) > 0).astype(float)
    Xt, yt, Xv, yv = X[:500], y[:500], X[500:], y[500:]
    w = np.zeros(5)
    rows = []
    for epoch in range(epochs):
        losses = []
        for idx in np.array_split(rng.permutation(500), 10):
            z = Xt[idx] @ w
            losses.append(float(np.mean(np.logaddexp(0, z) - yt[idx] * z)))
            w -= 0.5 * Xt[idx].T @ (1 / (1 + np.exp(-z)) - yt[idx]) / len(idx)
        zv = Xv @ w
        rows.append(
            {
                "epoch": epoch,
                "loss": float(np.mean(losses)),
                "accuracy": float(np.mean((Xt @ w > 0) == yt)),
                "val_loss": float(np.mean(np.logaddexp(0, zv) - yv * zv)),
            }
        )
    return rows


def _csv(path: Path, rows: list[dict[str, float]], columns: list[str]) -> Path:
    path.write_text(
        ",".join(columns)
        + "\n"
        + "".join(",".join(f"{r[c]:.6g}" for c in columns) + "\n" for r in rows)
    )
    return path


def test_a_log_without_a_loss_is_unobserved(tmp_path: Path) -> None:
    rows = _logreg_epochs()
    log = _csv(tmp_path / "metrics.csv", rows, ["epoch", "accuracy", "val_loss"])
    d = nanscope.diagnose(log)
    if d.summary.get("first_loss") is not None:
        # a reader that takes the validation loss as the loss (meta loss_key): then it is judged
        assert d.verdict == "healthy"
        return
    assert d.verdict == "unobserved" and d.cause == "unknown" and not d.ok
    assert d.summary["updates"] == len(rows)
    text = d.evidence[0].text
    assert f"{len(rows)} epochs were recorded but none carries a training loss" in text
    assert "accuracy" in text
    assert d.headline().startswith(f"unobserved: {len(rows)} epochs recorded but no loss")
    out = tmp_path / "d.json"
    assert main(["diagnose", str(log), "--json", str(out)]) == 1  # not healthy: exit 1
    assert json.loads(out.read_text())["verdict"] == "unobserved"


def test_the_same_log_with_its_loss_is_healthy(tmp_path: Path) -> None:
    rows = _logreg_epochs()
    log = _csv(tmp_path / "metrics.csv", rows, ["epoch", "loss", "accuracy", "val_loss"])
    d = nanscope.diagnose(log)
    assert (d.verdict, d.cause) == ("healthy", "healthy"), d.message()
    assert main(["diagnose", str(log)]) == 0


def test_a_monitor_fed_no_loss_but_a_nan_gradient_is_still_diagnosed() -> None:
    """The loss-less verdict is only for records with nothing non-finite in them."""
    d = nanscope.diagnose([{"step": 1, "grad_norm": 1.0}, {"step": 2, "grad_norm": float("nan")}])
    assert d.verdict == "nonfinite"


def test_records_of_metrics_without_a_loss_are_unobserved() -> None:
    """The engine's own rule, whatever a log reader makes of a validation loss."""
    rows = _logreg_epochs()
    trace = nanscope.Trace(
        [
            {"step": r["epoch"], "epoch": r["epoch"], "extra": {"accuracy": r["accuracy"]}}
            for r in rows
        ],
        meta={"granularity": "epoch"},
    )
    d = nanscope.diagnose(trace)
    assert d.verdict == "unobserved" and d.to_dict()["verdict"] == "unobserved"
    assert "none carries a training loss (what they carry: accuracy)" in d.evidence[0].text
