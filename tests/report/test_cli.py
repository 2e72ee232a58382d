"""``nanscope report``: run directories, traces, logs; exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nanscope.cli import main as nanscope_main

FIXTURES = Path(__file__).resolve().parents[1] / "logs" / "fixtures"


def test_run_dir_default_output(diverging_run: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(diverging_run, run)
    assert nanscope_main(["report", str(run)]) == 0
    out = run / "report.html"
    assert capsys.readouterr().out.strip() == str(out)
    page = out.read_text()
    assert "step_size_too_large" in page and 'id="plot-loss"' in page


def test_run_dir_without_diagnosis_is_diagnosed(nan_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(nan_run, run)
    (run / "diagnosis.json").unlink()
    (run / "last_good.npz").unlink(missing_ok=True)
    out = tmp_path / "o" / "page.html"
    assert nanscope_main(["report", str(run), "-o", str(out), "--no-plots"]) == 0
    page = out.read_text()
    assert 'data-verdict="nonfinite"' in page and 'id="plots"' not in page


@pytest.mark.slow
def test_trace_file_with_pngs(diverging_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.html"
    code = nanscope_main(["report", str(diverging_run / "trace.jsonl"), "-o", str(out),
                          "--png", str(tmp_path / "png")])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out.split()
    assert printed[0] == str(out) and str(tmp_path / "png" / "loss.png") in printed
    assert (tmp_path / "png" / "grad_norm.png").stat().st_size > 1000


def test_text_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert nanscope_main(["report", str(FIXTURES / "seed_000_epochs.txt"), "--no-plots"]) == 0
    page = (tmp_path / "report.html").read_text()
    assert 'data-verdict="nonfinite"' in page and "epoch 85" in page


def test_diagnosis_json_path(diverging_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    args = ["report", str(diverging_run / "diagnosis.json"), "-o", str(out), "--no-plots"]
    assert nanscope_main(args) == 0
    page = out.read_text()
    assert json.loads((diverging_run / "diagnosis.json").read_text())["cause"] in page


@pytest.mark.parametrize(
    "args",
    [
        ["report"],
        ["report", "/no/such/run"],
        ["report", "--bogus", "x"],
    ],
)
def test_bad_input_exits_2(args: list[str], capsys) -> None:
    assert nanscope_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("nanscope report: error:") and "Traceback" not in err


def test_unreadable_files_exit_2(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    empty_dir = tmp_path / "nothing"
    empty_dir.mkdir()
    for path in (empty, binary, empty_dir):
        assert nanscope_main(["report", str(path), "-o", str(tmp_path / "x.html")]) == 2
    assert not (tmp_path / "x.html").exists()


def test_help_exits_0(capsys) -> None:
    assert nanscope_main(["report", "--help"]) == 0
    assert "--png" in capsys.readouterr().out
