"""What every check sees and returns.

A check is a module with ``CODE``, ``NAME``, a docstring with the sections *What it does*, *Why is
this bad?*, *Example*, *Use instead* and *Fix*, and two pure functions:

- ``probes(ctx) -> list[Probe]``: after the statistics pass, which row lookups it needs (rows that
  are NaN, rows outside a range, whether two columns are equal). The engine answers all probes of
  all checks in one more pass over the data, reading only the columns they name.
- ``run(ctx, results) -> list[Finding]``: the findings, from the statistics and the probe answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from nanscope.data._model import ColumnStats, Finding, Severity
from nanscope.formatting import number

__all__ = [
    "Context",
    "Options",
    "Probe",
    "ProbeResult",
    "Results",
    "fmt_num",
    "fmt_rows",
    "make_finding",
    "missing_check",
    "no_probes",
    "pct",
    "plural",
]

ProbeKind = Literal["nan", "inf", "null", "outside", "value", "nonintegral", "equal"]


@dataclass(frozen=True)
class Options:
    """Thresholds. All are scale-free: ratios, robust z-scores or fractions of rows."""

    #: robust z-score (in σ-consistent robust scales) beyond which a value is extreme.
    z_threshold: float = 10.0
    #: a column whose robust magnitude is this many times the other columns' median is unscaled.
    magnitude_factor: float = 100.0
    #: relative spread std/|mean| under which a column is near-constant (float32 resolution ~1e-7).
    near_constant_rel: float = 1e-6
    #: how many row indices a finding lists.
    max_rows: int = 10
    #: number of classes, when known (class labels must lie in 0..num_classes-1).
    num_classes: int | None = None
    #: the loss the target feeds: "log" (binary cross-entropy), "ce" (class labels), "mse", None.
    loss: str | None = None


@dataclass(frozen=True)
class Probe:
    """A row lookup a check asks for; answered in the engine's second pass."""

    kind: ProbeKind
    column: str
    lo: float = -math.inf
    hi: float = math.inf
    value: float = math.nan
    other: str = ""


@dataclass(frozen=True)
class ProbeResult:
    count: int = 0
    rows: tuple[int, ...] = ()
    values: tuple[Any, ...] = ()
    equal: bool = False


Results = Mapping[Probe, ProbeResult]


@dataclass
class Context:
    """Everything the statistics pass learnt, handed to every check."""

    source: str
    n_rows: int
    columns: dict[str, ColumnStats]
    target: str | None = None
    options: Options = field(default_factory=Options)
    #: finite values of each numeric column from the strided sample (all rows for small data).
    samples: dict[str, np.ndarray] = field(default_factory=dict)

    def numeric(self, *, target: bool = True) -> list[ColumnStats]:
        return [c for c in self.columns.values() if c.numeric and (target or c.name != self.target)]

    def target_stats(self) -> ColumnStats | None:
        return None if self.target is None else self.columns.get(self.target)


def fmt_num(x: float) -> str:
    """A number short enough for a message."""
    return number(x, thousands=True)


def fmt_rows(rows: tuple[int, ...], count: int) -> str:
    shown = ", ".join(str(r) for r in rows)
    if count > len(rows):
        return f"rows {shown}, ..."
    return f"row {shown}" if len(rows) == 1 else f"rows {shown}"


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def pct(count: int, total: int) -> str:
    if total <= 0:
        return "0%"
    p = 100.0 * count / total
    if p >= 1:
        return f"{p:.0f}%"
    return f"{p:.2g}%"


def make_finding(
    module_code: str,
    name: str,
    severity: Severity,
    column: str | None,
    message: str,
    fix: str,
    *,
    result: ProbeResult | None = None,
    count: int = 0,
    data: Mapping[str, Any] | None = None,
    predicate: tuple[str, Mapping[str, Any]] | None = None,
) -> Finding:
    rows: tuple[int, ...] = ()
    values: tuple[Any, ...] = ()
    if result is not None:
        rows, values = result.rows, result.values
        count = count or result.count
    return Finding(
        code=module_code,
        name=name,
        severity=severity,
        column=column,
        message=message,
        fix=fix,
        rows=rows,
        values=values,
        count=count,
        data=dict(data or {}),
        predicate=predicate,
    )


def no_probes(ctx: Context) -> list[Probe]:
    """The ``probes`` of a check that reads only the statistics: no row lookups."""
    return []


def missing_check(
    kind: Literal["nan", "inf", "null"],
    code: str,
    name: str,
    fix: str,
    *,
    noun: str = "",
    values: Callable[[ColumnStats], str] | None = None,
    data: Callable[[ColumnStats], Mapping[str, Any]] | None = None,
) -> tuple[Callable[[Context], list[Probe]], Callable[[Context, Results], list[Finding]]]:
    """The ``probes`` and ``run`` of the check for values of ``kind`` (NaN, inf or null): S001,
    S002 and S003 differ only in these words. ``probes`` looks up the rows of the numeric columns
    holding such values; ``run`` gives one finding per such column, with the count, the share and
    the first rows. The values are a count of ``noun`` (``3 NaN values``), or what ``values``
    words (``2 +inf and 1 -inf values``); ``data`` gives the finding's data."""

    def probes(ctx: Context) -> list[Probe]:
        return [Probe(kind, c.name) for c in ctx.numeric() if getattr(c, f"n_{kind}") > 0]

    def run(ctx: Context, results: Results) -> list[Finding]:
        out = []
        for c in ctx.numeric():
            count = int(getattr(c, f"n_{kind}"))
            if count == 0:
                continue
            res = results.get(Probe(kind, c.name))
            where = f", {fmt_rows(res.rows, count)}" if res and res.rows else ""
            role = "target" if c.name == ctx.target else "column"
            what = values(c) if values is not None else plural(count, noun)
            out.append(
                make_finding(
                    code,
                    name,
                    "error",
                    c.name,
                    f"{role} `{c.name}` has {what} ({pct(count, c.count)}){where}",
                    fix,
                    result=res,
                    count=count,
                    data=data(c) if data is not None else None,
                    predicate=(kind, {}),
                )
            )
        return out

    return probes, run
