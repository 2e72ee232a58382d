"""The results of a scan: findings, per-column statistics and the report that holds them.

Nothing here imports polars: a report can be built, read and turned into JSON anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from nanscope._json import jsonable

__all__ = ["SCHEMA", "ColumnStats", "Finding", "ScanReport", "Severity"]

SCHEMA = "nanscope.scan/1"

Severity = Literal["error", "warning", "info"]
_SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One problem found in the data.

    ``rows`` holds the first few dataset row indices (0-based, in scan order) and ``values`` the
    values found there; ``count`` is how many rows are affected in all (0 for column-level
    findings such as an unscaled or duplicated column). ``fix`` is one line saying what to do.
    """

    code: str
    name: str
    severity: Severity
    column: str | None
    message: str
    fix: str
    rows: tuple[int, ...] = ()
    values: tuple[Any, ...] = ()
    count: int = 0
    data: Mapping[str, Any] = field(default_factory=dict)
    #: (kind, params) used by :meth:`ScanReport.findings_for` to test rows the scan did not list.
    predicate: tuple[str, Mapping[str, Any]] | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "column": self.column,
            "count": self.count,
            "rows": list(self.rows),
            "values": jsonable(list(self.values)),
            "message": self.message,
            "fix": self.fix,
            "data": jsonable(dict(self.data)),
        }


@dataclass
class ColumnStats:
    """Statistics of one column. Moments and counts are exact; robust ones may come from a sample.

    ``scale`` is the robust scale the checks use (σ-consistent: 1.4826·MAD, or a fallback named by
    ``scale_method`` when the MAD is 0), ``robust_exact`` says whether median/MAD/quantiles were
    computed on every row or on an evenly strided sample of ``sample_size`` rows.
    """

    name: str
    dtype: str
    kind: str  # "float", "int", "bool", "text", "other"
    count: int = 0
    n_null: int = 0
    n_nan: int = 0
    n_posinf: int = 0
    n_neginf: int = 0
    n_finite: int = 0
    min: float = math.nan
    max: float = math.nan
    mean: float = math.nan
    std: float = math.nan
    median: float = math.nan
    mad: float = math.nan
    q05: float = math.nan
    q25: float = math.nan
    q75: float = math.nan
    q95: float = math.nan
    scale: float = math.nan
    scale_method: str = "none"
    robust_exact: bool = True
    sample_size: int = 0
    distinct_sample: int = 0
    integral: bool = False
    is_target: bool = False

    @property
    def numeric(self) -> bool:
        return self.kind in ("float", "int", "bool")

    @property
    def n_inf(self) -> int:
        return self.n_posinf + self.n_neginf

    @property
    def two_valued(self) -> bool:
        """At most two distinct values seen (an indicator or a binary label)."""
        return self.numeric and self.distinct_sample <= 2

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["n_inf"] = self.n_inf
        return jsonable(out)  # type: ignore[no-any-return]


@dataclass
class ScanReport:
    """What :func:`nanscope.data.scan` found: ``findings`` (worst first) and ``columns``."""

    source: str
    n_rows: int
    columns: dict[str, ColumnStats]
    findings: list[Finding]
    target: str | None = None
    passes: int = 0
    seconds: float = 0.0
    files: list[str] = field(default_factory=list)
    #: what was skipped or changed while reading (cells that are not UTF-8, ...), also warned
    notes: list[str] = field(default_factory=list)
    #: re-reads given rows of the source as {column: [values]} (None when the source is gone).
    _row_reader: Callable[[Sequence[int], Sequence[str]], dict[str, list[Any]]] | None = field(
        default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.findings.sort(key=lambda f: (_SEVERITY_ORDER[f.severity], f.code, f.column or ""))

    @property
    def ok(self) -> bool:
        """True when no finding is a warning or an error."""
        return not any(f.severity in ("error", "warning") for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def counts(self) -> dict[str, int]:
        out = {"error": 0, "warning": 0, "info": 0}
        for f in self.findings:
            out[f.severity] += 1
        return out

    def findings_for(
        self, rows: Iterable[int] | None = None, columns: Iterable[str] | None = None
    ) -> list[Finding]:
        """Findings touching the given dataset ``rows`` and/or ``columns``.

        With ``columns``, only findings about those columns are kept. With ``rows``, row findings
        are kept when one of the rows is affected, and returned with ``rows``/``values`` narrowed
        to the given rows; column-level findings (unscaled, constant, duplicated) are kept too,
        since they touch every row. A finding lists only its first rows, so when the source can
        still be read the given rows are re-read and tested against the finding's predicate.
        """
        cols = None if columns is None else set(columns)
        wanted = None if rows is None else sorted({int(r) for r in rows})
        selected = [f for f in self.findings if cols is None or f.column in cols]
        if wanted is None:
            return selected
        reread: dict[str, list[Any]] | None = None
        need = sorted({f.column for f in selected if f.predicate and f.column})
        if self._row_reader is not None and need and wanted:
            try:
                reread = self._row_reader(wanted, need)
            except Exception:  # the file moved or changed: fall back to the listed rows
                reread = None
        out: list[Finding] = []
        for f in selected:
            if not f.rows and f.predicate is None:
                out.append(f)
                continue
            hits: dict[int, Any] = {r: v for r, v in zip(f.rows, f.values) if r in set(wanted)}
            if reread is not None and f.predicate is not None and f.column in reread:
                kind, params = f.predicate
                for r, v in zip(reread["__row"], reread[f.column]):
                    if _matches(kind, params, v):
                        hits[r] = v
            if hits:
                ordered = sorted(hits)
                out.append(replace(f, rows=tuple(ordered), values=tuple(hits[r] for r in ordered)))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "source": self.source,
            "files": list(self.files),
            "notes": list(self.notes),
            "n_rows": self.n_rows,
            "target": self.target,
            "ok": self.ok,
            "counts": self.counts(),
            "passes": self.passes,
            "seconds": round(self.seconds, 3),
            "findings": [f.to_dict() for f in self.findings],
            "columns": {name: c.to_dict() for name, c in self.columns.items()},
        }


def _matches(kind: str, params: Mapping[str, Any], value: Any) -> bool:
    if kind == "null":
        return value is None
    if value is None or isinstance(value, str):
        return False
    try:
        x = float(value)
    except (TypeError, ValueError):
        return False
    if kind == "nan":
        return math.isnan(x)
    if kind == "inf":
        return math.isinf(x)
    if kind == "outside":
        return math.isfinite(x) and (x < params["lo"] or x > params["hi"])
    return False
