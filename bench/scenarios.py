"""nanscope's accuracy on a distribution of fits, not on fixtures.

    python bench/scenarios.py --seeds 0:200 --jobs 2 [--json out.json] [--only rnn] [--relabel]
    python bench/scenarios.py --seed 17 --keep /tmp/s17    # one scenario's scripts, to debug

Each seed draws a training script as a new user would write it (``bench/_scenario_gen.py``: an
MLP, a CNN, an LSTM/GRU/ReLU RNN, a tiny transformer, a hand-written torch update or a numpy fit
under ``nanscope.Monitor``; SGD to LBFGS; schedules, clipping, accumulation, half precision; raw
units, bad rows, logs of probabilities, divisions, init scales, sign errors, Adam eps=0; healthy
fits of every family). Its label comes from bare counterfactual runs (``bench/_scenario_label.py``:
the cause is what the intervention that removes the failure says); a scenario whose label cannot
be established is dropped and counted by reason. Labels are cached under ``bench/out/scenarios/``
per seed and generator version (``--relabel`` recomputes them).

Then the script runs unchanged under ``nanscope run --json PATH -- python script.py`` in a
subprocess, and the diagnosis's ``cause`` is compared with the label. A traceback, an exit code
other than the bare run's or nanscope's 3, or no JSON counts as a crash.

Prints a confusion table (label x answer), per-family accuracy, the dropped scenarios by reason,
the wrong answers with nanscope's first evidence, and last:
``scenarios: K/N right, healthy false alarms F/H, crashes C, dropped D``.
See docs/scenarios.md.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _scenario_gen import FAMILIES, Change, applicable, generate, render  # noqa: E402

from zoo import confusion_table  # noqa: E402

OUT = HERE / "out" / "scenarios"
#: seconds the nanscope leg of one scenario may take before it counts as a crash (a hang)
NANSCOPE_TIMEOUT = 300
#: lines of a script's own output that the bare and the watched runs must share
_OWN_OUTPUT = "epoch "


def generator_version() -> str:
    """Changes whenever the generator, the labeller, torch or numpy change: the label cache key."""
    digest = hashlib.sha1()
    for name in ("_scenario_gen.py", "_scenario_label.py"):
        digest.update((HERE / name).read_bytes())
    for package in ("torch", "numpy"):
        try:
            digest.update(importlib.metadata.version(package).encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(b"-")
    return digest.hexdigest()[:12]


def parse_seeds(text: str) -> list[int]:
    """``A:B`` (the seeds A to B-1), one seed, or a comma-separated list of both."""
    seeds: list[int] = []
    for part in text.split(","):
        try:
            if ":" in part:
                first, last = (int(bound) for bound in part.split(":", 1))
                seeds.extend(range(first, last))
            else:
                seeds.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not A:B or a seed") from None
    return sorted(set(seeds))


# ---------------------------------------------------------------------------------------------
# one scenario (in a worker process)


def _init_worker() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import _scenario_label

    _scenario_label.warm_up()


def _label(seed: int, version: str, relabel: bool, cache: Path = OUT) -> dict[str, Any]:
    import _scenario_label

    path = cache / f"labels-{version}" / f"{seed}.json"
    if not relabel and path.is_file():
        try:
            cached: dict[str, Any] = json.loads(path.read_text())
            return cached
        except ValueError:
            pass
    started = time.perf_counter()
    record = _scenario_label.establish(generate(seed))
    record["label_seconds"] = round(time.perf_counter() - started, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    return record


def run_nanscope(script: str, folder: Path, timeout: float = NANSCOPE_TIMEOUT) -> dict[str, Any]:
    """``nanscope run --json diagnosis.json -- python script.py`` in ``folder``, as a user would."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "script.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANSCOPE_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", NANSCOPE_LEDGER=str(folder / "ledger.db"),
               PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    command = [sys.executable, "-m", "nanscope", "run", "--json", "diagnosis.json", "--",
               "python", "script.py"]  # fmt: skip
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=timeout, errors="replace")  # fmt: skip
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = None, _text(exc.stdout), _text(exc.stderr)
    seconds = round(time.perf_counter() - started, 2)
    diagnosis = None
    path = folder / "diagnosis.json"
    if path.is_file():
        try:
            diagnosis = json.loads(path.read_text())
        except ValueError:
            diagnosis = None
    return {"exit_code": code, "stdout": stdout, "stderr": stderr, "seconds": seconds,
            "diagnosis": diagnosis}  # fmt: skip


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""


