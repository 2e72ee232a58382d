"""Overhead of nanscope.watch on reference workloads, measured in one process, interleaved.

    python bench/overhead.py [--device cpu|cuda] [--steps N] [--rounds R] [--warm W]

For each workload (3-layer MLP 512 wide, batch 128, Adam; the same MLP on a fresh minibatch each
update, whose noisy loss takes the sample of the update's direction on a climb of two rises, as a
real fit's does; 2-layer LSTM; small TransformerEncoder; a character-level transformer of 12 small
blocks, ~100 module calls per forward; ``gpt``, a GPT-style trainer's whole loop: AdamW with two
parameter groups, warm-up and cosine schedule, two micro-batches accumulated, the loss an
expression on the logits, ``clip_grad_norm_``) it times blocks of ``--steps`` training updates,
alternating plain / floor / watched / run / detect_anomaly (ABCDEABCDE...), so drift in the
machine's speed hits all five alike, and prints the median ratio of each to plain. "floor" is what
no NaN check can skip, timed the same way: the loss read once and one pass over the gradients read
before each step (a step pre-hook), in the cheapest form measured (the lean check's own norm
pass; a loop that clips has made that pass already, and its total is read instead). "watched"
is ``nanscope.watch(model, optimizer)``; "run" is what ``nanscope run`` does to
an unchanged script (the global hooks of ``nanscope.torch.autowatch``, which find the optimizer at
its first step and the model at its first forward). Target: watched / plain and run / plain
<= 1.03 at default settings. The last line of the table says per workload whether the rounds show
it: met (the middle half of the rounds' watched/plain at or below it), not met (all of it
above), or neither (the target inside that spread, where a median is no evidence either way).

What is timed is the steady state a long run pays: each new watcher first runs ``--warm``
updates, past the first ``FLUSH_LINES`` records (written and judged one at a time, so a short run
is whole on disk), and a block is ``FULL_EVERY`` updates, so it holds exactly one of the full
updates (weight norms, per-layer norms, the batch's range) with the lean ones between them.

On a small shared VM the step of a multi-threaded torch is bimodal: on the 2-vCPU development
machine the character-level transformer's plain step took 7.3 ms or 10.3-11 ms, switching within
a process as the second vCPU was free or not, and every switch between two arms moves their
ratio. ``--threads 1`` takes that away (9.0-9.3 ms, stable); the default is torch's own choice,
what a user runs.

The allocator is pinned first (:mod:`_alloc`: glibc otherwise faults every large tensor in again
on every update, which moved the arms' ratios by up to 5% on the development machine); the
minor page faults per update of the plain and watched arms are printed beside the ratios.
``--malloc default`` runs under the allocator as it comes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

from _alloc import minor_faults, pin_allocator  # type: ignore[import-not-found]

import nanscope
import torch
from nanscope.torch import autowatch
from nanscope.torch.measure import ParamMeasure
from nanscope.torch.records import FULL_EVERY
from nanscope.trace import FLUSH_LINES
from torch import nn


def _mlp(device: str) -> tuple[nn.Module, Callable[[], Any]]:
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10)).to(device)  # fmt: skip
    x = torch.randn(128, 512, device=device)
    y = torch.randint(0, 10, (128,), device=device)
    loss_fn = nn.CrossEntropyLoss()
    return model, lambda: loss_fn(model(x), y)


def _mlp_minibatch(device: str) -> tuple[nn.Module, Callable[[], Any]]:
    """The MLP on a fresh minibatch each update (32 batches, in a fixed random order): a noisy
    loss that rises twice in a row on about a quarter of the updates, as a real fit's does (each
    such update takes the sample of the update's direction)."""
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10)).to(device)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 128, 512, generator=gen).to(device)
    y = torch.randint(0, 10, (32, 128), generator=gen).to(device)
    order = torch.randint(0, 32, (1 << 16,), generator=gen).tolist()
    loss_fn = nn.CrossEntropyLoss()
    at = [0]

    def loss_of() -> Any:
        k = order[at[0] % len(order)]
        at[0] += 1
        return loss_fn(model(x[k]), y[k])

    return model, loss_of


class _LSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(64, 128, num_layers=2, batch_first=True)
        self.head = nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _lstm(device: str) -> tuple[nn.Module, Callable[[], Any]]:
    model = _LSTM().to(device)
    x = torch.randn(32, 32, 64, device=device)
    y = torch.randn(32, 1, device=device)
    loss_fn = nn.MSELoss()
    return model, lambda: loss_fn(model(x), y)


