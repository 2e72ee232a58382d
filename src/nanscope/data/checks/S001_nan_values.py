"""S001 nan-values: NaN in a numeric column.

What it does
    Counts the NaN values of every numeric column (features and target) and lists the first rows
    that hold one.

Why is this bad?
    One NaN in a batch makes that batch's loss NaN, the averaged gradient NaN, and after one update
    every weight NaN. The tell in a training log is a loss that is NaN from the first update that
    sees the row, with no growth phase before it.

Example
    ``price`` is NaN at row 17 because a join found no match: ``[12.5, nan, 9.0]``.

Use instead
    Drop or impute those rows before they reach the model: ``[12.5, 10.75, 9.0]`` (the median).

Fix
    Drop or impute the listed rows (``df.drop_nans()``, ``fillna(median)``), then find the step
    that produced them.
"""

from __future__ import annotations

from nanscope.data.checks._base import missing_check

CODE = "S001"
NAME = "nan-values"
FIX = "drop or impute the rows with NaN (df.drop_nans() / fillna(median)) before training"

probes, run = missing_check("nan", CODE, NAME, FIX, noun="NaN value")
