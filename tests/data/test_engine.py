"""The engine's statistics against a slow, obvious reference; findings_for; JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import polars as pl
import pytest

import nanscope.data as data
from nanscope.data import ScanReport, scan
from nanscope.errors import InputError


def test_public_api():
    assert set(data.__all__) == {
        "SCHEMA",
        "ColumnStats",
        "Finding",
        "ScanReport",
        "scan",
        "check_codes",
        "render",
    }
    assert list(data.check_codes()) == [f"S{i:03d}" for i in range(1, 12)]


def test_import_nanscope_does_not_import_polars():
    code = "import sys, nanscope, nanscope.data; print('polars' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_stats_match_numpy_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(5, 3, 5000)
    x[[1, 2]] = np.nan
    x[3] = np.inf
    report = scan(pd.DataFrame({"x": x, "k": rng.integers(0, 100, 5000)}))
    c = report.columns["x"]
    fin = x[np.isfinite(x)]
    assert (c.n_nan, c.n_posinf, c.n_finite) == (2, 1, 4997)
    assert c.min == fin.min() and c.max == fin.max()
    assert math.isclose(c.mean, fin.mean(), rel_tol=1e-12)
    assert math.isclose(c.std, fin.std(ddof=1), rel_tol=1e-9)
    assert c.robust_exact and c.median == np.median(fin)
    assert math.isclose(c.mad, np.median(np.abs(fin - np.median(fin))))


def test_sampled_robust_stats_are_close():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 2, 400_000)
    x[123_456] = 1e5
    report = scan(pl.DataFrame({"x": x, "z": rng.normal(size=400_000)}), sample_rows=50_000)
    c = report.columns["x"]
    assert not c.robust_exact and c.sample_size <= 50_000
    assert abs(c.median) < 0.05 and abs(c.scale - 2) < 0.05
    f = next(f for f in report.findings if f.code == "S006")
    assert f.rows == (123_456,)  # rows beyond the bound are found exactly, not sampled


def test_findings_for_rows_rereads_unlisted_rows():
    x = np.zeros(50)
    x[::5] = np.nan  # 10 NaN rows, only 3 listed
    report = scan(pd.DataFrame({"x": x, "w": np.arange(50.0) * 1e5}), max_rows=3)
    assert report.findings[0].rows == (0, 5, 10)
    hit = report.findings_for(rows=[25, 26])
    nan = [f for f in hit if f.code == "S001"]
    assert nan and nan[0].rows == (25,)
    assert [f.code for f in report.findings_for(rows=[26]) if f.code == "S001"] == []


def test_findings_for_columns():
    x = np.random.default_rng(0).normal(size=(100, 3))
    x[4, 0] = np.nan
    x[:, 2] *= 1e6
    report = scan(x)
    assert [f.code for f in report.findings_for(columns=["0"])] == ["S001"]
    assert [f.code for f in report.findings_for(columns=["2"])] == ["S004"]
    # column-level findings touch every row
    assert "S004" in [f.code for f in report.findings_for(rows=[77])]


def test_to_dict_is_strict_json():
    x = np.random.default_rng(0).normal(size=(100, 2))
    x[:, 1] = np.nan
    d = scan(x).to_dict()

    def bad(v):
        raise ValueError(v)

    text = json.dumps(d, allow_nan=False)
    loaded = json.loads(text, parse_constant=bad)
    assert loaded["schema"] == "nanscope.scan/1"
    assert loaded["columns"]["1"]["mean"] == "nan"
    assert loaded["findings"][0]["code"] == "S001"


def test_report_is_a_scan_report():
    assert isinstance(scan(np.arange(10.0)), ScanReport)


def test_tuple_of_arrays_sets_target():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = rng.integers(0, 2, 200).astype(float)
    y[3] = -1
    report = scan((X, y))
    assert report.target == "y" and [f.code for f in report.findings] == ["S007"]


def test_torch_dataset():
    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset

    X = torch.randn(300, 3)
    X[17, 2] = float("nan")
    y = torch.randint(0, 2, (300,)).float()
    report = scan(TensorDataset(X, y))
    assert report.target == "y" and "x[2]" in report.columns
    f = report.findings[0]
    assert (f.code, f.column, f.rows) == ("S001", "x[2]", (17,))


def test_progress_bar_does_not_change_the_result(capsys):
    x = np.random.default_rng(0).normal(size=(1000, 2))
    x[9, 1] = np.nan
    report = scan(x, progress=True)
    assert [(f.code, f.rows) for f in report.findings] == [("S001", (9,))]
    assert capsys.readouterr().out == ""  # the bar goes to stderr, never stdout


@pytest.mark.slow
def test_wide_data_finds_its_duplicate_and_unscaled_columns(monkeypatch):
    # 1,200 columns in several pass-1 chunks; the grouping and the sorted-median paths must find
    # the same columns the pairwise comparisons did
    import nanscope.data._engine as engine

    monkeypatch.setattr(engine, "COLUMN_CHUNK", 100)
    rng = np.random.default_rng(8)
    cols = {f"f{i}": rng.normal(size=80) for i in range(1200)}
    cols["f700"] = cols["f3"].copy()  # a join brought f3 in twice
    cols["f1100"] = rng.normal(size=80) * 1e5  # raw dollars among standardised features
    cols["f42"][[5, 9]] = np.nan
    report = scan(pl.DataFrame(cols))
    by_code: dict[str, list[str | None]] = {}
    for f in report.findings:
        by_code.setdefault(f.code, []).append(f.column)
    assert by_code["S010"] == ["f700"]
    assert by_code["S004"] == ["f1100"]
    assert by_code["S001"] == ["f42"] and report.columns["f42"].n_nan == 2
    assert len(report.columns) == 1200


def test_data_wider_than_the_limit_is_refused_in_one_line(monkeypatch):
    import nanscope.data._engine as engine

    monkeypatch.setattr(engine, "MAX_COLUMNS", 50)
    frame = pl.DataFrame({f"c{i}": [1.0, 2.0] for i in range(51)})
    with pytest.raises(InputError, match="51 columns, more than the 50"):
        scan(frame)


@pytest.mark.parametrize("in_memory_cells", [10_000_000, 0])
def test_a_nan_row_in_every_column_of_a_wide_csv(tmp_path, monkeypatch, in_memory_cells):
    # 120 flagged columns: pass 2 in many chunks, read once into memory or streamed from the file
    import nanscope.data._engine as engine

    monkeypatch.setattr(engine, "IN_MEMORY_CELLS", in_memory_cells)
    table = np.random.default_rng(9).normal(size=(30, 120))
    table[4, :] = np.nan
    path = tmp_path / "wide.csv"
    np.savetxt(path, table, delimiter=",", header=",".join(f"c{i}" for i in range(120)),
               comments="")  # fmt: skip
    report = scan(path)
    nan = [f for f in report.findings if f.code == "S001"]
    assert sorted(f.column for f in nan) == sorted(f"c{i}" for i in range(120))
    assert all(f.rows == (4,) for f in nan)
