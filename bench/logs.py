"""Throughput and memory of the log readers on big logs.

For each text format it writes a log of ``--lines`` lines (default 10 million) in a temporary
directory, then, each in a fresh subprocess so peak memory is per reader:

- the bare parse of that format (``for line in f`` for text, ``csv.reader`` for CSV,
  ``json.loads`` per line for JSONL, ``json.load`` for trainer_state.json);
- the reader: ``nanscope.logs.iter_records`` streamed to the end, records counted, not kept.

Both are timed in one process, interleaved (best of ``--rounds``), so machine load hits both
alike; it prints lines per second for both and their ratio.

Then the whole command: ``nanscope diagnose`` (a fresh interpreter: start, read, judge, report)
on a ``--command-lines`` log of ``step i | loss x | lr y`` lines (2 million by default), timed
in rounds interleaved with the reader alone on the same file, both printed in lines per second
(wall clock and CPU), with the command's peak memory on that log and on one half as long (flat
memory: the two are close). The target: :data:`COMMAND_TARGET` lines per second for the whole
command. Peak resident memory is measured in a
separate process for each, so bounded memory shows as the reader's peak staying near the bare
parse's, whatever ``--lines`` is. The load average before and after is printed (absolute rates
move with it; ratios less), and for the text layouts whether the reader met the target of
issue 16: :data:`TEXT_TARGET` lines per second.

    .venv/bin/python bench/logs.py                   # 10 million lines per format
    .venv/bin/python bench/logs.py --lines 200000    # quick
    .venv/bin/python bench/logs.py --formats ''      # the whole command only
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

#: lines per second the text reader should reach (a 10-million-line log in seconds)
TEXT_TARGET = 500_000
#: lines per second `nanscope diagnose` should reach on a 2-million-line log, the whole command
COMMAND_TARGET = 500_000
TEXT_FORMATS = ("text", "keras", "keras_progress", "mmdet", "hf_text", "kv")

FORMATS = (*TEXT_FORMATS, "csv", "jsonl", "nanscope", "trainer_state")
#: layouts written by :func:`write_log` beyond FORMATS (the whole command's log)
EXTRA_LAYOUTS = ("steps",)


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
        elif fmt == "keras_progress":
            # Keras 2's bar written to a file: a line per update (ETA m:ss, then Ns), then the
            # epoch's line; one record per epoch
            batches = 100
            epochs = max(1, lines // (batches + 1))
            for e in range(1, epochs + 1):
                write(f"Epoch {e}/{epochs}\n")
                for k in range(1, batches):
                    done = 30 * k // batches
                    bar = "=" * done + ">" + "." * (29 - done)
                    left = (batches - k) * 2
                    eta = f"{left // 60}:{left % 60:02d}" if left >= 60 else f"{left}s"
                    write(f"{k:>3}/{batches} [{bar}] - ETA: {eta} - loss: {2.0 / k:.4f}\n")
                write(
                    f"{batches}/{batches} [{'=' * 30}] - {e % 3 + 1}s {e % 40 + 10}ms/step - "
                    f"loss: {_loss(e, epochs):.4f} - val_loss: {_loss(e, epochs):.4f}\n"
                )
        elif fmt == "mmdet":
            # mmdetection: a counter that restarts each epoch, logged every 50 iterations
            for i in range(1, lines + 1):
                epoch, it = divmod(i - 1, 77)
                loss = _loss(i, lines)
                write(
                    f"2024-01-01 00:00:01,123 - mmdet - INFO - Epoch [{epoch + 1}][{it * 50 + 50}"
                    f"/3862]\tlr: 1.000e-02, eta: 1:02:03, time: 0.512, data_time: 0.010, "
                    f"memory: 3021, loss_cls: {loss / 2:.4f}, loss_bbox: {loss / 2:.4f}, "
                    f"loss: {loss:.4f}, grad_norm: 3.1416\n"
                )
        elif fmt == "hf_text":
            # the Trainer's printed dicts (no step: lines are counted; fractional epochs)
            for i in range(1, lines + 1):
                write(
                    f"{{'loss': {_loss(i, lines):.4f}, 'grad_norm': 1.5, 'learning_rate': 1e-05, "
                    f"'epoch': {i / 1000:.2f}}}\n"
                )
        elif fmt == "steps":
            # the plainest print loop: step, loss, learning rate
            for i in range(1, lines + 1):
                lr = 1e-3 * (1 - i / (2 * lines))  # a linear decay: every line differs
                write(f"step {i} | loss {_loss(i, lines):.6f} | lr {lr:.6g}\n")
        elif fmt == "kv":
            for i in range(1, lines + 1):
                write(f"iter={i} loss={_loss(i, lines):.6f} lr=1e-3 grad_norm=1.25\n")
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


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


#: format -> the bare parses a reader is compared with (the first also for peak memory)
BARE = {
    "steps": ("line loop", "re+float"),
    "text": ("line loop", "re+float"),
    "keras": ("line loop", "re+float"),
    "keras_progress": ("line loop", "re+float"),
    "mmdet": ("line loop", "re+float"),
    "hf_text": ("line loop", "re+float"),
    "kv": ("line loop", "re+float"),
    "csv": ("csv.reader", "csv+float", "DictReader"),
    "jsonl": ("json.loads",),
    "nanscope": ("json.loads",),
    "trainer_state": ("json.load",),
}

#: what a hand-written script would do to get the loss out of each text line
_LOSS = r"loss['\"]?[:=]?\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"


def bare_parse(fmt: str, path: Path, bare: str | None = None) -> int:
    """The least work that reads every line of the format: lines counted."""
    count = 0
    bare = bare or BARE[fmt][0]
    if bare == "DictReader":
        import csv

        with path.open(newline="") as handle:
            count = 1
            for _ in csv.DictReader(handle):
                count += 1
    elif bare in ("csv.reader", "csv+float"):
        import csv

        with path.open(newline="") as handle:
            rows = csv.reader(handle)
            header = next(rows)
            count = 1
            column = next(i for i, name in enumerate(header) if "loss" in name)
            if bare == "csv.reader":
                for _ in rows:
                    count += 1
            else:
                for row in rows:
                    float(row[column])  # the loss of each row as a number
                    count += 1
    elif bare == "re+float":
        import re

        search = re.compile(_LOSS).search
        with path.open() as handle:
            for line in handle:
                match = search(line)
                if match is not None:
                    float(match.group(1))
                count += 1
    elif bare == "json.loads":
        loads = json.loads
        with path.open("rb") as handle:
            for raw in handle:
                loads(raw)
                count += 1
    elif bare == "json.load":
        with path.open("rb") as handle:
            json.load(handle)
        with path.open("rb") as handle:
            count = sum(1 for _ in handle)
    else:
        with path.open("rb") as handle:
            for _ in handle:
                count += 1
    return count


def read_all(path: Path) -> dict[str, Any]:
    import warnings

    from nanscope.logs import iter_records

    meta: dict[str, Any] = {}
    records = 0
    last = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for record in iter_records(path, meta):
            records += 1
            last = record
    assert last is not None and last["loss"] != last["loss"], "the log should end in NaN"
    return {"records": records, "format": meta.get("format"), "lines": meta.get("lines")}


def measure_timing(fmt: str, path: Path, rounds: int) -> dict[str, Any]:
    """Bare parse and reader interleaved in this one process, best of ``rounds`` each."""
    import nanscope.logs  # noqa: F401

    bare: dict[str, list[float]] = {name: [] for name in BARE[fmt]}
    reader: list[float] = []
    info: dict[str, Any] = {}
    lines = 0
    for _ in range(rounds):
        for name in BARE[fmt]:
            start = time.perf_counter()
            lines = bare_parse(fmt, path, name)
            bare[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        info = read_all(path)
        reader.append(time.perf_counter() - start)
    return {
        "lines": lines,
        "bare_s": {name: min(times) for name, times in bare.items()},
        "reader_s": min(reader),
        **info,
    }


def measure_memory(mode: str, fmt: str, path: Path) -> dict[str, Any]:
    import nanscope.logs  # noqa: F401  (same imports either way, so peaks compare)

    if mode == "reader":
        read_all(path)
    else:
        bare_parse(fmt, path)
    return {"peak_mb": _peak_mb()}


def _child(*args: str) -> dict[str, Any]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, __file__, "--_child", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _command(path: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one ``nanscope diagnose PATH`` in a fresh interpreter."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cpu = _cpu_children()
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "nanscope", "diagnose", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        check=False,  # exit 1: the log ends in NaN, a diagnosed failure
    )
    return time.perf_counter() - start, _cpu_children() - cpu


def measure_command(path: Path, rounds: int) -> dict[str, Any]:
    """The whole command and the reader alone on ``path``, interleaved, best of ``rounds``."""
    import nanscope.logs  # noqa: F401

    command: list[tuple[float, float]] = []
    reader: list[tuple[float, float]] = []
    info: dict[str, Any] = {}
    for _ in range(rounds):
        command.append(_command(path))
        start, cpu = time.perf_counter(), time.process_time()
        info = read_all(path)
        reader.append((time.perf_counter() - start, time.process_time() - cpu))
    return {
        "command_s": min(w for w, _ in command),
        "command_cpu_s": min(c for _, c in command),
        "reader_s": min(w for w, _ in reader),
        "reader_cpu_s": min(c for _, c in reader),
        **info,
    }


def command_peak_mb(path: Path) -> float:
    """Peak resident memory of ``nanscope diagnose PATH`` (run from a fresh process)."""
    _command(path)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def whole_command(lines: int, rounds: int) -> str:
    """Time ``nanscope diagnose`` on a ``lines``-line log beside the reader; the verdict line."""
    with tempfile.TemporaryDirectory(prefix="nanscope-bench-") as tmp:
        path = Path(tmp) / "train.log"
        half = Path(tmp) / "half.log"
        write_log("steps", path, lines)
        write_log("steps", half, lines // 2)
        timing = _child("command", "steps", str(path), str(rounds))
        half_mb = _child("peak", "steps", str(half))["peak_mb"]
        full_mb = _child("peak", "steps", str(path))["peak_mb"]
    command_rate = lines / timing["command_s"]
    print(f"\nwhole command: nanscope diagnose on {lines:,} lines of `step i | loss x | lr y`")
    print(f"{'':<22}{'wall s':>9}{'cpu s':>9}{'lines/s wall':>15}{'lines/s cpu':>14}")
    for name, key in (("nanscope diagnose", "command"), ("reader alone", "reader")):
        wall, cpu = timing[f"{key}_s"], timing[f"{key}_cpu_s"]
        print(f"{name:<22}{wall:>9.2f}{cpu:>9.2f}{lines / wall:>15,.0f}{lines / cpu:>14,.0f}")
    print(f"peak memory of the command: {half_mb:.0f} MB at {lines // 2:,} lines, "
          f"{full_mb:.0f} MB at {lines:,}")  # fmt: skip
    met = "met" if command_rate >= COMMAND_TARGET else "NOT met"
    return f"whole-command target {COMMAND_TARGET:,} lines/s (wall): {command_rate:,.0f} ({met})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--rounds", type=int, default=2, help="timing rounds (best is kept)")
    parser.add_argument("--command-lines", type=int, default=2_000_000,
                        help="lines of the log the whole command reads (0: skip it)")  # fmt: skip
    parser.add_argument("--_child", dest="child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, fmt, path, *rest = args.child
        if mode == "timing":
            print(json.dumps(measure_timing(fmt, Path(path), args.rounds)))
        elif mode == "command":
            print(json.dumps(measure_command(Path(path), int(rest[0]))))
        elif mode == "peak":
            print(json.dumps({"peak_mb": command_peak_mb(Path(path))}))
        else:
            print(json.dumps(measure_memory(mode, fmt, Path(path))))
        return 0
    formats = [f for f in args.formats.split(",") if f]
    print(f"nanscope log readers, {args.lines:,} lines per format (streaming, records not kept)")
    print(f"load average before: {_load()}")
    targets: list[str] = []
    header = (
        f"{'format':<16}{'bare parse':<12}{'lines':>12}{'reader l/s':>13}{'bare l/s':>12}"
        f"{'ratio':>8}{'reader MB':>11}{'bare MB':>9}"
    )
    if formats:
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
            timing = _child("timing", fmt, str(path))
            bare_mb = _child("bare", fmt, str(path))["peak_mb"]
            reader_mb = _child("reader", fmt, str(path))["peak_mb"]
            lines = timing["lines"]
            rate = lines / timing["reader_s"]
            if fmt in TEXT_FORMATS:
                met = "met" if rate >= TEXT_TARGET else "NOT met"
                targets.append(f"{fmt} {rate:,.0f} ({met})")
            for index, name in enumerate(BARE[fmt]):
                bare_rate = lines / timing["bare_s"][name]
                memory = f"{reader_mb:>11.0f}{bare_mb:>9.0f}" if index == 0 else ""
                print(
                    f"{fmt if index == 0 else '':<16}{name:<12}{lines:>12,}{rate:>13,.0f}"
                    f"{bare_rate:>12,.0f}{bare_rate / rate:>7.1f}x{memory}",
                    flush=True,
                )
            path.unlink()
    command = whole_command(args.command_lines, args.rounds) if args.command_lines else ""
    print(f"load average after: {_load()}")
    if targets:
        print(f"text target {TEXT_TARGET:,} lines/s: " + ", ".join(targets))
    if command:
        print(command)
    print("ratio = bare parse lines/s over reader lines/s, both timed in one process (best of")
    print("--rounds, interleaved); MB = peak resident memory of a process doing only that.")
    print("re+float: one regex search for the loss per line and float() of it; csv+float:")
    print("csv.reader and float() of the loss cell of each row; DictReader: csv.DictReader,")
    print("a dict of strings per row (the reader makes a dict of numbers per record).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
