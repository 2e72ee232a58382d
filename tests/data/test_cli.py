"""``nanscope scan`` through the real dispatcher: exit codes, JSON, plain text."""

from __future__ import annotations

import json

import numpy as np
import polars as pl

from nanscope.cli import main


def write(tmp_path, **cols):
    path = tmp_path / "d.parquet"
    pl.DataFrame(cols).write_parquet(path)
    return path


def test_clean_exit_0(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = write(tmp_path, a=rng.normal(size=300), y=rng.integers(0, 2, 300))
    assert main(["scan", str(path), "--target", "y", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "clean" in out and "\x1b[" not in out


def test_findings_exit_1_and_json(tmp_path, capsys):
    a = np.random.default_rng(0).normal(size=300)
    a[11] = np.nan
    path = write(tmp_path, a=a, b=a * 2 + 1)
    js = tmp_path / "r.json"
    assert main(["scan", str(path), "--json", str(js)]) == 1
    out = capsys.readouterr().out
    assert "S001" in out and "row 11" in out and "fix:" in out
    d = json.loads(js.read_text())
    assert d["schema"] == "nanscope.scan/1" and d["findings"][0]["rows"] == [11]


def test_json_stdout(tmp_path, capsys):
    path = write(tmp_path, a=[1.0, float("inf"), 3.0], b=[0.5, 0.1, 0.2])
    assert main(["scan", str(path), "--json", "-"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["columns"]["a"]["max"] == 3.0 and d["findings"][0]["code"] == "S002"


def test_bad_input_exit_2(tmp_path, capsys):
    (tmp_path / "r.csv").write_text("a,b\n1,2\n3,4,5\n")
    assert main(["scan", str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err
    assert "ragged rows" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["scan", str(tmp_path / "missing.parquet")]) == 2
    assert main(["scan"]) == 2


def test_info_only_is_exit_0(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("name,x,z\nann,1.5,3\nbob,2.5,1\ncy,0.5,2\n")
    assert main(["scan", str(path), "--no-color"]) == 0


def test_rich_render_has_tables():
    from nanscope.data import render, scan

    x = np.random.default_rng(0).normal(size=(50, 2))
    x[3, 0] = np.nan
    text = render(scan(x), color=True, width=140)
    assert "findings" in text and "columns" in text and "\x1b[" in text and "S001" in text
