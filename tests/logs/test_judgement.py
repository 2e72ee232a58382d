"""Logs judged with what a log can and cannot show; errors that name the line; a long log read
in bounded memory whether its rows come as dicts or as columns."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

import nanscope
from nanscope.errors import TraceError
from nanscope.logs import load_trace
from nanscope.logs._common import Columns
from nanscope.logs._thin import thin

from ._fits import classifier


def test_a_layout_nothing_reads_names_its_first_line(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("a b c\n1 2 3\n4 5 6\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert "line 2 could not be read ('1 2 3'" in message
    assert "header on line 1 (a, b, c), which names no loss column" in message
    assert "\n" not in message


def test_a_short_healthy_log_claims_little(tmp_path: Path) -> None:
    fit = classifier(3, lr=0.3)
    path = tmp_path / "train.log"
    path.write_text("".join(f"step {i + 1} loss {v:.4f}\n" for i, v in enumerate(fit.loss)))
    diagnosis = nanscope.diagnose(path)
    assert diagnosis.verdict == "healthy" and diagnosis.confidence <= 0.5
    assert any("too few" in item.text for item in diagnosis.evidence)


def test_a_nan_gradient_norm_is_called_nan(tmp_path: Path) -> None:
    fit = classifier(30, lr=0.3)
    rows = [
        str({"loss": round(loss, 4), "grad_norm": round(grad, 4) if i < 20 else math.nan,
             "learning_rate": round(lr, 6), "epoch": round(i / 100, 2)})
        for i, (loss, grad, lr) in enumerate(zip(fit.loss, fit.grad_norm, fit.lr))
    ]  # fmt: skip
    path = tmp_path / "trainer.out"
    path.write_text("\n".join(rows) + "\n")
    diagnosis = nanscope.diagnose(path)
    assert diagnosis.verdict == "nonfinite" and diagnosis.first_nonfinite["what"] == "grad"
    text = " ".join(item.text for item in diagnosis.evidence)
    assert "nan" in text and "reached inf" not in text and " to inf" not in text


def test_columns_and_dicts_are_thinned_alike() -> None:
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(100, 2000)
        bad = {rng.randrange(n)} if rng.random() < 0.7 else set()
        loss = [math.nan if i in bad else 1.0 / (i + 1) for i in range(n)]
        records = [{"loss": v, "step": i + 1} for i, v in enumerate(loss)]
        for record in records:
            if math.isnan(record["loss"]):
                record["nf_loss"] = 1
        chunks: list[list] = []
        start = 0
        while start < n:
            size = rng.randint(1, 500)
            part = records[start : start + size]
            if rng.random() < 0.5:
                chunks.append([dict(r) for r in part])
            else:
                columns = [[r["loss"] for r in part], [r["step"] for r in part]]
                chunks.append([Columns(["loss", "step"], columns, len(part))])
            start += size
        budget = rng.randint(40, 600)
        meta: dict = {}
        kept = thin(chunks, budget, meta)
        alike = thin([[dict(r) for r in records]], budget, {})
        assert kept == alike
        if n > budget:
            window = meta["thinned"]["window"]
            assert meta["thinned"]["of"] == n and len(kept) <= budget + 2 * window
            if bad:  # the first NaN and the window before it are kept whole
                first = min(bad) + 1
                steps = {r["step"] for r in kept}
                assert set(range(max(1, first - window), first + 1)) <= steps


def test_a_skipped_step_is_no_failure_only_once_the_fit_recovered() -> None:
    fit = classifier(12, lr=0.3)
    records = [{"step": i + 1, "loss": v} for i, v in enumerate(fit.loss)]
    skipped = {"loss": math.nan, "nf_loss": 1, "events": ["skipped_step"],
               "extra": {"skipped_step": True, "loss_scale": 32768.0}}  # fmt: skip
    recovered = [*records[:5], {"step": 6, **skipped}, *records[6:]]
    assert nanscope.diagnose(recovered).verdict == "healthy"
    # a live run stopped at a skipped NaN (nothing after it): that is where it broke
    stopped = [*records[:5], {"step": 6, **skipped}]
    assert nanscope.diagnose(stopped).first_nonfinite == {"step": 6, "what": "loss"}
