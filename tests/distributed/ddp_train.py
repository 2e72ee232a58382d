"""A tiny DDP fit for the distributed tests (run by torchrun, one process per rank).

Options (environment): DDP_NAN_RANK / DDP_NAN_STEP put a NaN in row DDP_NAN_ROW of that rank's
batch at that update; DDP_DIE_RANK / DDP_DIE_STEP make that rank exit at once (os._exit(1));
DDP_STEPS the number of updates; DDP_WATCH=1 watches explicitly with nanscope.watch, which agrees
across ranks by itself (otherwise the script has no nanscope code: `nanscope run`).
"""

import os
from datetime import timedelta

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch
from torch import nn


def env(name, default):
    return int(os.environ.get(name, default))


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=env("DDP_TIMEOUT", 20)))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if os.environ.get("DDP_WATCH") == "1":
        import nanscope

        nanscope.watch(model, opt)
    gen = torch.Generator().manual_seed(100 + rank)
    w_true = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    nan_rank, nan_step = env("DDP_NAN_RANK", -1), env("DDP_NAN_STEP", -1)
    die_rank, die_step = env("DDP_DIE_RANK", -1), env("DDP_DIE_STEP", -1)
    loss_fn = nn.MSELoss()
    try:
        for step in range(1, env("DDP_STEPS", 20) + 1):
            x = torch.randn(16, 4, generator=gen)
            y = x @ w_true
            if rank == nan_rank and step == nan_step:
                x[env("DDP_NAN_ROW", 5), 2] = float("nan")
            if rank == die_rank and step == die_step:
                os._exit(1)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    finally:
        if rank != die_rank:
            print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
