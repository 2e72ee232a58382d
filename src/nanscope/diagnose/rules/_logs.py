"""What a rule may say about a trace read from a log someone already has.

A log holds what its author printed, no more: rules say only what it holds (a loss "with finite
weights" needs logged weights) and give advice that fits a run that is over: what to log next
time and what to rerun, not which argument to pass to ``Monitor.update``.
"""

from __future__ import annotations

from nanscope.diagnose.context import Context

__all__ = ["WHAT", "from_log", "record_more", "unlogged"]

#: record key -> what it is, as a reader of a log calls it
WHAT = {
    "grad_norm": "the gradient norm",
    "weight_norm": "the weights",
    "input_absmax": "the inputs",
    "lr": "the learning rate",
}


def from_log(ctx: Context) -> bool:
    """True when the trace was read from a log (text, CSV, JSONL, trainer_state, TensorBoard),
    not written by a nanscope Monitor."""
    return ctx.trace.meta.get("format") not in (None, "nanscope")


def unlogged(ctx: Context, *keys: str) -> list[str]:
    """The keys of ``keys`` no record carries."""
    return [key for key in keys if not ctx.trace.has(key)]


def record_more(ctx: Context, missing: list[str], live: str) -> str:
    """The action that asks for what was not recorded: ``live`` for a Monitor's trace; for a log,
    what to log next time and how to rerun."""
    if not from_log(ctx):
        return live
    what = [WHAT.get(key, key) for key in missing] or ["the gradient norm"]
    return (
        "Next run, log " + ", ".join(what) + " per update next to the loss (with PyTorch, "
        "`nanscope run -- python train.py` records them with no code change and replays the "
        "failing update), then diagnose the new log."
    )
