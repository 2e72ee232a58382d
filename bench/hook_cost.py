"""Where a watched update's time goes: each hook's own time as a share of the plain step, in situ.

    python bench/hook_cost.py [--rounds 40] [--block 32] [--workloads mlp512,lstm2]

Whole-step ratios (``bench/overhead.py``) are what a user pays, but on a shared machine their
rounds spread over 5-15 points, so a change of a point in nanscope's own code does not show.
This script measures that code directly: one watcher per workload, the time spent inside each of
its entry points (the model's forward pre- and post-hooks, the loss-module call, the backward
notifier, the optimizer's step pre- and post-hooks, and within the step pre-hook the gradient
norms, the batched judging, the full updates' measures, the lean updates' direction samples and
the history the decisive experiment replays from: inputs by reference, snapshots now and then)
is summed over a block of updates, and divided by the time of a plain block run right after it
with the watcher paused (its hook entries taken out of torch's hook dicts and the process-wide
patches pointed at no watcher, so the same model, the same memory and the same watcher
alternate). The median over rounds of that share is printed per part; most of the machine's
drift divides out of it (runs minutes apart agree within ~0.2 point; over hours the share moves
with how busy the machine is, so compare two versions of the code in alternating runs). The
full updates (every ``every``-th, 64 by default) and the samples after them fall in some blocks
and not others: those two parts are their total over all rounds' plain time, what they cost
spread over every update. A direction sample is taken on the lean updates of a climb (from the
second rise in a row) too, so a noisy loss pays more of them than a falling one. Python right
after the step's kernels runs in a cold cache, so these are the costs the loop pays, not a warm
loop's.

What the hooks' own time leaves out, and the whole-step ratio includes: torch's slower module
call when a module has hooks, the patches' own wrappers, and what a hook's work changes for the
step's code after it (the user's Python and kernels run after nanscope's in a colder cache; the
norm pass warms the cache for the optimizer). "beyond the hooks" is all of that together: the
watched block's time less its hooks' time and the plain block's, as a share of the plain block
(the timers here add ~3 us an update to it). It is the difference of two noisy block times: its
median over many rounds is what to read.
The allocator is pinned first, as in ``overhead.py`` (see ``_alloc.py``; ``--malloc default``
leaves it as it comes).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

from _alloc import pin_allocator  # type: ignore[import-not-found]
from overhead import LOOPS, WORKLOADS, loop  # type: ignore[import-not-found]

import nanscope
import torch
from nanscope.torch import _hooks
from nanscope.torch.measure import ParamMeasure


def _timed(fn: Callable[..., Any], part: str, acc: dict[str, int]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[part] = acc.get(part, 0) + time.perf_counter_ns() - start

    return timed


def run(name: str, rounds: int, block: int, warm: int) -> dict[str, float]:
    work = loop(name, "cpu")
    model, opt = work.model, work.opt

    def step() -> None:
        work.step(False)

    acc: dict[str, int] = {}
    shares: dict[str, list[float]] = {}
    totals: dict[str, int] = {}
    plain_total = 0
    norms = ParamMeasure.lean_norms
    with tempfile.TemporaryDirectory() as run_dir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        watcher = nanscope.watch(model, opt, policy="warn", run_dir=run_dir)
        for hooks, part in ((model._forward_pre_hooks, "forward pre-hook"),
                            (model._forward_hooks, "forward hook"),
                            (opt._optimizer_step_pre_hooks, "step pre-hook"),
                            (opt._optimizer_step_post_hooks, "step post-hook")):  # fmt: skip
            for key in list(hooks):
                hooks[key] = _timed(hooks[key], part, acc)
        notify = _hooks._notify_backward
        _hooks._notify_backward = _timed(notify, "backward", acc)
        watcher.on_loss_module = _timed(watcher.on_loss_module, "loss module", acc)  # type: ignore[method-assign]
        watcher.on_clip = _timed(watcher.on_clip, "clip", acc)  # type: ignore[method-assign]
        watcher.lean.drain = _timed(watcher.lean.drain, "  judging (batched)", acc)  # type: ignore[method-assign]
        ParamMeasure.lean_norms = _timed(norms, "  gradient norms", acc)  # type: ignore[method-assign]
        # the scheduled work inside the step pre-hook: the full measures of every `every`-th
        # update (and of an update the lean check hands over), and the direction samples of the
        # lean updates (a climb's, and the one after a full update), with the rise count
        records = watcher.records
        full = f"  full updates (every {records.every})"
        records.pack = _timed(records.pack, full, acc)  # type: ignore[method-assign]
        watcher._process = _timed(watcher._process, full, acc)  # type: ignore[method-assign]
        records.sample_if_wanted = _timed(  # type: ignore[method-assign]
            records.sample_if_wanted, "  direction samples", acc
        )
        # what the decisive experiment needs kept: each update's inputs by reference, and a
        # snapshot of the weights and optimizer state every `every` updates (torch/history.py);
        # timed once the warm-up read the training step (the timer is a frame of its own)
        history = "  history (inputs, snapshots)"
        try:
            for _ in range(warm):
                step()
            watcher.history.on_check = _timed(  # type: ignore[method-assign]
                watcher.history.on_check, history, acc
            )
            paused: list[Any] = []

            def pause() -> None:
                for handle in watcher._handles:
                    hooks = handle.hooks_dict_ref()
                    paused.append((hooks, handle.id, hooks.pop(handle.id)))
                paused.append(_hooks._LISTENERS_NOW)
                _hooks._LISTENERS_NOW = ()

            def resume() -> None:
                _hooks._LISTENERS_NOW = paused.pop()
                for hooks, key, hook in paused:
                    hooks[key] = hook
                paused.clear()

            for r in range(rounds):
                # a watched and a plain block, which first alternating (the machine drifts)
                for arm in ("watched", "plain") if r % 2 == 0 else ("plain", "watched"):
                    if arm == "plain":
                        pause()
                    acc.clear()
                    start = time.perf_counter_ns()
                    for _ in range(block):
                        step()
                    elapsed = time.perf_counter_ns() - start
                    if arm == "watched":
                        watched, spent = elapsed, dict(acc)
                    else:
                        plain = elapsed
                        resume()
                outer = sum(v for k, v in spent.items() if not k.startswith(" "))
                shares.setdefault("all hooks", []).append(outer / plain)
                # what watching adds outside the hooks' own time: torch's module call with hooks,
                # the patches' wrappers, the timers here (~3 us an update), and the user's code
                # running after nanscope's
                shares.setdefault("beyond the hooks", []).append((watched - outer - plain) / plain)
                plain_total += plain
                for part, spent_ns in spent.items():
                    shares.setdefault(part, []).append(spent_ns / plain)
                    totals[part] = totals.get(part, 0) + spent_ns
        finally:
            _hooks._notify_backward = notify
            ParamMeasure.lean_norms = norms  # type: ignore[method-assign]
            watcher.close()
    # a block holds one full update or none (and so the samples after it): the scheduled parts
    # are shares of the totals, the others medians of the rounds' shares
    return {part: totals[part] / plain_total if part in (full, "  direction samples", history)
            else statistics.median(values) for part, values in shares.items()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=32, help="updates per block")
    parser.add_argument("--warm", type=int, default=130, help="updates before the first block")
    parser.add_argument("--workloads", default=",".join([*WORKLOADS, *LOOPS]))
    parser.add_argument("--malloc", choices=("pinned", "default"), default="pinned")
    args = parser.parse_args()
    allocator = pin_allocator() if args.malloc == "pinned" else "allocator as it comes"
    print(f"nanscope hook time per update, as a share of the plain step (median of {args.rounds} "
          f"rounds of {args.block} watched and {args.block} plain updates), torch "
          f"{torch.__version__}, {torch.get_num_threads()} thread(s); {allocator}")  # fmt: skip
    for name in args.workloads.split(","):
        shares = run(name, args.rounds, args.block, args.warm)
        parts = sorted(shares.items(), key=lambda kv: (kv[0] != "all hooks", -kv[1]))
        print(f"{name:12s} " + "  ".join(f"{part.strip()} {100 * v:.2f}%" for part, v in parts))


if __name__ == "__main__":
    main()
