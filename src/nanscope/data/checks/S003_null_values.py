"""S003 null-values: missing (null) values in a numeric column.

What it does
    Counts the nulls (empty CSV fields, Parquet/Arrow nulls, pandas ``NA``/``None``) of every
    numeric column and lists the first rows that hold one.

Why is this bad?
    Converting a column with nulls to a float tensor turns them into NaN (pandas ``to_numpy``,
    ``torch.tensor(df.values)``), and then S001 applies: the first batch holding one makes every
    weight NaN. Some loaders fill them with 0 instead, which is silently wrong.

Example
    A CSV line ``3.2,,7`` leaves the second column empty.

Use instead
    Impute explicitly (``fill_null(median)``) or drop the rows, and keep a missing-indicator column
    if missingness carries information.

Fix
    Impute or drop the null rows explicitly before converting to arrays.
"""

from __future__ import annotations

from nanscope.data.checks._base import missing_check

CODE = "S003"
NAME = "null-values"
FIX = "impute (fill_null(median)) or drop the rows with missing values before making tensors"

probes, run = missing_check("null", CODE, NAME, FIX, noun="missing value")
