"""The page a person would rather read than the terminal: readable numbers, code set as code,
only plots that say something, the run's script as title, and the source snippet kept when the
report is made from another folder. Plain-HTML assertions: they run without a browser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.diagnose.diagnosis import Diagnosis
from nanscope.report.html import render_report

ROOT = Path(__file__).resolve().parents[2]


def _section(page: str, sid: str) -> str:
    match = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert match, f"no section {sid}"
    return match.group(1)


def test_the_numbers_column_holds_no_python_repr(nan_run: Path) -> None:
    trace = nanscope.read_trace(nan_run)
    diagnosis = Diagnosis.from_dict(json.loads((nan_run / "diagnosis.json").read_text()))
    # the evidence holds a list of row dicts: it must read as names and values
    assert any(isinstance(e.data.get("rows"), list) for e in diagnosis.evidence)
    evidence = _section(render_report(trace, diagnosis, plots=False), "evidence")
    assert "{&#x27;" not in evidence and "&#x27;: " not in evidence and "{'" not in evidence
    assert '<span class="key">dataset_row</span> 300' in evidence
    assert '<span class="key">column</span> 1' in evidence


def test_backticks_are_set_as_code(nan_run: Path) -> None:
    diagnosis = Diagnosis.from_dict(json.loads((nan_run / "diagnosis.json").read_text()))
    assert any("`nanscope scan DATA`" in a for a in diagnosis.actions)
    page = render_report(None, diagnosis)
    actions = _section(page, "actions")
    assert "<code>nanscope scan DATA</code>" in actions and "`" not in actions
    # and text around it stays escaped
    assert "<code><" not in actions


def test_a_one_update_run_draws_no_empty_axes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X, y, w = rng.normal(size=(32, 3)), rng.normal(size=32), np.zeros(3)
    mon = nanscope.Monitor(run_dir=tmp_path / "run")
    residual = X @ w - y
    mon.update(float(np.mean(residual**2)), params={"w": w}, grads={"w": X.T @ residual / 16},
               lr=0.1, inputs=X, targets=y)  # fmt: skip
    diagnosis = mon.close()
    page = render_report(mon.trace, diagnosis)
    plots = _section(page, "plots")
    assert "<figure" not in plots and "one update recorded" in plots


def test_the_verdict_words_for_runs_that_are_no_finding() -> None:
    diagnosis = nanscope.Monitor(write=False).close()  # nothing watched
    page = render_report(nanscope.Trace([]), diagnosis)
    assert 'data-verdict="unobserved"' in page and "nothing was watched" in page
    assert 'class="cause">unknown<' not in page


SCRIPT = '''
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(1)
X = torch.randn(300, 6)
y = (X @ torch.randn(6, 1) > 0).float()
y[:3] = 1 - y[:3]
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.1)
for _step in range(500):
    opt.zero_grad()
    p = torch.sigmoid(model(X))
    loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
    loss.backward()
    opt.step()
'''


@pytest.mark.slow
def test_report_from_another_folder_keeps_title_and_source(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "train.py").write_text(SCRIPT)
    env = {**os.environ, "NANSCOPE_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1",
           "NANSCOPE_NO_LEDGER": "1", "PYTHONPATH": str(ROOT / "src")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "nanscope.cli", "run", "--json", str(tmp_path / "d.json"), "--",
         "python", "train.py"],
        capture_output=True, text=True, timeout=240, env=env, cwd=project,
    )  # fmt: skip
    assert (tmp_path / "d.json").is_file(), done.stderr[-3000:]
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["cause"] == "log_of_zero", d
    source = d["located"]["source"]
    # stored absolute: the script was run as the relative `train.py`
    assert os.path.isabs(source["file"]) and Path(source["file"]) == project / "train.py"
    run_dir = Path(d["run"]["dir"])
    done = subprocess.run(
        [sys.executable, "-m", "nanscope.cli", "report", str(run_dir), "-o", "page.html",
         "--no-plots"],
        capture_output=True, text=True, timeout=120, env=env, cwd=elsewhere,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    page = (elsewhere / "page.html").read_text()
    # the title names the script, not the optimizer or the model class
    title = re.search(r"<title>(.*?)</title>", page)
    assert title and title.group(1) == "nanscope report: train.py"
    assert "Adam" not in title.group(1) and "Sequential" not in title.group(1)
    # the snippet around the located line, read from the absolute path
    snippet = re.search(r'<pre class="snippet" id="snippet">(.*?)</pre>', page, re.S)
    assert snippet, "no source snippet"
    hit = re.search(r'<span class="hit"><span class="ln">\s*\d+</span>([^<]*)</span>',
                    snippet.group(1))  # fmt: skip
    assert hit and "torch.log" in hit.group(1)


def test_the_rerun_confirmation_is_shown_when_the_diagnosis_holds_one(nan_run: Path) -> None:
    stored = json.loads((nan_run / "diagnosis.json").read_text())
    stored.pop("confirmation", None)
    page = render_report(None, stored)
    assert 'id="confirmation"' not in page  # no rerun held, no section
    stored["confirmation"] = [
        {"change": "float32", "ran": True, "finite": True, "loss": 0.25,
         "text": "`float32` fixes it"},
        {"change": "lr_x0.1", "ran": False, "finite": None, "loss": None, "text": "not run"},
    ]
    section = _section(render_report(None, stored), "confirmation")
    assert "<td>float32</td><td>finite</td>" in section and "<code>float32</code>" in section
    assert "<td>lr_x0.1</td><td>not run</td>" in section
