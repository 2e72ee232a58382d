"""Overhead of watching DDP training: plain vs watched (local) vs watched + agreement, 2 CPU ranks.

::

    python bench/overhead_ddp.py [--updates 30] [--rounds 5] [--width 512] [--batch 128]

Spawns two processes (``torch.multiprocessing.spawn``, gloo, one thread each). In each, one DDP
model (a 3-layer MLP, Adam) trains in alternating segments of ``--updates`` updates: plain,
a :class:`nanscope.torch.Watcher` alone (no agreement), and ``nanscope.watch`` (which under a
process group of two ranks adds the cross-rank agreement, one ``all_reduce`` per update). Each
watcher is made before its segment and closed after it, outside the timed region. Rank 0 prints
the median time per update of each and the ratios against plain, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, args: Any, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import nanscope
    import torch
    from nanscope.torch import distributed as nd
    from nanscope.torch.watch import Watcher
    from torch import nn

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    w = args.width
    model = DDP(nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                              nn.Linear(w, 1)))  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randn(args.batch, 64, generator=gen) for _ in range(8)]
    targets = [b[:, :1].clone() for b in batches]
    loss_fn = nn.MSELoss()
    root = Path(tempfile.mkdtemp(prefix="nanscope-ddp-bench-"))

    def segment(n: int) -> float:
        dist.barrier()
        start = time.perf_counter()
        for i in range(n):
            x, y = batches[i % 8], targets[i % 8]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - start) / n

    segment(10)  # warm up
    times: dict[str, list[float]] = {"plain": [], "watch": [], "watch+agree": []}
    names = list(times)
    for r in range(args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:  # rotate the order: drift hits all alike
            watcher = None
            if name == "watch":
                watcher = Watcher(model, opt, run_dir=root / f"w{r}" / f"rank{rank}")
            elif name == "watch+agree":
                watcher = nanscope.watch(model, opt, run_dir=root / f"a{r}")
            times[name].append(segment(args.updates))
            if watcher is not None:
                watcher.close()
    ag = nd.DistributedAgreement()  # the collective alone, timed on its own
    dist.barrier()
    start = time.perf_counter()
    for i in range(200):
        ag.agree(False, None, i + 1)
    times["agree_call"] = [(time.perf_counter() - start) / 200]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, times)
    if rank == 0:
        med = {k: statistics.median(v for t in gathered for v in t[k]) for k in times}
        lines = [
            f"DDP overhead, {world} CPU ranks (gloo), MLP 64-{w}-{w}-1, batch {args.batch}, Adam; "
            f"{args.rounds} rounds x {args.updates} updates per variant, alternating",
        ]
        call = med.pop("agree_call")
        for k, v in med.items():
            lines.append(f"  {k:12s} {v * 1e3:8.3f} ms/update   ratio {v / med['plain']:.3f}")
        lines.append(f"watched/plain ratio: {med['watch+agree'] / med['plain']:.3f} "
                     f"(agreement alone: {med['watch+agree'] / med['watch']:.3f})")  # fmt: skip
        lines.append(f"one agree() call: {call * 1e6:.0f} us = {call / med['plain']:.4f} of a "
                     "plain update")  # fmt: skip
        Path(out).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.txt")
        mp.spawn(_worker, args=(2, _free_port(), args, out), nprocs=2, join=True)
        print(Path(out).read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
