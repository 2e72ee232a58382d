"""The page: sections in order, numbers shown, self-contained, every kind of trace."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

import nanscope
from nanscope.diagnose.diagnosis import Diagnosis, Evidence
from nanscope.loading import load
from nanscope.report.html import diagnosis_fragment, render_report, write_report
from nanscope.trace import Trace

FIXTURES = Path(__file__).resolve().parents[1] / "logs" / "fixtures"


def _figure(page: str, key: str) -> str:
    match = re.search(rf'<figure class="plot" id="plot-{key}"[^>]*>', page)
    assert match, f"no plot {key}"
    return match.group(0)


def _attr(tag: str, name: str) -> str:
    match = re.search(rf'{name}="([^"]*)"', tag)
    assert match, f"no {name} in {tag}"
    return match.group(1)


def assert_self_contained(page: str) -> None:
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page.lower()
    assert "<link" not in page.lower()
    assert "@import" not in page and "url(" not in page
    srcs = re.findall(r'src="([^"]*)"', page)
    assert all(s.startswith("data:image/") for s in srcs), srcs
    assert "Content-Security-Policy" in page and "default-src 'none'" in html.unescape(page)


def test_diverging_run_page_order_and_numbers(diverging_run: Path) -> None:
    trace = nanscope.read_trace(diverging_run)
    diagnosis = Diagnosis.from_dict(json.loads((diverging_run / "diagnosis.json").read_text()))
    page = render_report(trace, diagnosis)
    assert_self_contained(page)
    assert 'class="verdict verdict-diverging"' in page
    assert 'data-cause="step_size_too_large"' in page
    # verdict, evidence, actions, plots: in that order
    positions = [page.index(s) for s in ('id="verdict"', 'id="evidence"', 'id="actions"',
                                         'id="plots"', 'id="run"')]  # fmt: skip
    assert positions == sorted(positions)
    # the evidence numbers and the first action are on the page
    growth = next(e.data["growth"] for e in diagnosis.evidence if "growth" in (e.data or {}))
    assert f'<span class="key">growth</span> {growth:.3g}' in page and "D001" in page
    assert "<ol class=\"actions\"><li>Cut the learning rate tenfold" in page
    # (the run is stopped at its third update: the direction panels hold data only where a
    # sample was taken, and are drawn only then)
    keys = [k for k in ("loss", "grad_norm", "update_ratio", "flip_frac")
            if f'id="plot-{k}"' in page]  # fmt: skip
    assert keys[:2] == ["loss", "grad_norm"]
    for key in keys:
        tag = _figure(page, key)
        assert _attr(tag, "data-detect-step") == str(diagnosis.step)
    # the learning rate was constant: a note, no panel
    assert 'id="plot-lr"' not in page
    assert "learning rate 0.5 at every update" in page
    # every panel shares one x range, so the plots line up update for update
    xlims = {json.dumps(json.loads(_attr(_figure(page, k), "data-plot").replace("&quot;", '"'))
                        ["xlim"]) for k in keys}  # fmt: skip
    assert len(xlims) == 1


def test_nonfinite_run_marks_the_nan_where_it_happened(nan_run: Path) -> None:
    trace = nanscope.read_trace(nan_run)
    diagnosis = nanscope.diagnose(trace)
    stored = json.loads((nan_run / "diagnosis.json").read_text())
    page = render_report(trace, stored)
    assert_self_contained(page)
    assert 'class="verdict verdict-nonfinite"' in page
    first_nan = next(r["step"] for r in trace.records if r["loss"] != r["loss"])
    assert first_nan == stored["first_nonfinite"]["step"] == 31
    for key in ("loss", "grad_norm"):
        assert _attr(_figure(page, key), "data-marks") == str(first_nan)
    assert "non-finite at update 31-40 (nan)" in page
    # the bad row, with its dataset index and column
    assert 'id="rows"' in page and "<td class=\"num\">300</td>" in page
    # per-layer gradient norms are plotted next to the global one
    meta = json.loads(_attr(_figure(page, "grad_norm"), "data-plot").replace("&quot;", '"'))
    assert meta["lines"] == ["global", "a", "b"]
    assert diagnosis.cause == "nonfinite_input"


def test_healthy_run(healthy_run: Path) -> None:
    trace = nanscope.read_trace(healthy_run)
    page = render_report(trace, nanscope.diagnose(trace))
    assert_self_contained(page)
    assert 'class="verdict verdict-healthy"' in page
    assert _attr(_figure(page, "loss"), "data-marks") == ""
    assert _attr(_figure(page, "loss"), "data-detect-step") == ""


def test_epoch_text_log() -> None:
    from nanscope.logs import load_trace

    trace = load_trace(FIXTURES / "seed_000_epochs.txt")
    page = render_report(trace, nanscope.diagnose(trace))
    assert_self_contained(page)
    assert _attr(_figure(page, "loss"), "data-marks") == "85"
    assert "non-finite at epoch 85" in page
    assert "per update (not per epoch)" in page


def test_only_a_loss_and_hidden_nan() -> None:
    records = [{"step": i, "loss": 1.0 / i} for i in range(1, 20)]
    records[12] = {"step": 13, "loss": 0.0, "events": ["loss_nan_filtered"]}
    records[15]["loss"] = float("inf")
    trace = Trace(records)
    page = render_report(trace, nanscope.diagnose(trace))
    assert_self_contained(page)
    assert _attr(_figure(page, "loss"), "data-marks") == "13,16"
    assert 'id="plot-grad_norm"' not in page  # nothing to draw there


def test_sections_from_extras(tmp_path: Path) -> None:
    source = tmp_path / "train.py"
    source.write_text(
        "import numpy as np\n\n\ndef loss(p, y):\n    return -np.mean(y * np.log(p))\n"
    )
    diagnosis = Diagnosis(
        verdict="nonfinite", cause="log_of_zero", confidence=0.9, step=7,
        first_nonfinite={"step": 7, "what": "loss"},
        evidence=[Evidence("D005", "the first non-finite op is log", {"op": "log"})],
        actions=["Compute the loss from logits."],
        located={"phase": "forward", "op": "aten::log", "module": "model.head",
                 "source": {"file": str(source), "line": 5}},
        rows=[{"batch_row": 3, "dataset_row": 1203, "column": "price", "value": 1e300,
               "why": "extreme"}],
        extra={
            "scan": {"source": "data.csv", "n_rows": 10, "findings": [
                {"code": "S001", "severity": "error", "column": "price", "count": 2,
                 "rows": [4, 9], "message": "2 NaN values", "fix": "impute them"}]},
            "experiment": {"text": "lr 1 diverged at update 7; 0.1 descended; use 0.1",
                           "recommended_factor": 0.1, "base_lr": 1.0, "results": [
                {"factor": 1.0, "lr": 1.0, "outcome": "diverged", "at_update": 7,
                 "final_loss": None},
                {"factor": 0.1, "lr": 0.1, "outcome": "descended", "final_loss": 0.02}]},
            "lint": [{"code": "L001", "path": str(source), "line": 5,
                      "message": "log of a probability", "fix": "use log_softmax"}],
        },
    )  # fmt: skip
    records = [{"step": i, "loss": 1.0, "lr": 0.1} for i in range(1, 10)]
    records[3]["events"] = ["rollback"]
    records[5]["extra"] = {"rollback": {"to_step": 4, "lr": 0.05}}
    page = render_report(Trace(records), diagnosis, plots=False)
    assert_self_contained(page)
    order = ['id="verdict"', 'id="evidence"', 'id="actions"', 'id="located"',
             'id="rows"', 'id="lint"', 'id="scan"', 'id="sweep"', 'id="rollbacks"']  # fmt: skip
    positions = [page.index(s) for s in order]
    assert positions == sorted(positions)
    # the source line with its neighbours, the located line highlighted
    assert '<span class="hit"><span class="ln">    5</span>' in page
    assert "-np.mean(y * np.log(p))" in page and "def loss(p, y):" in page
    assert "aten::log" in page and "model.head" in page
    assert "1203" in page and "price" in page and "S001" in page and "L001" in page
    sweep = page[page.index('id="sweep"'):page.index('id="rollbacks"')]
    assert "diverged_at" in sweep and "<td class=\"num\">7</td>" in sweep and "use this" in sweep
    assert "Rollbacks (2)" in page and "to_step=4" in page


def test_located_source_not_readable_still_renders() -> None:
    source = {"file": "/nonexistent/x.py", "line": 9}
    diagnosis = {"verdict": "nonfinite", "cause": "zero_division", "step": 3,
                 "located": {"op": "div", "source": source}}  # fmt: skip
    page = render_report(Trace([{"step": 1, "loss": 1.0}]), diagnosis, plots=False)
    assert "/nonexistent/x.py:9" in page and "not readable here" in page


@pytest.mark.slow
def test_write_report_and_pngs(diverging_run: Path, tmp_path: Path) -> None:
    trace = load(diverging_run / "trace.jsonl")
    out = write_report(trace, nanscope.diagnose(trace), tmp_path / "sub" / "r.html",
                       png_dir=tmp_path / "png")  # fmt: skip
    assert out == tmp_path / "sub" / "r.html" and out.read_text().startswith("<!DOCTYPE html>")
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    # (the sign-flip fraction was measured at one update: a note, not a picture of one dot)
    assert names == ["grad_norm.png", "loss.png", "update_ratio.png"]
    # the page renders what it is given: a path is refused, not read
    with pytest.raises(TypeError, match=r"loading\.load"):
        write_report(diverging_run / "trace.jsonl", None, tmp_path / "x.html")  # type: ignore[arg-type]
    assert all((tmp_path / "png" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_fragment_for_jupyter(nan_run: Path) -> None:
    diagnosis = Diagnosis.from_dict(json.loads((nan_run / "diagnosis.json").read_text()))
    fragment = diagnosis._repr_html_()
    assert fragment == diagnosis_fragment(diagnosis)
    assert fragment.startswith('<div class="nanscope-diagnosis" data-verdict="nonfinite"')
    assert "nonfinite_input" in fragment and "<ol" in fragment and "<img" not in fragment
    assert "<style" not in fragment and "<script" not in fragment


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e300, 0.0, 12, "x"])
def test_numbers_are_readable(value: object) -> None:
    from nanscope.report.html import fmt_number

    text = fmt_number(value)
    assert text in ("nan", "inf", "1e+300", "0", "12", "x")