def _transformer(device: str) -> tuple[nn.Module, Callable[[], Any]]:
    layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=256, batch_first=True,
                                       dropout=0.0)  # fmt: skip
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(device)
    x = torch.randn(16, 32, 128, device=device)
    y = torch.randn(16, 32, 128, device=device)
    loss_fn = nn.MSELoss()
    return model, lambda: loss_fn(model(x), y)


class _CharBlock(nn.Module):
    """One small pre-norm block: many small modules, each a cheap call (module-heavy)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, 4, w // 4).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, w)))
        return x + self.drop(self.down(self.act(self.up(self.norm2(x)))))


class _CharModel(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, layers: int = 12) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_CharBlock(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _chartf(device: str) -> tuple[nn.Module, Callable[[], Any]]:
    """A character-level transformer, 12 small blocks (~100 module calls per forward)."""
    model = _CharModel().to(device)
    idx = torch.randint(0, 64, (8, 32), device=device)
    target = torch.randint(0, 64, (8, 32), device=device)
    loss_fn = nn.CrossEntropyLoss()
    return model, lambda: loss_fn(model(idx).reshape(-1, 64), target.reshape(-1))


WORKLOADS = {"mlp512": _mlp, "mlp512-minibatch": _mlp_minibatch, "lstm2": _lstm,
             "transformer": _transformer, "chartf": _chartf}  # fmt: skip


class _GPTBlock(nn.Module):
    """Pre-norm causal self-attention and a 4x GELU MLP, each added back to the stream."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.Linear(width, 3 * width)
        self.attn_out = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.attn(self.ln1(x)).split(w, dim=2)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(y.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.ln2(x))


class _GPT(nn.Module):
    def __init__(self, vocab: int = 65, context: int = 64, width: int = 64, layers: int = 4,
                 heads: int = 4) -> None:  # fmt: skip
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(_GPTBlock(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT trainers do

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class _Loop:
    """One workload's model, optimizer and update: ``step()`` the plain update, ``step(True)``
    the same update plus what no NaN check can skip of it (see :func:`run`); ``clips``: the
    update calls ``clip_grad_norm_``, whose total norm is then the pass over the gradients."""

    def __init__(self, model: nn.Module, opt: Any, step: Callable[[bool], None],
                 clips: bool = False) -> None:  # fmt: skip
        self.model, self.opt, self.step, self.clips = model, opt, step, clips


def _gpt(device: str) -> _Loop:
    """A GPT-style trainer's loop, the shape of the common open-source ones: a character-level
    model (4 blocks, tied embedding), AdamW with decayed and undecayed parameter groups, a
    warm-up then cosine schedule, two micro-batches accumulated per update, the loss written as
    an expression on the logits, ``clip_grad_norm_(1.0)``, ``zero_grad`` after the step."""
    torch.manual_seed(0)
    model = _GPT().to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95))  # fmt: skip

    def lr_at(k: int) -> float:  # 20 updates of warm-up, then a cosine to a tenth over 4,000
        if k < 20:
            return (k + 1) / 20
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(k, 4000) / 4000))

    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(2)
    text = torch.randint(0, 65, (1 << 15,), generator=gen)
    starts = torch.randint(0, len(text) - 65, (1 << 14, 8), generator=gen)
    at = [0]
    micro = 2

    def step(floor: bool = False) -> None:
        for _ in range(micro):
            rows = starts[at[0] % len(starts)].tolist()
            at[0] += 1
            idx = torch.stack([text[r : r + 64] for r in rows]).to(device)
            target = torch.stack([text[r + 1 : r + 65] for r in rows]).to(device)
            logits = model(idx)
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1))
            (loss / micro).backward()
            if floor:
                float(loss.detach())  # the loss, read once per micro-batch
        total = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if floor:
            float(total)  # the clip's total norm: the pass over the gradients, read
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)

    return _Loop(model, opt, step, clips=True)


