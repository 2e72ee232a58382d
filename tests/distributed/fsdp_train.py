"""A small FSDP2 fit for the FSDP tests (run by torchrun, one process per rank, gloo on CPU).

The model is a 3-layer MLP; every Linear and the root are ``fully_shard``-ed, so every parameter
is a DTensor sharded over the ranks. Options (environment):

FSDP_STEPS       number of updates (default 16)
FSDP_LR          SGD learning rate (default 0.05; 2.0 makes the fit diverge)
FSDP_NAN_RANK / FSDP_NAN_STEP / FSDP_NAN_ROW
                 put a NaN in that row of that rank's batch at that update
FSDP_MIXED=1     shard only the first two Linears: the last one stays a plain module
FSDP_HSDP=1      shard over a 2-D mesh (replicate 2 x shard 1: HSDP, every parameter replicated)
FSDP_WATCH=1     watch explicitly (``nanscope.watch``) and, after a stop, check the last good
                 weights: they load back (``load_last_good``) into a freshly made model and equal
                 the stopped model's shards; prints ``rank R roundtrip ok``
                 (otherwise the script has no nanscope code: ``nanscope run``)
FSDP_BREAK_RANK  make nanscope's sharded measures fail on that rank only (a planted internal fault)
FSDP_BREAK_HOOK=1 make nanscope's step hook fail on every rank at the first update (the way a
                 sharding error did before the sharded measures existed)
FSDP_REFERENCE=1 after every update, compare the watcher's record (its gradient norm and update
                 norm) with the same quantities computed on the gathered full tensors; prints
                 ``rank R reference ok N`` when all N updates agree
"""

import os
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import torch
from torch import nn


def env(name, default):
    return type(default)(os.environ.get(name, default))


def make_model(seed, mixed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 1))
    layers = [model[0], model[2]] if mixed else [model[0], model[2], model[4]]
    kwargs = {}
    if os.environ.get("FSDP_HSDP") == "1":
        from torch.distributed.device_mesh import init_device_mesh

        world = dist.get_world_size()
        kwargs["mesh"] = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "shard"))
    for layer in layers:
        fully_shard(layer, **kwargs)
    if not mixed:
        fully_shard(model, **kwargs)
    return model


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def reference_check(watcher, model, weights, previous):
    """The record of this update against the gathered full tensors (1 when they agree).

    ``weights``: the full weights this update started from, ``previous``: those of the update
    before (the record's update norm is the distance between the two)."""
    rec = watcher.monitor.trace.records[-1]
    grads = [full(p.grad) for p in model.parameters()]
    g_ref = torch.sqrt(sum(g.double().square().sum() for g in grads)).item()
    ok = abs(rec["grad_norm"] - g_ref) <= 1e-4 * g_ref
    if previous:
        u_ref = torch.sqrt(sum((w - v).double().square().sum()
                               for w, v in zip(weights, previous))).item()
        ok = ok and abs(rec["update_norm"] - u_ref) <= 1e-3 * u_ref
    if not ok:
        print(f"reference mismatch at {rec['step']}: {rec} vs {g_ref}", flush=True)
    return int(ok)


def local_state(model):
    out = {}
    for name, p in model.named_parameters():
        out[name] = (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
    return out


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=env("FSDP_TIMEOUT", 30)))
    rank = dist.get_rank()
    mixed = os.environ.get("FSDP_MIXED") == "1"
    if rank == env("FSDP_BREAK_RANK", -1):
        from nanscope.torch import sharded

        def broken(self, *args, **kwargs):
            raise RuntimeError(f"planted fault on rank {rank}")

        sharded.ShardedMeasure._pack = broken
    if os.environ.get("FSDP_BREAK_HOOK") == "1":
        from nanscope.torch import sharded

        def failing(self, *args, **kwargs):
            raise RuntimeError("planted step-hook fault")

        sharded.ShardedMeasure.device_vector = failing
    model = make_model(0, mixed)
    opt = torch.optim.SGD(model.parameters(), lr=env("FSDP_LR", 0.05))
    watcher = None
    if os.environ.get("FSDP_WATCH") == "1":
        import nanscope

        watcher = nanscope.watch(model, opt)
    reference = os.environ.get("FSDP_REFERENCE") == "1"
    agreed = 0
    previous = None
    gen = torch.Generator().manual_seed(100 + rank)
    w_true = torch.linspace(-1.0, 1.0, 8).reshape(8, 1)
    nan_rank, nan_step = env("FSDP_NAN_RANK", -1), env("FSDP_NAN_STEP", -1)
    loss_fn = nn.MSELoss()
    try:
        for step in range(1, env("FSDP_STEPS", 16) + 1):
            x = torch.randn(16, 8, generator=gen)
            y = x @ w_true
            if rank == nan_rank and step == nan_step:
                x[env("FSDP_NAN_ROW", 5), 3] = float("nan")
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if reference:
                weights = [full(p.detach()).clone() for p in model.parameters()]
            opt.step()
            if reference and watcher is None:  # under nanscope run: the watcher it made
                from nanscope.torch._hooks import live_watchers

                live = [w for w in live_watchers() if hasattr(w, "monitor")]
                watcher = live[0] if live else None
            if reference and watcher is not None:
                ok = reference_check(watcher, model, weights, previous)
                previous = weights
                agreed += ok
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if reference and agreed == env("FSDP_STEPS", 16):
            print(f"rank {rank} reference ok {agreed}", flush=True)
    except Exception as exc:
        if watcher is None or type(exc).__name__ != "DivergenceError":
            raise
        print(f"rank {rank} stopped: {str(exc).splitlines()[0]}", flush=True)
        from nanscope.torch.sharded import load_last_good

        stopped = local_state(model)
        fresh = make_model(1, mixed)
        header = load_last_good(fresh, watcher.last_good_path)
        loaded = local_state(fresh)
        same = all(torch.equal(stopped[k], loaded[k]) for k in stopped)
        finite = all(bool(torch.isfinite(v).all()) for v in loaded.values())
        print(f"rank {rank} last good step {header['step']} format {header['format']}", flush=True)
        if same and finite and stopped.keys() == loaded.keys():
            print(f"rank {rank} roundtrip ok", flush=True)
        raise
    finally:
        if reference:
            print(f"rank {rank} reference checked {agreed}", flush=True)
        print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
    # as training scripts end: without it gloo's threads can abort the process at exit
    # ("terminate called without an active exception"), with or without nanscope
    # (both ranks reach the end first: one rank tearing gloo down while the other still talks
    # to it aborted the plain run once under load)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
