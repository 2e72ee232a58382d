"""What the decisive experiment's history costs a watched fit, in one process, interleaved.

    python bench/history_cost.py [--rounds R] [--block N]

A 3-layer MLP 512 wide (batch 128, Adam), trained in a loop written the way scripts write it,
under ``nanscope.watch``. The history (``torch/history.py``: each update's loop inputs by
reference, a snapshot of the weights and the optimizer state now and then) is switched on and off
between blocks of ``--block`` updates (ABAB...), so drift in the machine's speed hits both alike;
it prints the median ratio of a block with the history to one without, and the memory the
snapshots hold (the first one and the ``KEEP`` latest, each the weights, buffers and optimizer
state, on the model's device). Target (issue 39): the snapshots cost under 0.5 points of a step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import nanscope
import torch
from nanscope.torch.history import KEEP
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=64, help="updates per block")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    X, y = torch.randn(4096, 256), torch.randint(0, 10, (4096,))
    with tempfile.TemporaryDirectory() as run_dir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        watcher = nanscope.watch(model, opt, policy="warn", run_dir=run_dir)
        history = watcher.history
        on: list[float] = []
        off: list[float] = []
        for block in range(2 * args.rounds + 2):
            keep = block % 2 == 0
            history.off = None if keep else "paused by the bench"
            start = time.perf_counter()
            for i in range(args.block):  # the user's loop
                rows = slice((i * 128) % 4096, (i * 128) % 4096 + 128)
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(X[rows]), y[rows])
                loss.backward()
                opt.step()
            seconds = time.perf_counter() - start
            if block >= 2:  # the first two blocks read the training step and warm up
                (on if keep else off).append(seconds)
        history.off = None
        ratio = statistics.median(a / b for a, b in zip(on, off))
        kept = sum(t.numel() * t.element_size() for t in model.parameters())
        kept += sum(t.numel() * t.element_size() for s in opt.state.values()
                    for t in s.values() if torch.is_tensor(t))  # fmt: skip
        snapshots = (1 + KEEP) * kept
        print(f"history on/off (median of {args.rounds} pairs of {args.block}-update blocks): "
              f"{ratio:.4f}  ({100 * (ratio - 1):+.2f} points)")
        print(f"snapshot memory: {1 + KEEP} snapshots x {kept / 2**20:.1f} MiB (weights and "
              f"Adam state) = {snapshots / 2**20:.1f} MiB; plan read: "
              f"{'yes' if history.plan is not None else 'no (' + str(history.off) + ')'}")
        watcher.close()


if __name__ == "__main__":
    main()
