"""Each check: a case it flags and a case it does not."""

from __future__ import annotations

import numpy as np
import pandas as pd
import polars as pl
import pytest

from nanscope.data import scan


def codes(report, column=None):
    return sorted({f.code for f in report.findings if column is None or f.column == column})


def only(report, code):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, report.findings
    return found[0]


def test_healthy_data_is_clean(healthy):
    report = scan(pd.DataFrame(healthy), target="y")
    assert report.findings == []
    assert report.ok and report.exit_code == 0


def test_s001_nan_rows(healthy):
    healthy["a"][[3, 700, 1999]] = np.nan
    f = only(scan(pd.DataFrame(healthy), target="y"), "S001")
    assert (f.column, f.count, f.rows, f.severity) == ("a", 3, (3, 700, 1999), "error")
    assert "3 NaN values" in f.message and f.fix


def test_s001_lists_only_first_rows():
    x = np.zeros(100)
    x[::2] = np.nan
    f = only(scan(pd.DataFrame({"x": x, "z": np.arange(100.0)}), max_rows=4), "S001")
    assert f.count == 50 and f.rows == (0, 2, 4, 6)


def test_s002_inf_both_signs(healthy):
    healthy["b"][10] = np.inf
    healthy["b"][20] = -np.inf
    f = only(scan(pd.DataFrame(healthy)), "S002")
    assert f.rows == (10, 20) and f.data["posinf"] == 1 and f.data["neginf"] == 1
    assert "S002" not in codes(scan(pd.DataFrame({"b": np.arange(5.0), "c": np.ones(5) * 2})))


def test_s003_nulls(healthy):
    df = pl.DataFrame(healthy).with_columns(
        pl.when(pl.int_range(pl.len()).is_in([5, 6])).then(None).otherwise(pl.col("c")).alias("c")
    )
    f = only(scan(df, target="y"), "S003")
    assert f.column == "c" and f.rows == (5, 6) and f.count == 2
    assert "S003" not in codes(scan(pl.DataFrame(healthy), target="y"))


def test_s004_unscaled_money_column(healthy):
    healthy["price"] = np.random.default_rng(1).normal(20_000, 5_000, 2000)
    f = only(scan(pd.DataFrame(healthy), target="y"), "S004")
    assert f.column == "price" and f.severity == "warning"
    assert 2_000 < f.data["factor"] < 50_000


def test_s004_is_scale_free(healthy):
    df = pd.DataFrame(healthy).drop(columns=["d", "y"]) * 1e6  # everything large: nothing dwarfs
    assert "S004" not in codes(scan(df))


def test_s005_constant_and_near_constant(healthy):
    healthy["k"] = np.full(2000, 7.0)
    healthy["nk"] = 1.0 + 1e-9 * np.random.default_rng(2).normal(size=2000)
    report = scan(pd.DataFrame(healthy), target="y")
    assert codes(report, "k") == ["S005"] and codes(report, "nk") == ["S005"]
    assert "zero std" in next(f for f in report.findings if f.column == "k").message
    assert "S005" not in codes(scan(pd.DataFrame(healthy).drop(columns=["k", "nk"]), target="y"))


def test_s006_extreme_row_with_index(healthy):
    healthy["a"][1234] = 5e4
    f = only(scan(pd.DataFrame(healthy), target="y"), "S006")
    assert f.column == "a" and f.rows == (1234,) and f.severity == "warning"
    assert f.data["worst_row"] == 1234 and f.data["worst_z"] > 1e4


def test_s006_mad_zero_falls_back():
    x = np.zeros(1000)
    x[[10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160]] = 1.0
    x[[200, 300]] = [0.5, -0.5]
    x[999] = 1e6
    report = scan(pd.DataFrame({"x": x, "z": np.random.default_rng(0).normal(size=1000)}))
    f = only(report, "S006")
    assert f.column == "x" and 999 in f.rows and f.data["scale_method"] != "mad"


def test_s006_heavy_tail_is_info_and_two_valued_skipped():
    rng = np.random.default_rng(3)
    heavy = rng.standard_cauchy(5000)
    sparse = (rng.random(5000) < 0.002).astype(float)
    report = scan(pd.DataFrame({"heavy": heavy, "sparse": sparse, "z": rng.normal(size=5000)}))
    assert [f.severity for f in report.findings if f.code == "S006"] == ["info"]
    assert report.ok
    assert codes(report, "sparse") == []


def test_s007_target_outside_unit_interval(healthy):
    healthy["y"] = healthy["y"].astype(float)
    healthy["y"][[4, 8]] = 2.0
    f = only(scan(pd.DataFrame(healthy), target="y"), "S007")
    assert f.rows == (4, 8) and f.severity == "error"


def test_s007_plus_minus_one_labels(healthy):
    healthy["y"] = np.where(healthy["y"] == 1, 1, -1)
    f = only(scan(pd.DataFrame(healthy), target="y"), "S007")
    assert "-1/+1" in f.message


def test_s007_quiet_for_regression_target(healthy):
    healthy["y"] = np.random.default_rng(5).normal(50, 10, 2000)
    assert "S007" not in codes(scan(pd.DataFrame(healthy), target="y"))


def test_s008_negative_and_out_of_range_labels(healthy):
    healthy["y"] = np.random.default_rng(6).integers(0, 4, 2000)
    healthy["y"][[9, 99]] = -1
    f = only(scan(pd.DataFrame(healthy), target="y"), "S008")
    assert f.rows == (9, 99) and f.data["problem"] == "out-of-range"
    healthy["y"][[9, 99]] = [0, 5]
    f = only(scan(pd.DataFrame(healthy), target="y", num_classes=4), "S008")
    assert f.rows == (99,)


def test_s008_non_integer_and_one_based(healthy):
    y = np.random.default_rng(7).integers(0, 5, 2000).astype(float)
    y[77] = 2.5
    healthy["y"] = y
    f = only(scan(pd.DataFrame(healthy), target="y", loss="ce"), "S008")
    assert f.data["problem"] == "non-integer" and f.rows == (77,)
    healthy["y"] = np.random.default_rng(7).integers(1, 6, 2000)
    f = only(scan(pd.DataFrame(healthy), target="y"), "S008")
    assert f.data["problem"] == "one-based"
    healthy["y"] = healthy["y"] - 1
    assert "S008" not in codes(scan(pd.DataFrame(healthy), target="y"))


def test_s009_constant_target(healthy):
    healthy["y"] = np.zeros(2000)
    report = scan(pd.DataFrame(healthy), target="y")
    assert codes(report, "y") == ["S009"]


def test_s010_duplicate_columns_with_nan(healthy):
    healthy["a"][5] = np.nan
    healthy["a2"] = healthy["a"].copy()
    healthy["a3"] = healthy["a"].copy()
    healthy["a3"][6] += 1e-6  # same-looking but different: not a duplicate
    report = scan(pd.DataFrame(healthy), target="y")
    dup = [f for f in report.findings if f.code == "S010"]
    assert [(f.column, f.data["duplicate_of"]) for f in dup] == [("a2", "a")]


def test_s011_text_column_skipped(healthy):
    df = pd.DataFrame(healthy)
    df["city"] = "Paris"
    report = scan(df, target="y")
    f = only(report, "S011")
    assert f.column == "city" and f.severity == "info" and "is text, skipped" in f.message
    assert report.ok and report.columns["a"].n_finite == 2000


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e9])
def test_thresholds_are_scale_free(scale):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3000, 3))
    x[42, 1] = 80.0
    report = scan(x * scale)
    assert [(f.code, f.column, f.rows) for f in report.findings] == [("S006", "1", (42,))]
