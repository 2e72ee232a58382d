"""``nanscope sweep [--factors 1,0.1,0.01] [--updates N] [--json PATH] [--jobs J] -- train.py``.

Exit codes: 0 a factor descended steadily (it is recommended), 1 none did, 2 bad usage or input
(bad factors, N < 1, a missing script, a script that never makes an optimizer step).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from nanscope._console import columns, rich_text, table, wrap
from nanscope.commands.base import CommandParser, write_output
from nanscope.errors import UsageError
from nanscope.experiment.sweep import FactorResult, SweepResult
from nanscope.formatting import lr as format_lr

__all__ = ["main", "parse_factors", "parser", "render"]

_BARS = "▁▂▃▄▅▆▇█"


def parse_factors(text: str) -> list[float]:
    """``"1,0.1,0.01"`` -> ``[1.0, 0.1, 0.01]``; anything but positive numbers is a UsageError."""
    out: list[float] = []
    for word in text.split(","):
        word = word.strip()
        try:
            value = float(word)
        except ValueError:
            raise UsageError(
                f"--factors: {word!r} is not a number (e.g. --factors 1,0.1,0.01)"
            ) from None
        if not (math.isfinite(value) and value > 0):
            raise UsageError(
                f"--factors: {word} is not allowed; factors must be finite numbers > 0 "
                "(e.g. --factors 1,0.1,0.01)"
            )
        if value not in out:
            out.append(value)
    return out


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name}: {text!r} is not a whole number") from None
    if value < 1:
        raise UsageError(f"{name} must be at least 1; got {value}")
    return value


def parser() -> CommandParser:
    p = CommandParser(
        prog="nanscope sweep",
        description="Rerun the first N updates of a training script with every optimizer's "
        "learning rate multiplied by each factor (same seeds, one process per factor), and "
        "recommend the largest factor whose loss descends steadily.",
        epilog="example: nanscope sweep --factors 1,0.1,0.01 -- python train.py --epochs 3",
    )
    p.add_argument("--factors", default="1,0.1,0.01", help="comma-separated lr factors")
    p.add_argument("--updates", default="50", help="updates to run per factor (default 50)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON ('-' for stdout)")
    p.add_argument("--jobs", help="child processes at once (default: the number of cores)")
    p.add_argument("--seed", default="0", help="seed for random, numpy and torch (default 0)")
    p.add_argument("--timeout", type=float, help="seconds allowed per factor")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    p.add_argument("--no-color", action="store_true", help="plain text, no colours")
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- python train.py [args]")
    return p


def _spark(losses: list[float | None], width: int = 24) -> str:
    values = [v for v in losses if v is not None]
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [values[int(i * step)] for i in range(width - 1)] + [values[-1]]
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "✗" * len(values)
    positive = all(v > 0 for v in finite)
    scaled = [math.log(v) if positive else v for v in finite]
    low, high = min(scaled), max(scaled)
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append("✗")
            continue
        s = math.log(v) if positive else v
        level = 0 if high == low else int((s - low) / (high - low) * (len(_BARS) - 1))
        out.append(_BARS[level])
    return "".join(out)


def _num(value: float | None) -> str:
    return "" if value is None else format_lr(value)


def _row(r: FactorResult, best: FactorResult | None) -> list[str]:
    mark = " ←" if best is r else ""
    return [
        format_lr(r.factor) + mark,
        _num(r.lr),
        r.phrase(),
        str(r.updates),
        _num(r.final_loss),
        _num(r.best_loss),
        _spark(r.losses),
    ]


def _style(r: FactorResult) -> str:
    if r.outcome == "descended":
        return "green"
    return "red" if r.ascends else ""


def render(result: SweepResult, *, color: bool = False, width: int | None = None) -> str:
    """The sweep as a table and the one-line conclusion, at ``width`` columns (``None``: no
    limit; the outcome wraps at its spaces, the curve shrinks to the room left), in colour
    when ``color``."""
    headers = ["factor", "lr", "outcome", "updates", "final loss", "best loss", "curve"]
    best = result.recommended
    ordered = sorted(result.results, key=lambda r: -r.factor)
    rows = [_row(r, best) for r in ordered]
    if width is not None:
        # the curve takes what the other columns leave, 8 to 24 characters
        others = sum(max(len(h.split()[-1]), *(len(row[j]) for row in rows))
                     for j, h in enumerate(headers[:-1]))  # fmt: skip
        room = max(8, min(24, width - others - 2 * (len(headers) - 1)))
        for row, r in zip(rows, ordered):
            row[-1] = _spark(r.losses, room)
    lines = table(headers, rows, width, right={3})
    texts: list[tuple[str, str]] = [(f"lr sweep over the first {result.updates} updates", "bold")]
    for line, index in lines:
        texts.append((line, _style(ordered[index]) if index >= 0 else "bold"))
    for line in wrap(result.text(), width):
        texts.append((line, ""))
    for r in result.results:
        if r.note:
            texts.extend((line, "") for line in wrap(r.note, width, f"  lr ×{r.factor:g}: "))
    if not color:
        return "".join(text + "\n" for text, _ in texts)
    from rich.text import Text

    return rich_text(*(Text(text, style=style) for text, style in texts), width=None, color=True)


def main(argv: list[str]) -> int:
    if "TORCHELASTIC_RUN_ID" in os.environ:
        from nanscope.torch.distributed import refuse_under_torchrun

        refuse_under_torchrun("sweep")
    args = parser().parse_args(argv)
    target: list[str] = list(args.target)
    if target and target[0] == "--":
        target = target[1:]
    if not target:
        raise UsageError("no script given: nanscope sweep [options] -- python train.py [args]")
    factors = parse_factors(args.factors)
    updates = _positive_int("--updates", args.updates)
    jobs = _positive_int("--jobs", args.jobs) if args.jobs is not None else None
    try:
        seed = int(args.seed)
    except ValueError:
        raise UsageError(f"--seed: {args.seed!r} is not a whole number") from None
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout must be a positive number of seconds")

    from nanscope.experiment._runner import run_sweep

    result = run_sweep(
        target,
        factors,
        updates,
        jobs=jobs,
        seed=seed,
        timeout=args.timeout,
        progress=False if args.no_progress or args.quiet else None,
    )
    if args.json:
        payload: dict[str, Any] = result.to_dict()
        write_output(json.dumps(payload, indent=2, allow_nan=False) + "\n", args.json)
    if args.json != "-":
        color = sys.stdout.isatty() and not args.no_color
        sys.stdout.write(render(result, color=color, width=columns(sys.stdout)))
    return 0 if result.recommended is not None else 1
