"""Overhead of Monitor.update on a numpy gradient-descent step of a ~100k-parameter model.

Runs plain and watched steps interleaved in one process (ABAB...) so both see the same machine
state, timed in CPU time of this process (robust to other processes on a shared machine), and
prints the median per-step times and their ratio. Target: watched/plain <= 1.03-1.05.

A second Monitor, fed the same update right after, writes every record straight to disk (the
writer as it was before buffering, ``TraceWriter(flush_lines=1)``): the two ratios compare the
buffered writer with the write-through one in the same run. The order of the two alternates.

    python bench/overhead_numpy.py [--steps 400] [--batch 256] [--no-write]
"""

from __future__ import annotations

import os

# one BLAS thread: the comparison is about nanscope's work, not about thread scheduling noise
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--no-write", action="store_true", help="keep the trace in memory only")
    args = ap.parse_args()
    X, y, params_a = make_problem(args.batch)
    params_b = {k: v.copy() for k, v in params_a.items()}
    n_params = sum(v.size for v in params_a.values())
    lr = 0.05
    with tempfile.TemporaryDirectory() as tmp:
        mon = nanscope.Monitor(run_dir=f"{tmp}/run", write=not args.no_write)
        through = nanscope.Monitor(
            run_dir=f"{tmp}/through",
            write=not args.no_write,
            writer=TraceWriter(f"{tmp}/through/trace.jsonl", flush_lines=1),
        )
        plain, watched, update_only, update_through = [], [], [], []
        rng = np.random.default_rng(1)
        for step in range(args.steps):
            idx = rng.integers(0, len(X), size=args.batch)
            Xb, yb = X[idx], y[idx]
            t0 = time.process_time()
            loss, g = loss_and_grads(params_a, Xb, yb)
            for k in params_a:
                params_a[k] -= lr * g[k]
            t1 = time.process_time()
            loss, g = loss_and_grads(params_b, Xb, yb)
            first, second = (mon, through) if step % 2 else (through, mon)
            u0 = time.process_time()
            first.update(loss, params=params_b, grads=g, lr=lr, inputs=Xb, targets=yb)
            u1 = time.process_time()
            second.update(loss, params=params_b, grads=g, lr=lr, inputs=Xb, targets=yb)
            u2 = time.process_time()
            ours, old = (u1 - u0, u2 - u1) if first is mon else (u2 - u1, u1 - u0)
            for k in params_b:
                params_b[k] -= lr * g[k]
            t2 = time.process_time()
            if step >= 20:  # warm-up excluded
                plain.append(t1 - t0)
                watched.append(t2 - t1 - old)
                update_only.append(ours)
                update_through.append(old)
        mon.close()
        through.close()
    p, w, u, o = (statistics.median(v) for v in (plain, watched, update_only, update_through))
    print(f"model: {n_params:,} parameters, batch {args.batch}, {args.steps} steps, "
          f"trace {'in memory' if args.no_write else 'written to disk'}")  # fmt: skip
    print(f"plain step       median {p * 1e3:8.3f} ms")
    print(f"watched step     median {w * 1e3:8.3f} ms")
    print(f"Monitor.update   median {u * 1e6:8.0f} us")
    print(f"Monitor.update, write-through writer  median {o * 1e6:8.0f} us")
    print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    print(f"ratio (plain + Monitor.update) / plain: {(p + u) / p:.3f}")
    print(f"ratio (plain + update, write-through writer) / plain: {(p + o) / p:.3f}")
    print(f"ratio watched/plain (whole steps, noisier): {w / p:.3f}")


if __name__ == "__main__":
    main()