def _crash(leg: dict[str, Any]) -> str | None:
    """Why the nanscope leg counts as a crash, or None."""
    if leg["exit_code"] is None:
        return f"no answer within {NANSCOPE_TIMEOUT}s"
    if "Traceback (most recent call last)" in leg["stderr"]:
        last = [line for line in leg["stderr"].strip().splitlines() if line.strip()][-1:]
        return f"traceback: {last[0][:160] if last else '?'}"
    if leg["exit_code"] not in (0, 3):
        return f"exit code {leg['exit_code']} (bare: 0)"
    if leg["diagnosis"] is None:
        return "no diagnosis JSON"
    if not isinstance(leg["diagnosis"].get("cause"), str):
        return "the diagnosis JSON has no cause"
    return None


def _why(diagnosis: dict[str, Any] | None) -> str:
    """One line of what nanscope said: its first evidence."""
    if not diagnosis:
        return ""
    for item in diagnosis.get("evidence") or []:
        text = item.get("text") if isinstance(item, dict) else None
        if text:
            rule = item.get("rule") or ""
            return f"[{rule}] {text}"[:240]
    return str(diagnosis.get("verdict", ""))


def _own_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(_OWN_OUTPUT)]


def run_one(seed: int, version: str, relabel: bool = False, keep: Path | None = None,
            labels_only: bool = False, cache: Path = OUT) -> dict[str, Any]:  # fmt: skip
    """Label one scenario (cached) and, when it has a label, run it under nanscope."""
    import _scenario_label

    spec = generate(seed)
    label = _label(seed, version, relabel, cache)
    result: dict[str, Any] = {
        "seed": seed, "family": spec.family, "injected": spec.injected,
        "label": label.get("label"), "dropped": label.get("dropped"), "rule": label.get("rule"),
        "step_up": label.get("step_up"),
        "bare": label.get("bare"), "counterfactuals": label.get("counterfactuals"),
        "spec": spec.to_dict(),
    }  # fmt: skip
    if keep is not None:
        _keep(spec, keep)
    if result["label"] is None or labels_only:
        return result
    folder = Path(tempfile.mkdtemp(prefix=f"scenario-{seed}-")) if keep is None else keep / "run"
    try:
        leg = run_nanscope(render(spec), folder)
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    diagnosis = leg["diagnosis"] or {}
    crash = _crash(leg)
    answer = "crash" if crash else diagnosis.get("cause")
    result.update(
        answer=answer, verdict=diagnosis.get("verdict"), confidence=diagnosis.get("confidence"),
        step=diagnosis.get("step"), why=(crash or _why(diagnosis)).replace(f"{folder}/", ""),
        crash=crash,
        exit_code=leg["exit_code"], nanscope_seconds=leg["seconds"],
        right=_scenario_label.right_answer(answer, diagnosis, leg["exit_code"], label, spec.accum),
        warnings=[line for line in leg["stderr"].splitlines()
                  if line.startswith("nanscope: warning")][:5],
        confirmation=diagnosis.get("confirmation"),
    )  # fmt: skip
    if leg["exit_code"] == 0:  # not stopped: the script must have printed what it prints bare
        result["same_output"] = _own_lines(leg["stdout"]) == _own_lines(label["bare_stdout"])
    if crash:
        result["stderr_tail"] = leg["stderr"][-2000:]
    return result


