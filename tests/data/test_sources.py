"""Every file format, directories, and bad input (InputError / exit 2, or a finding)."""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pytest

from nanscope.data import scan
from nanscope.errors import InputError, UsageError


@pytest.fixture
def frame() -> pl.DataFrame:
    rng = np.random.default_rng(0)
    a = rng.normal(size=500)
    a[[7, 300]] = np.nan
    return pl.DataFrame({"a": a, "b": rng.normal(size=500), "y": rng.integers(0, 2, 500)})


@pytest.mark.parametrize("ext", ["csv", "tsv", "parquet", "feather", "arrow"])
def test_formats_find_the_nan_rows(tmp_path, frame, ext):
    path = tmp_path / f"d.{ext}"
    if ext in ("csv", "tsv"):
        frame.write_csv(path, separator="\t" if ext == "tsv" else ",")
    elif ext == "parquet":
        frame.write_parquet(path)
    else:
        frame.write_ipc(path)
    report = scan(path, target="y")
    f = report.findings[0]
    assert (f.code, f.column, f.rows) == ("S001", "a", (7, 300)) and report.n_rows == 500


def test_npy_and_npz(tmp_path):
    x = np.random.default_rng(0).normal(size=(100, 3))
    x[5, 2] = np.inf
    np.save(tmp_path / "x.npy", x)
    f = scan(tmp_path / "x.npy").findings[0]
    assert (f.code, f.column, f.rows) == ("S002", "2", (5,))
    np.savez(tmp_path / "d.npz", X=x, y=np.full(100, 3.0))
    report = scan(tmp_path / "d.npz")
    assert report.target == "y" and {f.code for f in report.findings} == {"S002", "S009"}


def test_directory_rows_are_global(tmp_path, frame):
    d = tmp_path / "parts"
    d.mkdir()
    frame.slice(0, 250).write_parquet(d / "p0.parquet")
    frame.slice(250, 250).write_parquet(d / "p1.parquet")
    report = scan(d, target="y")
    assert report.findings[0].rows == (7, 300) and len(report.files) == 2
    frame.slice(0, 10).write_csv(d / "p2.csv")  # mixed formats are concatenated too
    assert scan(d, target="y").n_rows == 510


def test_missing_unknown_empty(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        scan(tmp_path / "nope.csv")
    (tmp_path / "x.xlsx").write_bytes(b"PK")
    with pytest.raises(InputError, match=r"unknown file type .\.xlsx."):
        scan(tmp_path / "x.xlsx")
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(InputError, match="empty"):
        scan(tmp_path / "e.csv")
    (tmp_path / "h.csv").write_text("a,b\n")
    with pytest.raises(InputError, match="no rows"):
        scan(tmp_path / "h.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no data files"):
        scan(tmp_path / "empty")


def test_corrupt_parquet(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"not a parquet file at all")
    with pytest.raises(InputError, match=r"bad\.parquet: cannot be read"):
        scan(tmp_path / "bad.parquet")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read anything")
def test_unreadable(tmp_path):
    p = tmp_path / "locked.csv"
    p.write_text("a\n1\n")
    p.chmod(0)
    with pytest.raises(InputError, match="permission"):
        scan(p)


def test_ragged_csv(tmp_path):
    (tmp_path / "r.csv").write_text("a,b\n1,2\n3,4,5\n6,7\n")
    with pytest.raises(InputError, match="ragged rows"):
        scan(tmp_path / "r.csv")


def test_text_columns(tmp_path):
    (tmp_path / "t.csv").write_text("name,x\nann,1.5\nbob,2.5\ncy,0.5\n")
    report = scan(tmp_path / "t.csv")
    assert [(f.code, f.column) for f in report.findings] == [("S011", "name")]
    (tmp_path / "all.csv").write_text("name\nann\nbob\n")
    with pytest.raises(InputError, match="no numeric columns"):
        scan(tmp_path / "all.csv")


def test_late_text_in_numeric_csv_column_is_read_as_text(tmp_path):
    lines = ["x,z"] + [f"{i}.5,{i}" for i in range(12_000)] + ["oops,1"]
    (tmp_path / "late.csv").write_text("\n".join(lines) + "\n")
    report = scan(tmp_path / "late.csv")
    assert [(f.code, f.column) for f in report.findings] == [("S011", "x")]


def test_bad_target_and_object():
    with pytest.raises(UsageError, match="target 'q' is not a column"):
        scan(np.zeros((5, 2)), target="q")
    with pytest.raises(InputError, match="cannot scan an object of type set"):
        scan({1, 2})
    with pytest.raises(InputError, match="different lengths"):
        scan((np.zeros((5, 2)), np.zeros(4)))


def test_savetxt_nan_words_are_floats_and_their_rows_reported(tmp_path):
    # np.savetxt writes lowercase nan/inf, which Polars' inference alone takes for text
    rng = np.random.default_rng(4)
    table = rng.normal(size=(300, 2))
    table[[11, 250], 0] = np.nan
    table[99, 1] = -np.inf
    path = tmp_path / "d.csv"
    np.savetxt(path, table, delimiter=",", header="a,b", comments="")
    report = scan(path)
    assert report.columns["a"].kind == "float" and report.columns["a"].n_nan == 2
    by_code = {f.code: f for f in report.findings}
    assert by_code["S001"].rows == (11, 250) and by_code["S002"].rows == (99,)
    assert "S011" not in by_code


def test_a_column_that_only_starts_as_numbers_stays_text(tmp_path):
    lines = ["a,b"] + [f"{i}.5,nan" for i in range(20)] + ["3,not a number"]
    path = tmp_path / "d.csv"
    path.write_text("\n".join(lines) + "\n")
    report = scan(path)
    assert report.columns["b"].kind != "float"  # a real word later: text after all
    assert any(f.code == "S011" and f.column == "b" for f in report.findings)


def test_invalid_utf8_cells_are_empty_and_row_numbers_kept(tmp_path):
    rows = [f"{i}.0,{i * 2}.0" for i in range(40)]
    rows[3] = "\udcff\udcfe,6.0"  # bytes that are not UTF-8 in row 3 (file line 5)
    rows[20] = "nan,40.0"
    path = tmp_path / "d.csv"
    path.write_bytes(("a,b\n" + "\n".join(rows) + "\n").encode("utf-8", "surrogateescape"))
    with pytest.warns(UserWarning, match="1 row holds bytes that are not UTF-8"):
        report = scan(path)
    assert report.n_rows == 40, "every row is scanned"
    assert report.columns["a"].n_null == 1 and report.columns["b"].n_null == 0
    by_code = {f.code: f for f in report.findings}
    assert by_code["S003"].rows == (3,) and by_code["S001"].rows == (20,)  # row numbers unchanged
    assert report.notes and "file line 5" in report.notes[0]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"a,b\n1,2\n\x00\x01\x02", "binary"),
        (bytes(range(1, 256)) * 30, "CSV text"),
        (b"x" * (2 << 20), "first line"),
        (b"\xff\xfeh\x00e\x00", "binary"),
    ],
)
def test_files_that_are_not_csv_text_are_refused(tmp_path, content, needle):
    path = tmp_path / "d.csv"
    path.write_bytes(content)
    with pytest.raises(InputError, match=needle):
        scan(path)
