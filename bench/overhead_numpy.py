"""Overhead of Monitor.update on a numpy gradient-descent step of an ~85k-parameter model.

Four arms in one process, each with its own copy of the weights and the same minibatches: plain
steps; floor steps, the plain step plus what no NaN check can skip (the loss read and one pass
over every gradient, ``np.vdot``, its sum checked finite); steps watched by a Monitor (buffered
trace writer); and steps watched by a Monitor whose writer writes every record straight to disk
(``TraceWriter(flush_lines=1)``, the writer before buffering). Every step of every arm is a whole
step (gradient, Monitor.update, weight update), timed in CPU time of this process (robust to other
processes on a shared machine); the arms run in a rotating order (each one first, second, third
and last in turn) and the medians are compared. The rotation keeps their cycle: the watched arm
follows the floor arm three steps in four, as a real update follows the user's own code, and the
write-through arm follows the watched one, whose ``Monitor.update`` has just warmed the same code:
it reads ~1 point lower for that (1.036-1.037 against 1.045-1.049 with both writers buffered, on
the development machine), so the watched arm is the one to read.

The headline is watched/plain over whole steps: what the user's loop pays; floor/plain beside it
says how much of that no NaN check can skip. The time of ``Monitor.update`` alone is printed too,
its median and its mean: on the development machine the mean is about half again the median,
because one update in eight judges the eight records waiting and one in four takes the weight
sample, and the median of whole steps moves with the mean of the update, not with its median.
(plain + mean update) / plain is the upper bound: the update is the first to read the fresh
gradients, a memory pass the user's own weight update then does not pay (in the whole-step ratio
it is paid once, as in the plain arm).
Target: watched/plain <= 1.05.

The same code's ``Monitor.update`` differs from one process to the next by up to a quarter on the
development machine (median 45 us in one run, 57 us in the next, the plain step 1.69-1.70 ms in
both: where the interpreter's objects land in the caches moves with each process), so the bench
runs ``--processes`` (default 3) processes one after the other and prints each one's ratios and
their median.

    python bench/overhead_numpy.py [--steps 1200] [--batch 256] [--no-write] [--processes 3]
"""

from __future__ import annotations

import os

# one BLAS thread: the comparison is about nanscope's work, not about thread scheduling noise
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import nanscope  # noqa: E402
from nanscope.trace import TraceWriter  # noqa: E402