def _keep(spec: Any, folder: Path) -> None:
    """Write the scenario's script, its bare form and every counterfactual variant."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "script.py").write_text(render(spec))
    (folder / "spec.json").write_text(json.dumps(spec.to_dict(), indent=1))
    variants = folder / "variants"
    variants.mkdir(exist_ok=True)
    (variants / "bare.py").write_text(render(spec, Change(monitor=False)))
    for name, change in applicable(spec).items():
        (variants / f"{name}.py").write_text(render(spec, change))


def _work(args: tuple[int, str, bool, bool, Path]) -> dict[str, Any]:
    seed, version, relabel, labels_only, cache = args
    try:
        return run_one(seed, version, relabel, labels_only=labels_only, cache=cache)
    except Exception as exc:  # a fault of the bench itself: reported, never silent
        import traceback

        return {"seed": seed, "family": generate(seed).family, "label": None,
                "dropped": "bench error", "rule": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# the report


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    labelled = [r for r in results if r.get("label") is not None]
    healthy = [r for r in labelled if r["label"] == "healthy"]
    return {
        "right": sum(bool(r.get("right")) for r in labelled),
        "labelled": len(labelled),
        "healthy_false_alarms": sum(not r.get("right") for r in healthy),
        "healthy": len(healthy),
        "crashes": sum(bool(r.get("crash")) for r in labelled),
        "dropped": len(results) - len(labelled),
        "dropped_by_reason": dict(Counter(r["dropped"] for r in results if r.get("dropped"))),
        "labels": dict(Counter(r["label"] for r in labelled)),
        "not_as_bare": sum(r.get("same_output") is False for r in labelled),
    }


def last_line(summary: dict[str, Any]) -> str:
    s = summary
    return (f"scenarios: {s['right']}/{s['labelled']} right, healthy false alarms "
            f"{s['healthy_false_alarms']}/{s['healthy']}, crashes {s['crashes']}, "
            f"dropped {s['dropped']}")  # fmt: skip


def report(results: list[dict[str, Any]], seconds: float) -> str:
    labelled = [r for r in results if r.get("label") is not None]
    summary = summarise(results)
    lines: list[str] = []
    if labelled:
        lines += [confusion_table([(r["label"], r["answer"]) for r in labelled]), ""]
    lines.append("per family            right  healthy alarms  crashes  dropped")
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        by_family[r["family"]].append(r)
    for family in FAMILIES:
        group = by_family.get(family)
        if not group:
            continue
        done = [r for r in group if r.get("label") is not None]
        right = sum(bool(r.get("right")) for r in done)
        healthy = [r for r in done if r["label"] == "healthy"]
        alarms = sum(not r.get("right") for r in healthy)
        crashes = sum(bool(r.get("crash")) for r in done)
        share = f"{right / len(done):.0%}" if done else "-"
        lines.append(f"  {family:12s} {right:4d}/{len(done):<4d} {share:>5s}   "
                     f"{alarms:3d}/{len(healthy):<3d}        {crashes:3d}      "
                     f"{len(group) - len(done):3d}")  # fmt: skip
    if summary["dropped_by_reason"]:
        lines += ["", "dropped (no label could be established):"]
        for reason, count in sorted(summary["dropped_by_reason"].items(), key=lambda x: -x[1]):
            lines.append(f"  {count:4d}  {reason}")
    wrong = [r for r in labelled if not r.get("right")]
    if wrong:
        lines += ["", "wrong answers (seed family: label -> answer, verdict, confidence: why):"]
        for r in sorted(wrong, key=lambda r: (r["label"], r["seed"])):
            conf = r.get("confidence")
            conf_text = f"{conf:.2f}" if isinstance(conf, (int, float)) else "-"
            lines.append(f"  {r['seed']:5d} {r['family']:11s} {r['label']} -> {r['answer']} "
                         f"({r.get('verdict')}, {conf_text}): {r.get('why', '')}")  # fmt: skip
    if summary["not_as_bare"]:
        seeds = [r["seed"] for r in labelled if r.get("same_output") is False]
        lines += ["", f"runs nanscope did not stop whose printed losses differ from bare: "
                      f"{len(seeds)} (seeds {seeds[:20]})"]  # fmt: skip
    labels = ", ".join(f"{k} {v}" for k, v in sorted(summary["labels"].items()))
    lines += ["", f"{len(results)} scenarios in {seconds:.0f}s; labels: {labels}"]
    lines.append(last_line(summary))
    return "\n".join(lines)


def label_report(results: list[dict[str, Any]], seconds: float) -> str:
    """The labels alone: each scenario's label or drop, with the counterfactual outcomes."""
    lines = []
    for r in results:
        runs = " ".join(f"{name}={run.get('outcome', '?')[0]}"
                        for name, run in (r.get("counterfactuals") or {}).items())  # fmt: skip
        label = r["label"] or f"(dropped: {r['dropped']})"
        lines.append(f"{r['seed']:5d} {r['family']:11s} {r.get('injected', ''):12s} {label:34s} "
                     f"{runs}  | {r.get('rule', '')}"[:300])  # fmt: skip
    summary = summarise(results)
    lines += ["", "labels: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["labels"].items()))]
    for reason, count in sorted(summary["dropped_by_reason"].items(), key=lambda x: -x[1]):
        lines.append(f"dropped {count:4d}  {reason}")
    lines.append(f"{len(results)} scenarios labelled in {seconds:.0f}s")
    return "\n".join(lines)


class _Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.wrong, self.dropped = total, 0, 0, 0
        self.started = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def update(self, result: dict[str, Any]) -> None:
        self.done += 1
        self.dropped += result.get("label") is None
        self.wrong += result.get("label") is not None and not result.get("right")
        elapsed = time.perf_counter() - self.started
        text = (f"scenarios {self.done}/{self.total}  wrong {self.wrong}  dropped {self.dropped}"
                f"  {elapsed:.0f}s")  # fmt: skip
        if self.tty:
            print(f"\r{text}", end="" if self.done < self.total else "\n", file=sys.stderr,
                  flush=True)  # fmt: skip
        elif self.done == self.total or self.done % 10 == 0:
            print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=parse_seeds, help="A:B, the seeds A to B-1 (or A:B,N,...)")
    parser.add_argument("--seed", type=int, help="one seed (with --keep: write its scripts)")
    parser.add_argument("--jobs", type=int, default=1, help="scenarios run in parallel")
    parser.add_argument("--json", metavar="PATH", help="write every scenario's record here")
    parser.add_argument("--only", choices=FAMILIES, help="only the seeds of this family")
    parser.add_argument("--keep", metavar="DIR", type=Path,
                        help="with --seed: write the script, its variants and the run here")
    parser.add_argument("--relabel", action="store_true", help="ignore the cached labels")
    parser.add_argument("--cache", metavar="DIR", type=Path, default=OUT,
                        help=f"where labels are cached (default {OUT.relative_to(HERE.parent)})")
    parser.add_argument("--labels-only", action="store_true",
                        help="establish (or read) the labels and skip nanscope: an audit")
    args = parser.parse_args(argv)
    if (args.seeds is None) == (args.seed is None):
        parser.error("give --seeds A:B or --seed N")
    if args.keep is not None and args.seed is None:
        parser.error("--keep goes with --seed N")
    version = generator_version()
    if args.keep is not None:
        _init_worker()
        result = run_one(args.seed, version, args.relabel, keep=args.keep, cache=args.cache)
        print(json.dumps(result, indent=1, default=str))
        return 0
    seeds = args.seeds if args.seeds is not None else [args.seed]
    if args.only:
        seeds = [s for s in seeds if FAMILIES[s % len(FAMILIES)] == args.only]
    if not seeds:
        parser.error("no seed to run")
    started = time.perf_counter()
    progress = _Progress(len(seeds))
    results: list[dict[str, Any]] = []
    jobs = max(1, min(args.jobs, len(seeds)))
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs, initializer=_init_worker, maxtasksperchild=50) as pool:
        tasks = [(s, version, args.relabel, args.labels_only, args.cache) for s in seeds]
        for result in pool.imap_unordered(_work, tasks):
            results.append(result)
            progress.update(result)
    results.sort(key=lambda r: r["seed"])
    seconds = time.perf_counter() - started
    if args.json:
        payload = {"schema": "nanscope.scenarios/1", "generator": version,
                   "seeds": seeds, "seconds": round(seconds, 1),
                   "summary": summarise(results), "scenarios": results}  # fmt: skip
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str))
    errors = [r for r in results if r.get("dropped") == "bench error"]
    for r in errors:
        print(f"bench error on seed {r['seed']}:\n{r.get('traceback')}", file=sys.stderr)
    print(label_report(results, seconds) if args.labels_only else report(results, seconds))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
