"""Overhead of watching FSDP2 training: plain vs watched, 2 CPU ranks (gloo), interleaved.

::

    python bench/overhead_fsdp.py [--updates 30] [--rounds 6] [--width 512] [--batch 128]
                                  [--ranks 2]

``--ranks 1`` runs the same on a one-rank mesh: the local cost of the sharded measures without
the time one rank waits for the other in each collective (which dominates on a busy machine).

Spawns two processes (``torch.multiprocessing.spawn``, gloo, one thread each). In each, one FSDP2
model (a 3-layer MLP, every Linear and the root ``fully_shard``-ed, Adam) trains in alternating
segments of ``--updates`` updates: plain, and watched (``nanscope.watch``, which under
``torch.distributed`` also makes the ranks agree on every stop). Each watcher is made, and its
first two updates taken, before its segment and closed after it, outside the timed region; the
order of the two rotates every round so drift hits both alike.

In the watched segments every ``torch.distributed.all_reduce`` is timed: FSDP2 itself only
all-gathers and reduce-scatters, so those are exactly nanscope's collectives (the sharded
measures' combine and the agreement, one each per update). Rank 0 prints the median time per
update of each variant, the ratio watched / plain (of the medians of per-update times, and per
round), the time per update inside nanscope's step hook (timed directly: it holds the measures,
the detectors and both collectives) and the collectives' share of it and of the watched update.
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
    from torch.distributed.fsdp import fully_shard

    import nanscope
    import torch
    from torch import nn

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, 1))  # fmt: skip
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randn(args.batch, 64, generator=gen) for _ in range(8)]
    targets = [b[:, :1].clone() for b in batches]
    loss_fn = nn.MSELoss()
    root = Path(tempfile.mkdtemp(prefix="nanscope-fsdp-bench-"))

    spent = [0.0, 0]  # seconds inside all_reduce, calls
    hook = [0.0]  # seconds inside the watcher's step hook
    original = dist.all_reduce

    def timed(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            spent[0] += time.perf_counter() - start
            spent[1] += 1

    def updates(n: int, offset: int = 0) -> None:
        for i in range(n):
            x, y = batches[(i + offset) % 8], targets[(i + offset) % 8]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

    def segment(n: int) -> list[float]:
        """Per-update times (their median is robust to a rank descheduled on a busy machine)."""
        dist.barrier()
        out = []
        for i in range(n):
            start = time.perf_counter()
            updates(1, offset=i)
            out.append(time.perf_counter() - start)
        return out

    updates(10)  # warm up
    times: dict[str, list[float]] = {"plain": [], "watched": []}
    share: list[float] = []
    calls: list[float] = []
    rounds: list[float] = []  # watched / plain, per round
    in_hook: list[float] = []
    for r in range(args.rounds):
        for name in (("plain", "watched") if r % 2 == 0 else ("watched", "plain")):
            watcher = None
            if name == "watched":
                watcher = nanscope.watch(model, opt, run_dir=root / f"w{r}")
                updates(2, offset=3)  # the measure is made and checked once: not timed
                dist.all_reduce = timed  # type: ignore[assignment]
                spent[0], spent[1] = 0.0, 0
                hook[0] = 0.0
                check = watcher.check

                def timed_check(*a: Any, _check: Any = check, **k: Any) -> Any:
                    start = time.perf_counter()
                    try:
                        return _check(*a, **k)
                    finally:
                        hook[0] += time.perf_counter() - start

                watcher.check = timed_check  # type: ignore[method-assign]
            per_update = segment(args.updates)
            times[name].extend(per_update)
            if watcher is not None:
                dist.all_reduce = original  # type: ignore[assignment]
                share.append(spent[0] / args.updates)
                in_hook.append(hook[0] / args.updates)
                calls.append(spent[1] / args.updates)
                watcher.close()
        rounds.append(statistics.median(times["watched"][-args.updates:])
                      / statistics.median(times["plain"][-args.updates:]))  # fmt: skip
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {**times, "collective": share, "calls": calls,
                                      "rounds": rounds, "hook": in_hook})  # fmt: skip
    if rank == 0:
        med = {k: statistics.median(v for t in gathered for v in t[k]) for k in gathered[0]}
        plain, watched, coll = med["plain"], med["watched"], med["collective"]
        lines = [
            f"FSDP2 overhead, {world} CPU ranks (gloo), MLP 64-{w}-{w}-1 fully_shard-ed, batch "
            f"{args.batch}, Adam; {args.rounds} rounds x {args.updates} updates per variant, "
            "alternating",
            f"  plain    {plain * 1e3:8.3f} ms/update",
            f"  watched  {watched * 1e3:8.3f} ms/update",
            f"watched/plain ratio: {watched / plain:.3f} (median of per-update times; per round "
            + ", ".join(f"{r:.2f}" for r in gathered[0]["rounds"]) + ")",
            f"nanscope's step hook: {med['hook'] * 1e3:.3f} ms/update = "
            f"{med['hook'] / plain:.3f} of a plain update",
            f"nanscope's collectives: {med['calls']:.1f} all_reduce per update, "
            f"{coll * 1e3:.3f} ms/update = {coll / max(med['hook'], 1e-12):.2f} of the hook, "
            f"{coll / watched:.3f} of a watched update",
        ]
        Path(out).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.txt")
        mp.spawn(_worker, args=(args.ranks, _free_port(), args, out), nprocs=args.ranks,
                 join=True)  # fmt: skip
        print(Path(out).read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
