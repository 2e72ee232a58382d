"""One number format for every report and message (nanscope.formatting)."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from nanscope import formatting
from nanscope.formatting import lr, number, row, value


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(formatting).failed == 0


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.5, "0.5"), (30.3349, "30.33"), (2494037252470475.0, "2.49e+15"), (1e-4, "0.0001"),
        (0.0, "0"), (12, "12"), (np.int64(123456), "123456"), (np.float32(0.25), "0.25"),
        (math.nan, "nan"), (-math.inf, "-inf"), (None, "?"), (True, "true"), ("x", "x"),
    ],
)  # fmt: skip
def test_numbers(x: object, text: str) -> None:
    assert number(x) == text


def test_options_and_learning_rates() -> None:
    assert number(1234567.0, thousands=True) == "1,234,567"
    assert number(math.nan, nan="-") == "-" and number(None, none="") == ""
    assert number(123456.0) == "1.23e+05" and number(123456.0, large=1e6) == "1.235e+05"
    assert [lr(v) for v in (0.1, 1.0, 3e-5, 0.0, 2e-4)] == ["0.1", "1.0", "3e-05", "0.0", "0.0002"]


def test_structured_values_never_show_a_repr() -> None:
    rows = [{"batch_row": 0, "value": math.nan, "dataset_row": 300}]
    text = value({"rows": rows, "growth": 2.5e15})
    assert "{" not in text and "'" not in text
    assert text == "rows batch_row 0, value nan, dataset_row 300, growth 2.5e+15"
    assert value(list(range(20))).endswith("... (20 in all)")
    assert row({"batch_row": 7, "dataset_row": 1207, "column": 3, "value": math.nan}) == (
        "batch row 7 (dataset row 1207), column 3 = nan"
    )


def test_every_copy_now_formats_through_one_module() -> None:
    from nanscope.data.checks._base import fmt_num
    from nanscope.diagnose.rules._common import num
    from nanscope.report.html import fmt_number

    for x in (0.5, 2494037252470475.0, math.inf, 7):
        assert num(x) == fmt_number(x) == number(x)
    assert fmt_num(1234567) == number(1234567, thousands=True)
