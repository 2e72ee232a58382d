"""``nanscope demo``: the story of a fit that diverges, told by nanscope in one run.

An ad-click value model (least squares) on a synthetic ad file whose ``spend_usd`` column holds raw
dollar amounts. Fit at lr=1.0, the loss multiplies by orders of magnitude per update; nanscope stops
it as ``step_size_too_large`` before the first inf, with the evidence. Then the decisive experiment:
on standardised features, lr 1.0, 0.1 and 0.01 for 50 updates each; the largest that descends is
recorded in the ledger, and the fit at that lr converges. A second ``nanscope demo`` starts by
saying what the ledger remembers.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from nanscope._console import columns, wrap
from nanscope.commands.base import CommandParser, check_folder
from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.errors import DivergenceError
from nanscope.experiment import sweep
from nanscope.monitor import Monitor
from nanscope.report.terminal import print_report, sparkline

__all__ = ["ad_clicks", "fit_value_model", "main"]

COLUMNS = ("spend_usd", "ctr", "position", "is_mobile", "hour_sin")


def ad_clicks(rows: int = 2000, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic ad file: features per ad and the value of its clicks (in dollars)."""
    rng = np.random.default_rng(seed)
    spend = rng.lognormal(mean=7.5, sigma=0.8, size=rows)  # raw dollars: ~300 to ~10,000
    ctr = rng.beta(2, 60, size=rows)
    position = rng.integers(1, 9, size=rows).astype(float)
    mobile = rng.integers(0, 2, size=rows).astype(float)
    hour = np.sin(2 * np.pi * rng.integers(0, 24, size=rows) / 24)
    X = np.column_stack([spend, ctr, position, mobile, hour])
    value = (
        0.002 * spend + 40.0 * ctr - 0.3 * position + 0.5 * mobile + 0.2 * hour
        + rng.normal(scale=0.5, size=rows)
    )  # fmt: skip
    return X, value


def fit_value_model(
    X: np.ndarray, y: np.ndarray, lr: float, monitor: Monitor, updates: int = 300
) -> np.ndarray:
    """Full-batch gradient descent on mean squared error, watched by ``monitor``."""
    Xb = np.column_stack([X, np.ones(len(X))])
    w = np.zeros(Xb.shape[1])
    for _ in range(updates):
        residual = Xb @ w - y
        loss = float(np.mean(residual**2))
        grad = 2.0 * Xb.T @ residual / len(y)
        monitor.update(loss, params={"w": w}, grads={"w": grad}, lr=lr, inputs=Xb, targets=y)
        w = w - lr * grad
    return w


def _say(text: str = "", indent: str = "") -> None:
    """The demo's story is its result: stdout (``nanscope demo > story.txt`` keeps it), each
    paragraph wrapped to the terminal, its later lines under its text."""
    if not text:
        print(file=sys.stdout)
        return
    for line in wrap(text, columns(sys.stdout), indent):
        print(line, file=sys.stdout)


def main(argv: list[str]) -> int:
    parser = CommandParser(
        prog="nanscope demo",
        description="Watch a fit diverge, be diagnosed, and be fixed: an ad-click value model "
        "whose spend_usd column holds raw dollars, fit at lr 1.0, stopped before the first inf "
        "as step_size_too_large; then the tenfold lr cut on standardised features, and the fit "
        "at the lr that worked, recorded in the ledger.",
    )
    parser.add_argument("--no-color", action="store_true")
    parser.add_argument("--run-dir", metavar="DIR", help="where the demo's runs go")
    args = parser.parse_args(argv)
    check_folder(args.run_dir, "--run-dir")
    root = Path(args.run_dir) if args.run_dir else None
    color = False if args.no_color else None
    remembered = _remembered()
    if remembered:
        _say(remembered, "nanscope remembers: ")
        _say()
    X, y = ad_clicks()
    width = columns(sys.stdout)
    _say("nanscope demo: an ad-click value model, least squares, full-batch gradient descent.")
    _say(f"{len(y)} ads; features {', '.join(COLUMNS)}; spend_usd holds raw dollars "
         f"(max {X[:, 0].max():,.0f}).", "  ")  # fmt: skip
    _say()
    _say("1) lr = 1.0 on the raw features")
    monitor = Monitor(name="demo-lr1", run_dir=None if root is None else root / "lr1")
    diagnosis: Diagnosis | None = None
    try:
        fit_value_model(X, y, 1.0, monitor)
        diagnosis = monitor.close()
    except DivergenceError as stop:
        diagnosis = stop.diagnosis
        step = stop.diagnosis.step if stop.diagnosis else "?"
        _say(f"stopped: DivergenceError at update {step} (before any weight became inf)",
             "   ")  # fmt: skip
    assert diagnosis is not None
    print_report(diagnosis, monitor.trace, file=sys.stdout, color=color)
    _say()
    _say("the decisive experiment: standardise spend_usd as the report says, then cut the "
         "learning rate tenfold and tenfold again (50 updates each)", "2) ")  # fmt: skip
    mean, std = X.mean(axis=0), X.std(axis=0)
    Xs = (X - mean) / std
    result = sweep(lambda lr, mon: fit_value_model(Xs, y, lr, mon), lrs=[1.0, 0.1, 0.01],
                   updates=50)  # fmt: skip
    phrases = [r.phrase() for r in result.results]
    room = max(len(p) for p in phrases)
    for r, phrase in zip(result.results, phrases):
        head = f"   lr {r.lr:<5g} {phrase:<{room}}  "
        fit = 40 if width is None else max(8, min(40, width - len(head)))
        curve = sparkline([math.nan if v is None else v for v in r.losses], width=fit)
        _say(head + curve)
    _say(result.text(), "   -> ")
    diagnosis.extra["experiment"] = result.to_dict()
    best = result.recommended_lr or 0.01
    _say()
    _say(f"the fix: standardised features, lr = {best:g}, 400 updates", "3) ")
    good = Monitor(name=f"demo-lr{best:g}", run_dir=None if root is None else root / "fixed")
    fit_value_model(Xs, y, best, good, updates=400)
    healthy = good.close()
    loss = good.trace.column("loss")
    label = "   loss per update: "
    fit = 60 if width is None else max(8, min(60, width - len(label)))
    _say(label + sparkline(loss, width=fit))
    _say(f"{healthy.headline()}; loss {loss[0]:.4g} -> {loss[-1]:.4g}", "   ")
    _record(diagnosis, monitor, best)
    _say()
    _say("Same model, same loss, same rows: only the step size and the feature scale "
         "changed.")  # fmt: skip
    return 0


def _remembered() -> str | None:
    try:
        from nanscope.ledger import remembered_line
    except ImportError:  # pragma: no cover - the ledger ships with nanscope
        return None
    return remembered_line(__file__)


def _record(diagnosis: Diagnosis, monitor: Monitor, lr: float) -> None:
    try:
        from nanscope.ledger import record_diagnosis
    except ImportError:  # pragma: no cover
        return
    if record_diagnosis(diagnosis, monitor, script=__file__, lr=1.0) is not None:
        _say(f"recorded in the ledger: lr {lr:g} worked (see `nanscope history`)", "   ")
