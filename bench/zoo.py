"""Run every fault-zoo case and print the confusion matrix (true cause x diagnosed cause).

    python bench/zoo.py                 # numpy cases (tests/zoo/numpy)
    python bench/zoo.py --all           # also tests/zoo/torch (cases whose fit(monitor) loads)
    python bench/zoo.py -v              # one line per case: verdict, cause, confidence, time

Each case runs under a fresh ``nanscope.Monitor`` with policy ``raise`` and an in-memory trace;
the diagnosis is the one carried by the DivergenceError, or ``monitor.close()`` for runs that end.
A case that crashes is counted under the diagnosed cause ``error``. Exit status: 0 when every case
is diagnosed as its true cause, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _loader():  # type: ignore[no-untyped-def]
    path = ROOT / "tests" / "zoo" / "_zoo.py"
    spec = importlib.util.spec_from_file_location("_nanscope_zoo_loader", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_nanscope_zoo_loader", module)
    spec.loader.exec_module(module)
    return module


def confusion_table(pairs: list[tuple[str, str]]) -> str:
    """Plain-text matrix: one row per true cause, one numbered column per diagnosed cause."""
    truths = sorted({t for t, _ in pairs})
    guesses = sorted({g for _, g in pairs} | set(truths))
    counts = {(t, g): 0 for t in truths for g in guesses}
    for t, g in pairs:
        counts[t, g] += 1
    width = max(len(g) for g in guesses) + 6
    lines = [
        "true cause \\ diagnosed".ljust(width) + "".join(f"{i + 1:>4}" for i in range(len(guesses)))
    ]
    for t in truths:
        cells = "".join(f"{counts[t, g] or '.':>4}" for g in guesses)
        lines.append(f"{t}".ljust(width) + cells)
    lines.append("")
    lines.append("columns: " + ", ".join(f"{i + 1} {g}" for i, g in enumerate(guesses)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="also run tests/zoo/torch")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    args = parser.parse_args(argv)
    zoo = _loader()
    frameworks = ("numpy", "torch") if args.all else ("numpy",)
    cases = []
    for framework in frameworks:
        try:
            cases.extend(zoo.load_cases((framework,)))
        except ImportError as exc:  # e.g. torch not installed
            print(f"skipping {framework} cases: {exc}")
    pairs: list[tuple[str, str]] = []
    wrong: list[str] = []
    total = 0.0
    for case in cases:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                outcome = zoo.run_case(case)
                got = outcome.diagnosis.cause
                detail = (
                    f"{outcome.diagnosis.verdict:9s} {got:20s} "
                    f"conf {outcome.diagnosis.confidence:.2f} step {outcome.diagnosis.step}"
                )
            except Exception as exc:  # a crashing case is a result too
                got = "error"
                detail = f"error: {type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - start
        total += elapsed
        pairs.append((case.cause, got))
        if got != case.cause:
            wrong.append(f"{case.id}: true {case.cause}, diagnosed {got}")
        if args.verbose:
            mark = "ok " if got == case.cause else "XX "
            print(f"{mark}{case.id:44s} {case.cause:20s} -> {detail}  ({elapsed:.2f}s)")
    if not pairs:
        print("no zoo cases found")
        return 1
    if args.verbose:
        print()
    print(confusion_table(pairs))
    right = sum(t == g for t, g in pairs)
    print()
    print(
        f"accuracy: {right}/{len(pairs)} = {right / len(pairs):.1%}  "
        f"({len(pairs)} cases, {total:.1f}s)"
    )
    for line in wrong:
        print(f"  misjudged: {line}")
    return 0 if right == len(pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