def make_problem(batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    d_in, hidden, d_out = 256, 320, 10  # 256*320 + 320 + 320*10 + 10 = 85,450 + ... ~ 85k-100k
    X = rng.normal(size=(batch * 8, d_in))
    y = rng.integers(0, d_out, size=batch * 8)
    params = {
        "W1": rng.normal(scale=1 / np.sqrt(d_in), size=(d_in, hidden)),
        "b1": np.zeros(hidden),
        "W2": rng.normal(scale=1 / np.sqrt(hidden), size=(hidden, d_out)),
        "b2": np.zeros(d_out),
    }
    return X, y, params


def loss_and_grads(params, Xb, yb):
    h = np.maximum(Xb @ params["W1"] + params["b1"], 0.0)
    logits = h @ params["W2"] + params["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    n = len(yb)
    loss = -np.mean(np.log(p[np.arange(n), yb] + 1e-12))
    d = p
    d[np.arange(n), yb] -= 1.0
    d /= n
    grads = {"W2": h.T @ d, "b2": d.sum(axis=0)}
    dh = (d @ params["W2"].T) * (h > 0)
    grads["W1"] = Xb.T @ dh
    grads["b1"] = dh.sum(axis=0)
    return loss, grads


def floor_check(loss: float, grads: dict[str, np.ndarray]) -> None:
    """What no NaN check can skip: the loss read, one pass over every gradient, both checked."""
    if not math.isfinite(float(loss)):
        raise FloatingPointError("non-finite loss")
    total = 0.0
    for g in grads.values():
        total += float(np.vdot(g, g))
    if not total < math.inf:
        raise FloatingPointError("non-finite gradient")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--no-write", action="store_true", help="keep the trace in memory only")
    ap.add_argument("--processes", type=int, default=3,
                    help="processes run one after the other; their median is printed")  # fmt: skip
    args = ap.parse_args()
    if args.processes > 1:
        _in_processes(args)
        return
    X, y, params = make_problem(args.batch)
    arms = ("plain", "floor", "watched", "write-through")
    weights = {arm: {k: v.copy() for k, v in params.items()} for arm in arms}
    n_params = sum(v.size for v in params.values())
    lr = 0.05
    with tempfile.TemporaryDirectory() as tmp:
        monitors = {
            "plain": None,
            "floor": None,
            "watched": nanscope.Monitor(run_dir=f"{tmp}/run", write=not args.no_write),
            "write-through": nanscope.Monitor(
                run_dir=f"{tmp}/through",
                write=not args.no_write,
                writer=TraceWriter(f"{tmp}/through/trace.jsonl", flush_lines=1),
            ),
        }
        steps: dict[str, list[float]] = {arm: [] for arm in arms}
        updates: dict[str, list[float]] = {arm: [] for arm in arms}
        rng = np.random.default_rng(1)
        for step in range(args.steps):
            idx = rng.integers(0, len(X), size=args.batch)
            Xb, yb = X[idx], y[idx]
            for j in range(len(arms)):
                arm = arms[(step + j) % len(arms)]  # rotate: no arm always runs after another
                w, mon = weights[arm], monitors[arm]
                t0 = time.process_time()
                loss, g = loss_and_grads(w, Xb, yb)
                u0 = time.process_time()
                if mon is not None:
                    mon.update(loss, params=w, grads=g, lr=lr, inputs=Xb, targets=yb)
                elif arm == "floor":
                    floor_check(loss, g)
                u1 = time.process_time()
                for k in w:
                    w[k] -= lr * g[k]
                t1 = time.process_time()
                if step >= 20:  # warm-up excluded
                    steps[arm].append(t1 - t0)
                    updates[arm].append(u1 - u0)
        for mon in monitors.values():
            if mon is not None:
                mon.close()
    p, f, w, o = (statistics.median(steps[arm]) for arm in arms)
    u, uo = statistics.median(updates["watched"]), statistics.median(updates["write-through"])
    um = statistics.mean(updates["watched"])
    print(f"model: {n_params:,} parameters, batch {args.batch}, {args.steps} steps per arm, "
          f"trace {'in memory' if args.no_write else 'written to disk'}")  # fmt: skip
    print(f"plain step                   median {p * 1e3:8.3f} ms")
    print(f"floor step                   median {f * 1e3:8.3f} ms "
          f"(the check alone {statistics.median(updates['floor']) * 1e6:.0f} us)")  # fmt: skip
    print(f"watched step                 median {w * 1e3:8.3f} ms")
    print(f"watched step, write-through  median {o * 1e3:8.3f} ms")
    print(f"Monitor.update alone         median {u * 1e6:8.0f} us "
          f"(write-through {uo * 1e6:.0f} us), mean {um * 1e6:.0f} us")  # fmt: skip
    print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    print(f"ratio watched/plain (whole steps): {w / p:.3f}")
    print(f"ratio floor/plain, the loss read and one pass over the gradients: {f / p:.3f}")
    print(f"ratio watched/plain, write-through writer: {o / p:.3f}")
    print(f"upper bound (plain + mean Monitor.update alone) / plain: {(p + um) / p:.3f} "
          f"(with its median: {(p + u) / p:.3f})")  # fmt: skip


def _in_processes(args: argparse.Namespace) -> None:
    """Run the bench in ``args.processes`` fresh processes; each one's output, then the medians."""
    import subprocess
    import sys

    command = [sys.executable, __file__, "--processes", "1", "--steps", str(args.steps),
               "--batch", str(args.batch)] + (["--no-write"] if args.no_write else [])  # fmt: skip
    ratios: dict[str, list[float]] = {}
    for k in range(args.processes):
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        print(f"--- process {k + 1} of {args.processes}")
        print(out, end="")
        for line in out.splitlines():
            if line.startswith("ratio "):
                label, _, value = line.rpartition(": ")
                ratios.setdefault(label, []).append(float(value.split()[0]))
    print(f"--- median of {args.processes} processes")
    for label, values in ratios.items():
        print(f"{label}: {statistics.median(values):.3f} "
              f"(each: {', '.join(f'{v:.3f}' for v in values)})")  # fmt: skip


if __name__ == "__main__":
    main()
