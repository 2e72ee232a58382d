"""Throughput and memory of the log readers on big logs.

For each text format it writes a log of ``--lines`` lines (default 10 million) in a temporary
directory, then, each in a fresh subprocess so peak memory is per reader:

- the baseline: ``for line in f: pass`` over the same file (binary mode);
- the reader: ``nanscope.logs.iter_records`` streamed to the end, records counted, not kept.

It prints lines per second for both, the reader's slowdown against the baseline (measured in this
same run), and the peak resident memory of each process. Bounded memory means the reader's peak
stays near the baseline's, whatever ``--lines`` is.

    .venv/bin/python bench/logs.py                   # 10 million lines per format
    .venv/bin/python bench/logs.py --lines 200000    # quick
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

FORMATS = ("text", "keras", "csv", "jsonl", "nanscope", "trainer_state")


def _loss(i: int, n: int) -> float:
    return math.nan if i > n - 5 else 2.0 / (1.0 + 0.001 * i)


def write_log(fmt: str, path: Path, lines: int) -> None:
    """A synthetic log of about ``lines`` lines that ends in NaN."""
    with path.open("w", buffering=1 << 20) as out:
        write = out.write
        if fmt == "text":
            for i in range(1, lines + 1):
                if i % 1000 == 0:
                    write("Gradient overflow.  Skipping step, reducing loss scale to 1024.0\n")
                else:
                    write(f"step {i} | loss {_loss(i, lines):.6f} | lr 1.0e-03 | 12.3 it/s\n")
        elif fmt == "keras":
            epochs = lines // 2
            for e in range(1, epochs + 1):
                write(f"Epoch {e}/{epochs}\n")
                write(
                    f"100/100 [==============================] - 2s 20ms/step - "
                    f"loss: {_loss(e, epochs):.4f} - val_loss: {_loss(e, epochs):.4f}\n"
                )
        elif fmt == "csv":
            write("epoch,step,train_loss_step,val_loss,lr-Adam\n")
            for i in range(1, lines):
                write(f"{i // 1000},{i},{_loss(i, lines):.6f},,0.001\n")
        elif fmt in ("jsonl", "nanscope"):
            if fmt == "nanscope":
                write('{"schema": "nanscope.trace/1", "run": "bench"}\n')
                key = "loss"
            else:
                key = "train/loss"
            for i in range(1, lines):
                value = _loss(i, lines)
                text = '"nan"' if fmt == "nanscope" and value != value else f"{value:.6f}"
                if text == "nan":
                    text = "NaN"
                write(f'{{"step": {i}, "{key}": {text}, "grad_norm": 1.5, "lr": 0.001}}\n')
        elif fmt == "trainer_state":
            entries = max(1, (lines - 10) // 7)
            write(f'{{\n  "global_step": {entries},\n  "log_history": [\n')
            for i in range(1, entries + 1):
                value = _loss(i, entries)
                sep = "," if i < entries else ""
                write(
                    "    {\n"
                    f'      "epoch": {i / 1000:.3f},\n'
                    '      "grad_norm": 1.5,\n'
                    '      "learning_rate": 0.001,\n'
                    f'      "loss": {"NaN" if value != value else f"{value:.6f}"},\n'
                    f'      "step": {i}\n'
                    f"    }}{sep}\n"
                )
            write('  ],\n  "logging_steps": 1\n}\n')
        else:
            raise SystemExit(f"unknown format {fmt}")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_baseline(path: Path) -> dict[str, float]:
    import nanscope.logs  # noqa: F401  (same imports as the reader, so memory compares)

    start = time.perf_counter()
    count = 0
    with path.open("rb") as handle:
        for _ in handle:
            count += 1
    seconds = time.perf_counter() - start
    return {"lines": count, "seconds": seconds, "peak_mb": _peak_mb()}


def measure_reader(path: Path) -> dict[str, float]:
    import warnings

    from nanscope.logs import iter_records

    meta: dict = {}
    start = time.perf_counter()
    records = 0
    last = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for record in iter_records(path, meta):
            records += 1
            last = record
    seconds = time.perf_counter() - start
    assert last is not None and last["loss"] != last["loss"], "the log should end in NaN"
    return {
        "lines": int(meta.get("lines", 0)),
        "records": records,
        "seconds": seconds,
        "peak_mb": _peak_mb(),
        "format": meta.get("format"),
        "messages": len(meta.get("messages", [])),
    }


def _child(mode: str, path: Path) -> dict[str, float]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, __file__, f"--_{mode}", str(path)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--_baseline", dest="baseline", help=argparse.SUPPRESS)
    parser.add_argument("--_reader", dest="reader", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.baseline:
        print(json.dumps(measure_baseline(Path(args.baseline))))
        return 0
    if args.reader:
        print(json.dumps(measure_reader(Path(args.reader))))
        return 0
    formats = [f for f in args.formats.split(",") if f]
    print(f"nanscope log readers, {args.lines:,} lines per format (streaming, records not kept)")
    header = (
        f"{'format':<14}{'reader':<14}{'lines':>12}{'reader l/s':>13}{'baseline l/s':>14}"
        f"{'slowdown':>10}{'reader MB':>11}{'base MB':>9}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="nanscope-bench-") as tmp:
        for fmt in formats:
            name = {
                "nanscope": "trace.jsonl",
                "trainer_state": "trainer_state.json",
                "csv": "metrics.csv",
                "jsonl": "log.jsonl",
            }.get(fmt, "train.log")
            path = Path(tmp) / name
            write_log(fmt, path, args.lines)
            base = _child("baseline", path)
            read = _child("reader", path)
            base_rate = base["lines"] / base["seconds"]
            rate = base["lines"] / read["seconds"]
            print(
                f"{fmt:<14}{read['format']!s:<14}{int(base['lines']):>12,}{rate:>13,.0f}"
                f"{base_rate:>14,.0f}{base_rate / rate:>9.1f}x{read['peak_mb']:>11.0f}"
                f"{base['peak_mb']:>9.0f}"
            )
            path.unlink()
    print("slowdown = baseline lines/s over reader lines/s, measured in this run;")
    print("MB = peak resident memory of the process (Python + numpy + the reader).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