def _simple(name: str, device: str) -> _Loop:
    """A workload of :data:`WORKLOADS` in the plain loop: Adam, ``zero_grad``, backward, step."""
    torch.manual_seed(0)
    model, loss_of = WORKLOADS[name](device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(floor: bool = False) -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        if floor:
            float(loss.detach())  # and the loss, read once
        opt.step()

    return _Loop(model, opt, step)


#: whole training loops, not only a loss: each makes its own optimizer and update
LOOPS: dict[str, Callable[[str], _Loop]] = {"gpt": _gpt}


def loop(name: str, device: str) -> _Loop:
    """The workload ``name`` (of :data:`WORKLOADS` or :data:`LOOPS`), made on ``device``."""
    return LOOPS[name](device) if name in LOOPS else _simple(name, device)


_FAULTS: dict[str, int] = {}


def _block(step: Callable[[], None], steps: int, device: str, arm: str = "") -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    faults = minor_faults()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    took = time.perf_counter() - start
    if arm:
        _FAULTS[arm] = _FAULTS.get(arm, 0) + minor_faults() - faults
    return took


def run(name: str, device: str, steps: int, rounds: int, warm: int) -> dict[str, float]:
    _FAULTS.clear()
    work = loop(name, device)
    model, opt = work.model, work.opt

    def step() -> None:
        work.step(False)

    def anomaly_step() -> None:
        with torch.autograd.detect_anomaly(check_nan=True):
            step()

    params = [p for group in opt.param_groups for p in group["params"]]
    norm_pass = ParamMeasure(params, {})

    def floor_check(optimizer: Any, args: Any, kwargs: Any) -> None:
        # what no NaN check can skip: one pass over the gradients, read on the host, in the
        # cheapest form measured, the lean check's own (a dot product per tensor up to 16 of
        # them, the small tensors of a many-layer model stacked first; one fused norm call for
        # many large ones); the CUDA path's fused norm where the lean check does not apply
        if norm_pass.lean:
            norm_pass.lean_norms()
        else:
            grads = [p.grad for p in params if p.grad is not None]
            torch.stack(torch._foreach_norm(grads)).tolist()

    def floor_step() -> None:
        work.step(True)

    with tempfile.TemporaryDirectory() as run_dir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(5):
            step()
        times: dict[str, list[float]] = {"plain": [], "floor": [], "watched": [], "run": [],
                                         "anomaly": []}  # fmt: skip
        nanscope.monitor.set_defaults(policy="warn", root=run_dir)
        for _ in range(rounds):
            times["plain"].append(_block(step, steps, device, "plain"))
            # (a loop that clips made its pass over the gradients already: its total is read)
            handle = None if work.clips else opt.register_step_pre_hook(floor_check)
            times["floor"].append(_block(floor_step, steps, device))
            if handle is not None:
                handle.remove()
            watcher = nanscope.watch(model, opt, policy="warn", run_dir=run_dir)
            _block(step, warm, device)  # the start of a run (see the module's doc)
            times["watched"].append(_block(step, steps, device, "watched"))
            watcher.close()
            autowatch.enable()
            _block(step, warm + 1, device)  # the first step finds the optimizer and the model
            times["run"].append(_block(step, steps, device))
            autowatch.disarm()
            times["anomaly"].append(_block(anomaly_step, steps, device))
        nanscope.monitor.set_defaults(policy=None, root=None)
    plain = statistics.median(times["plain"])

    def ratios(key: str) -> list[float]:
        return [t / p for t, p in zip(times[key], times["plain"])]

    def ratio(key: str) -> float:
        return statistics.median(ratios(key))

    # the rounds' spread: a median within it of the target is no evidence either way
    quartiles = statistics.quantiles(ratios("watched"), n=4) if rounds > 1 else [math.nan] * 3
    return {"step_ms": 1e3 * plain / steps, "floor": ratio("floor"), "watched": ratio("watched"),
            "run": ratio("run"), "anomaly": ratio("anomaly"),
            "watched_q1": quartiles[0], "watched_q3": quartiles[2],
            "faults_plain": _FAULTS.get("plain", 0) / (rounds * steps),
            "faults_watched": _FAULTS.get("watched", 0) / (rounds * steps)}  # fmt: skip


def _child(name: str, mode: str, steps: int) -> None:
    """One workload in a fresh process (``plain``, ``watched`` or ``run``): its peak RSS."""
    import json
    import resource

    work = loop(name, "cpu")
    model, opt = work.model, work.opt
    with tempfile.TemporaryDirectory() as run_dir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nanscope.monitor.set_defaults(policy="warn", root=run_dir)
        watcher = nanscope.watch(model, opt, run_dir=run_dir) if mode == "watched" else None
        if mode == "run":
            autowatch.enable()
        for _ in range(steps):
            work.step(False)
        if watcher is not None:
            watcher.close()
        if mode == "run":
            autowatch.disarm()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mode": mode, "peak_kb": peak}))


def memory(name: str, steps: int) -> dict[str, float]:
    """Peak RSS of watched and run over plain, each in its own process (median of two)."""
    import json
    import subprocess
    import sys

    peaks: dict[str, list[int]] = {"plain": [], "watched": [], "run": []}
    for _ in range(2):
        for mode in peaks:
            out = subprocess.run(
                [sys.executable, __file__, "--child", f"{name}:{mode}", "--steps", str(steps)],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            peaks[mode].append(json.loads(out.strip().splitlines()[-1])["peak_kb"])
    plain = statistics.median(peaks["plain"])
    watched, run = statistics.median(peaks["watched"]), statistics.median(peaks["run"])
    return {"plain_mb": plain / 1024, "watched": watched / plain, "run": run / plain,
            "watched_mb": (watched - plain) / 1024, "run_mb": (run - plain) / 1024}  # fmt: skip


#: watched/plain at most this (the issue's target)
TARGET = 1.03


def verdict(result: dict[str, float]) -> str:
    """Whether the rounds show the target met: the whole middle half of the rounds' watched/plain
    below it, or above it; a median between q1 and q3 of a spread that holds the target says
    nothing either way."""
    if result["watched_q3"] <= TARGET:
        return "met"
    if result["watched_q1"] > TARGET:
        return "not met"
    if math.isnan(result["watched_q1"]):
        return "one round: no spread"
    return "the target inside the rounds' middle half"


def added(result: dict[str, float], arm: str) -> float:
    """What ``arm`` adds to an update, in microseconds (its median ratio times the plain step)."""
    return (result[arm] - 1.0) * result["step_ms"] * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=FULL_EVERY,
                        help="updates per timed block (default: one period of the full measures)")
    parser.add_argument("--warm", type=int, default=FLUSH_LINES + 2,
                        help="updates each new watcher runs before it is timed")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument("--workloads", default=",".join([*WORKLOADS, *LOOPS]))
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--malloc", choices=("pinned", "default"), default="pinned",
                        help="pin glibc's allocator first (see bench/_alloc.py) or not")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's intra-op threads (default: torch's own choice)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, mode = args.child.split(":")
        _child(name, mode, args.steps)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    allocator = pin_allocator() if args.malloc == "pinned" else "allocator as it comes"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"nanscope overhead, device={args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), {args.steps} updates x {args.rounds} "
          f"interleaved rounds, each watcher timed after {args.warm} updates; "
          f"{allocator}")  # fmt: skip
    print(f"{'workload':<16} {'plain ms/upd':>12} {'floor/plain':>12} {'watched/plain':>14} "
          f"{'run/plain':>10} {'anomaly/plain':>14} {'watched q1-q3':>14} "
          f"{'faults/upd plain, watched':>26} {'+us/upd watched, over floor':>28}")  # fmt: skip
    worst = 0.0
    floors: list[float] = []
    verdicts: dict[str, list[str]] = {}
    for name in args.workloads.split(","):
        result = run(name, args.device, args.steps, args.rounds, args.warm)
        worst = max(worst, result["watched"], result["run"])
        verdicts.setdefault(verdict(result), []).append(name)
        own = added(result, "watched") - added(result, "floor")
        print(f"{name:<16} {result['step_ms']:>12.2f} {result['floor']:>12.3f} "
              f"{result['watched']:>14.3f} {result['run']:>10.3f} "
              f"{result['anomaly']:>14.3f} "
              f"{result['watched_q1']:>8.3f}-{result['watched_q3']:.3f} "
              f"{result['faults_plain']:>17.0f}, {result['faults_watched']:.0f} "
              f"{added(result, 'watched'):>19.0f}, {own:.0f}")  # fmt: skip
        floors.append(result["floor"])
    print(f"worst watched/plain or run/plain: {worst:.3f} (target <= {TARGET}); the floor, the "
          f"loss read and one norm pass over the gradients per update: {max(floors):.3f} at worst; "
          f"q1-q3: the middle half of the rounds' watched/plain; +us/upd: the time watching adds "
          f"to an update, and the part of it above the floor (nanscope's own)")  # fmt: skip
    print("watched <= 1.03: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in verdicts.items()))
    if args.no_memory or args.device != "cpu":
        return 0
    print(f"\npeak RSS, each in its own process, {args.steps} updates (median of 2)")
    print(f"{'workload':<16} {'plain MB':>10} {'watched/plain':>14} {'run/plain':>10} "
          f"{'watched +MB':>12} {'run +MB':>8}")  # fmt: skip
    for name in args.workloads.split(","):
        mem = memory(name, args.steps)
        print(f"{name:<16} {mem['plain_mb']:>10.0f} {mem['watched']:>14.3f} {mem['run']:>10.3f} "
              f"{mem['watched_mb']:>12.1f} {mem['run_mb']:>8.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
