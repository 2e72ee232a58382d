"""Peak memory of a closure optimizer on a long unrolled graph: plain vs ``nanscope.watch``.

    python bench/overhead_lbfgs.py [--steps 200] [--updates 3] [--rounds 2] [--max-iter 20]

An ``nn.LSTMCell`` unrolled over ``--steps`` time steps, trained by ``torch.optim.LBFGS`` (the
closure is evaluated up to ``--max-iter`` times per update). Each run is its own subprocess, plain
and watched alternating (ABAB...), and reports its peak resident memory (``ru_maxrss``), its RSS
once the model and data exist (before the first update) and its CPU times. Printed: the median
peak ratio watched/plain, and the ratio of what training itself added on top of that start.
Target: peak within 10% of plain.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def _rss_now_kb() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def child(mode: str, steps: int, updates: int, max_iter: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cell = nn.LSTMCell(32, 128)
    head = nn.Linear(128, 1)
    model = nn.ModuleDict({"cell": cell, "head": head})
    x = torch.randn(steps, 64, 32)
    y = torch.randn(64, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=max_iter, history_size=10)

    def forward(xs: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(xs.shape[1], 128)
        c = torch.zeros(xs.shape[1], 128)
        for t in range(xs.shape[0]):
            h, c = cell(xs[t], (h, c))
        return head(h)

    watcher = None
    if mode == "watched":
        import nanscope

        tmp = tempfile.mkdtemp()
        watcher = nanscope.watch(model, opt, run_dir=f"{tmp}/run")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(forward(x), y)
        loss.backward()
        return loss

    start = _rss_now_kb()
    t0 = time.perf_counter()
    for _ in range(updates):
        opt.step(closure)
    wall = time.perf_counter() - t0
    if watcher is not None:
        watcher.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"mode": mode, "peak_kb": usage.ru_maxrss, "start_kb": start, "wall": wall,
                      "user": usage.ru_utime, "sys": usage.ru_stime}))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-iter", type=int, default=20)
    ap.add_argument("--child", choices=["plain", "watched"])
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps, args.updates, args.max_iter)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results: dict[str, list[dict[str, float]]] = {"plain": [], "watched": []}
    for _ in range(args.rounds):
        for mode in ("plain", "watched"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--steps", str(args.steps),
                 "--updates", str(args.updates), "--max-iter", str(args.max_iter)],
                capture_output=True, text=True, env=env, check=True,
            )  # fmt: skip
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "mode"}
           for m, rs in results.items()}  # fmt: skip
    p, w = med["plain"], med["watched"]
    print(f"LSTMCell unrolled {args.steps} steps, LBFGS max_iter={args.max_iter}, "
          f"{args.updates} updates, {args.rounds} rounds (median); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")  # fmt: skip
    for mode, m in med.items():
        peak, start = m["peak_kb"] / 1024, m["start_kb"] / 1024
        print(
            f"{mode:8s} peak {peak:8.1f} MiB  start {start:7.1f} MiB"
            f"  wall {m['wall']:6.2f} s  user {m['user']:6.2f} s  sys {m['sys']:5.2f} s"
        )
    print(f"peak RSS ratio watched/plain: {w['peak_kb'] / p['peak_kb']:.3f}")
    grown_p, grown_w = p["peak_kb"] - p["start_kb"], w["peak_kb"] - w["start_kb"]
    if grown_p > 0:
        print(f"training's own memory (peak - start) ratio: {grown_w / grown_p:.3f}")


if __name__ == "__main__":
    main()
