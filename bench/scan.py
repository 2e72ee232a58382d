"""Throughput and memory of ``nanscope.data.scan`` against a bare Polars query, in the same run.

Generates a Parquet file (default 50 million rows x 10 columns) in a temp dir, written in chunks
with pyarrow so generation memory stays bounded, with planted problems:

- NaN in ``f1`` at three rows, +inf and -inf in ``f2``;
- one outlier row (``f3`` = 1e4, ``f4`` = -5e3, against features of scale ~1-3);
- ``price``, a money-valued column (~20,000 ± 5,000) next to features near 1;
- ``clicked``, a 0/1 target.

Then, each in its own subprocess (so peak memory is measured separately, as ru_maxrss):

- **baseline**: a bare Polars query computing the same per-column statistics the same way (one
  streaming aggregation of null/NaN/±inf counts and finite min/max/mean/std, sharing its scan with
  an evenly strided sample for median/MAD), written by hand;
- **nanscope**: ``nanscope.data.scan(path, target="clicked")``, which also finds the rows.

Prints rows/second, the ratio nanscope/baseline, the peak memory of each, and whether every
planted problem was found with its rows. Targets: ratio <= 1.5, peak memory < 2 GB.

    python bench/scan.py               # 50M rows (~4 GB file; needs ~4 GB of disk)
    python bench/scan.py --rows 2000000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHUNK = 1_000_000
FEATURES = 8


def planted(n: int) -> dict[str, Any]:
    return {
        "nan_f1": sorted({17, n // 4 + 3, n - 1}),
        "posinf_f2": [n // 10 + 7],
        "neginf_f2": [2 * n // 3 + 1],
        "outlier_row": int(n * 0.8) + 11,
    }


def generate(path: Path, n: int, seed: int = 0) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    plant = planted(n)
    writer = None
    try:
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            cols: dict[str, Any] = {}
            for j in range(FEATURES):
                cols[f"f{j}"] = rng.normal(0.5 * j, 1.0 + 0.25 * j, m)
            cols["price"] = np.round(rng.normal(20_000.0, 5_000.0, m), 2)
            cols["clicked"] = (rng.random(m) < 0.1).astype(np.int8)

            for col, rows, value in (
                ("f1", plant["nan_f1"], math.nan),
                ("f2", plant["posinf_f2"], math.inf),
                ("f2", plant["neginf_f2"], -math.inf),
                ("f3", [plant["outlier_row"]], 1e4),
                ("f4", [plant["outlier_row"]], -5e3),
            ):
                for r in rows:
                    if start <= r < start + m:
                        cols[col][r - start] = value
            table = pa.table(cols)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table, row_group_size=CHUNK)
    finally:
        if writer is not None:
            writer.close()


def baseline(path: str) -> dict[str, Any]:
    """The same statistics, by hand: one streaming aggregation + the strided sample."""
    import numpy as np
    import polars as pl

    lf = pl.scan_parquet(path)
    schema = lf.collect_schema()
    n = lf.select(pl.len()).collect().item()
    exprs = []
    for name, dt in schema.items():
        x = pl.col(name)
        fin = x.filter(x.is_finite()) if dt.is_float() else x
        if dt.is_float():
            exprs += [
                x.is_nan().sum().alias(f"{name}:nan"),
                (x == math.inf).sum().alias(f"{name}:pinf"),
                (x == -math.inf).sum().alias(f"{name}:ninf"),
            ]
        exprs += [
            x.null_count().alias(f"{name}:null"),
            fin.min().alias(f"{name}:min"),
            fin.max().alias(f"{name}:max"),
            fin.mean().alias(f"{name}:mean"),
            fin.std().alias(f"{name}:std"),
        ]
    stride = max(1, math.ceil(n / 250_000))
    sample_q = lf.select(pl.all().cast(pl.Float64)).gather_every(stride)
    stats, sample = pl.collect_all([lf.select(exprs), sample_q], engine="streaming")
    robust = {}
    for name in sample.columns:
        v = sample.get_column(name).to_numpy()
        v = v[np.isfinite(v)]
        med = float(np.median(v))
        robust[name] = (med, float(np.median(np.abs(v - med))))
    return {"n_rows": n, "n_stats": stats.width, "robust": robust}


def nanscope_scan(path: str) -> dict[str, Any]:
    from nanscope.data import scan

    report = scan(path, target="clicked", progress=False)
    return report.to_dict()


def worker(which: str, path: str, out: str) -> None:
    t0 = time.perf_counter()
    result = baseline(path) if which == "baseline" else nanscope_scan(path)
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(out, "w") as fh:
        json.dump({"seconds": seconds, "peak_mb": peak_mb, "result": result}, fh)


def measure(which: str, path: Path, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{which}.json"
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run(
        [sys.executable, __file__, "--worker", which, str(path), str(out)], check=True, env=env
    )
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def verify(report: dict[str, Any], n: int) -> list[tuple[str, bool, str]]:
    plant = planted(n)
    by = {(f["code"], f["column"]): f for f in report["findings"]}
    checks = []

    def rows_of(code: str, col: str) -> list[int]:
        f = by.get((code, col))
        return [] if f is None else sorted(f["rows"])

    checks.append(
        ("NaN in f1 (S001)", rows_of("S001", "f1") == plant["nan_f1"], str(rows_of("S001", "f1")))
    )
    infs = sorted(plant["posinf_f2"] + plant["neginf_f2"])
    checks.append(("inf in f2 (S002)", rows_of("S002", "f2") == infs, str(rows_of("S002", "f2"))))
    r = plant["outlier_row"]
    for col in ("f3", "f4"):
        rows = rows_of("S006", col)
        checks.append((f"outlier row in {col} (S006)", r in rows, str(rows)))
    price = by.get(("S004", "price"))
    factor = price["data"]["factor"] if price else 0
    checks.append(("unscaled price (S004)", price is not None, f"factor {factor:,.0f}"))
    expected = {("S001", "f1"), ("S002", "f2"), ("S006", "f3"), ("S006", "f4"), ("S004", "price")}
    extra = [k for k, f in by.items() if k not in expected and f["severity"] != "info"]
    checks.append(("no other warnings/errors", not extra, str(extra)))
    return checks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=50_000_000)
    p.add_argument("--dir", help="where to write the file (default: a temp dir, removed)")
    p.add_argument("--repeat", type=int, default=2, help="timed runs of each; the best counts")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    n = args.rows
    if n < 1000:
        p.error("--rows must be at least 1000")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        tmp = Path(d)
        path = tmp / "ads.parquet"
        t0 = time.perf_counter()
        generate(path, n)
        gen_s = time.perf_counter() - t0
        size_gb = path.stat().st_size / 1e9
        print(f"generated {n:,} rows x 10 columns ({size_gb:.2f} GB) in {gen_s:.1f} s: {path}")
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "nanscope": []}
        for _ in range(args.repeat):
            for which in ("baseline", "nanscope"):
                runs[which].append(measure(which, path, tmp))
        best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
        peak = {k: max(r["peak_mb"] for r in v) for k, v in runs.items()}
        for k in ("baseline", "nanscope"):
            s = best[k]["seconds"]
            print(f"{k:<9} {s:7.2f} s  {n / s / 1e6:7.2f} M rows/s  peak {peak[k]:7.0f} MB")
        ratio = best["nanscope"]["seconds"] / best["baseline"]["seconds"]
        report = best["nanscope"]["result"]
        print(f"ratio nanscope/baseline: {ratio:.2f} (target <= 1.5); passes: {report['passes']}")
        ok = ratio <= 1.5 and peak["nanscope"] < 2048
        print(f"peak memory nanscope: {peak['nanscope']:.0f} MB (target < 2048 MB)")
        for name, found, detail in verify(report, n):
            ok = ok and found
            print(f"  {'found' if found else 'MISSED':<6} {name}: {detail}")
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
