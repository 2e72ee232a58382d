"""Labels for ``bench/scenarios.py``, established by bare counterfactual runs.

A scenario's script runs bare (no nanscope), then, when it failed, once under each intervention
that applies to it (:func:`_scenario_gen.applicable`). Each run is judged from its own losses
(:func:`judge`); the label is the cause whose intervention removes the failure (:func:`decide`).

The bare runs execute the rendered script text in a forked child of a process that already
imported torch (about 10 ms to start instead of a fresh interpreter's second or two); only the
nanscope leg of the bench is a real subprocess.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import select
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from _scenario_gen import FAMILIES, Change, Spec, applicable, generate, render

__all__ = ["DIVERGED", "SPIKE", "decide", "establish", "judge", "right_answer", "run_script",
           "summarise_run", "warm_up"]

#: a run whose loss ends this many times above its first loss failed ("orders of magnitude")
DIVERGED = 10.0
#: a run that trained may not have passed this many times its first loss on the way
SPIKE = 10.0
#: a "trained" bare run that ends this many times above what the same fit reaches from a
#: standard initialisation only descended by noise at an absurd level (orders of magnitude)
ABSURD = 1e3
#: a fit that converged within its first tenth of updates "held" its level when it ended no more
#: than this many times above it (the noise of a loss at its floor; a rise past it is unclear)
FLAT = 1.1
#: a "trained" bare run whose loss went this many times above its first loss on the way made an
#: excursion (it left where it started): a tenfold lr cut says whether it cost the fit anything
EXCURSION = 2.0
#: a tenfold lr cut that ends this many times below the bare end trained where the bare run only
#: came back from its excursion: the bare run's label cannot be "healthy"
CUT_BETTER = 2.0
#: seconds one bare run may take
RUN_TIMEOUT = 90.0

#: the interventions that name one cause (the lr cuts and clipping are generic remedies)
SPECIFIC = {"adam_eps": "zero_division", "eps_log": "log_of_zero", "eps_div": "zero_division",
            "float32": "fp16_overflow", "sign_fixed": "update_sign_error",
            "without_nonfinite_rows": "nonfinite_input", "without_extreme_rows": "extreme_batch",
            "standardised": "step_size_too_large",
            "standard_init": "bad_initialization"}  # fmt: skip


def judge(losses: list[float] | None) -> dict[str, Any]:
    """``trained``, ``failed`` or ``unclear``, with the numbers it was decided on.

    failed: a non-finite loss; or a loss that ends (median of the last tenth of the updates, at
    least 3) ``DIVERGED`` times above the first loss or more; or one that reached ``DIVERGED``
    times the first loss and never came back below it. trained: every loss finite, no loss on the
    way ``SPIKE`` times the first one, and the end below both the start (median of the first
    tenth) and the first loss (a loss that jumped within its first tenth inflates that median: a
    fit that ends above its untrained loss learned nothing), or, for a fit that converged within
    its first tenth, the end at most half the first loss and no more than ``FLAT`` times the
    start (it held the level it fell to). Anything else neither failed nor trained: such a
    scenario cannot be labelled.
    """
    if not losses:
        return {"outcome": "unclear", "why": "no loss was recorded", "updates": 0}
    n = len(losses)
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    first = losses[0]
    out: dict[str, Any] = {"updates": n, "first": first}
    if bad is not None:
        out.update(outcome="failed", why=f"loss {losses[bad]} at update {bad + 1}",
                   first_nonfinite=bad + 1)  # fmt: skip
        return out
    k = max(3, n // 10)
    start, end, peak = statistics.median(losses[:k]), statistics.median(losses[-k:]), max(losses)
    out.update(start=start, end=end, peak=peak)
    if first <= 0:
        out.update(outcome="unclear", why=f"the first loss is {first:.3g}, not positive")
    elif end >= DIVERGED * first:
        out.update(outcome="failed", why=f"the loss ended {end / first:.3g}x its first value")
    elif peak >= DIVERGED * first and end > first:
        out.update(outcome="failed", why=f"the loss jumped {peak / first:.3g}x and ended "
                                         f"{end / first:.3g}x its first value")  # fmt: skip
    elif peak < SPIKE * first and (end < min(start, first)
                                   or (end <= first / 2 and end <= FLAT * start)):
        if end < start:
            out.update(outcome="trained", why=f"the loss went from {start:.4g} to {end:.4g}")
        else:
            out.update(outcome="trained", why=f"the loss fell from {first:.4g} to {start:.4g} "
                                              f"within its first tenth and held it ({end:.4g})")
        ups = _step_ups(losses, start, k)
        if ups:
            out["step_up"] = ups
            out["why"] += (f", after step-ups at updates {ups[:8]} (the first to "
                           f"{losses[ups[0] - 1]:.4g}) that it came back from")  # fmt: skip
    elif end < start:
        why = f"the loss came back down after a spike {peak / first:.3g}x its first value"
        out.update(outcome="unclear", why=why)
    else:
        out.update(outcome="unclear", why=f"the loss ended at {end / start:.3g}x its start")
    return out


def _step_ups(losses: list[float], start: float, k: int) -> list[int]:
    """The updates (1-based) whose loss went back above the start and ``SPIKE`` times its
    recent level (the median of the ``k`` losses before it): a batch with a typo, met once an
    epoch. A fit that trained after such step-ups is healthy, but a verdict of ``suspect`` at
    one of them is right too (the issue: a loss that stepped up and descended again is at most
    suspect, and is never stopped)."""
    ups = []
    for i in range(k, len(losses)):
        recent = statistics.median(losses[i - k : i])
        if losses[i] >= start and recent > 0 and losses[i] >= SPIKE * recent:
            ups.append(i + 1)
    return ups


def warm_up() -> None:
    """Run a short scenario of each family (and each precision) in this process, so that torch's
    lazy imports and first calls are paid once here and not in every forked run (2 s each)."""
    import io

    import torch

    torch.set_num_threads(1)
    specs = [replace(generate(seed, family), epochs=1) for seed, family in enumerate(FAMILIES)]
    specs += [replace(generate(0, "mlp"), epochs=1, optimizer=opt, precision=precision)
              for opt, precision in (("lbfgs", "fp32"), ("adam", "bf16_autocast"),
                                     ("sgd", "fp16_model"), ("sgd", "fp16_autocast"))]  # fmt: skip
    for spec in specs:
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.suppress(Exception):
                exec(compile(render(spec, _bare()), "warm_up.py", "exec"), namespace)


def run_script(text: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
    """Run ``text`` as ``__main__`` in a forked child; return its losses, stdout and error."""
    out_fd, out_path = tempfile.mkstemp(prefix="scenario-", suffix=".out")
    read_end, write_end = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        code = 0
        try:
            payload = _child(text, out_fd)
        except BaseException as exc:  # pragma: no cover - a fault of this harness
            payload = {"error": f"harness: {type(exc).__name__}: {exc}", "losses": None}
            code = 1
        data = json.dumps(payload).encode()
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(write_end, data) :]
        os._exit(code)
    os.close(write_end)
    os.close(out_fd)
    chunks: list[bytes] = []
    timed_out = False
    deadline = started + timeout
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([read_end], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(read_end)
    with open(out_path, encoding="utf-8", errors="replace") as fh:
        stdout = fh.read()
    os.unlink(out_path)
    seconds = round(time.perf_counter() - started, 3)
    if timed_out:
        return {"losses": None, "error": f"timeout after {timeout:g}s", "stdout": stdout,
                "seconds": seconds}  # fmt: skip
    try:
        result: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        result = {"losses": None, "error": "the child sent no result"}
    result["stdout"] = stdout
    result["seconds"] = seconds
    return result


def _child(text: str, out_fd: int) -> dict[str, Any]:
    """In the forked child: the script's stdout to ``out_fd``, stderr away, then run it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out_fd, 1)
    os.dup2(devnull, 2)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": "script.py",
                                 "__builtins__": builtins}  # fmt: skip
    sys.argv = ["script.py"]
    steps = [0]
    if torch is not None:  # counted in this forked child only: the hook dies with it
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            exec(compile(text, "script.py", "exec"), namespace)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
    sys.stdout.flush()
    losses = namespace.get("losses")
    values = None
    if isinstance(losses, list):
        values = [float(v) for v in losses]
    result: dict[str, Any] = {"losses": values, "error": error}
    if torch is not None and any(isinstance(v, torch.optim.Optimizer) for v in namespace.values()):
        result["optimizer_steps"] = steps[0]
    return result


def summarise_run(run: dict[str, Any]) -> dict[str, Any]:
    """What the label record keeps of one run: its verdict and numbers, not every loss."""
    verdict = judge(run.get("losses")) if not run.get("error") else {
        "outcome": "raised", "why": run["error"]}  # fmt: skip
    if run.get("error") and run.get("losses"):
        verdict["losses_before_error"] = len(run["losses"])
    if run.get("optimizer_steps") == 0 and verdict["outcome"] == "trained":
        # its weights never changed: a loss that wandered down by noise, not a fit that trained
        verdict.update(outcome="unclear", why="the optimizer never stepped: no weight changed")
    verdict["seconds"] = run.get("seconds")
    return verdict


def establish(
    spec: Spec, runner: Callable[[str], dict[str, Any]] = run_script
) -> dict[str, Any]:
    """Run the bare script and, when it failed, every intervention that applies; decide."""
    bare_run = runner(render(spec, _bare()))
    bare = summarise_run(bare_run)
    record: dict[str, Any] = {"bare": bare, "bare_stdout": bare_run.get("stdout", ""),
                              "counterfactuals": {}}  # fmt: skip
    changes = applicable(spec)
    if bare["outcome"] == "trained" and "standard_init" in changes:
        # a loss that "descends" from 3e25 to 2e25 did not train: what the same fit reaches from
        # the framework's own initialisation says whether the bare level was a fit at all
        run = summarise_run(runner(render(spec, _bare(changes["standard_init"]))))
        record["counterfactuals"]["standard_init"] = run
        reached = run.get("end", 0) if run["outcome"] in ("trained", "unclear") else 0
        if bare["end"] >= ABSURD * reached > 0:
            bare["outcome"] = "failed"
            bare["why"] = (f"the loss ended at {bare['end']:.3g}, {bare['end'] / run['end']:.3g}x "
                           f"above the {run['end']:.3g} the same fit reaches from a standard init")
    if bare["outcome"] == "trained" and bare["peak"] >= EXCURSION * bare["first"]:
        _excursion(spec, bare, record, runner)
    if bare["outcome"] == "failed":
        for name, change in changes.items():
            if name not in record["counterfactuals"]:
                record["counterfactuals"][name] = summarise_run(runner(render(spec, _bare(change))))
        _absurd_is_no_fix(record["counterfactuals"])
    record.update(decide(spec, bare, record["counterfactuals"]))
    return record


def _excursion(spec: Spec, bare: dict[str, Any], record: dict[str, Any],
               runner: Callable[[str], dict[str, Any]]) -> None:
    """A bare run that went ``EXCURSION`` times above its first loss and came back: it trained
    only if the excursion cost it nothing. When the same fit at a tenfold smaller lr ends
    ``CUT_BETTER`` times lower, the bare run left its range and returned to a level the right
    step beats by far (a step size too large that a schedule's decay rescued): neither healthy
    nor a failure that ``judge`` sees, so ``unclear``."""
    run = summarise_run(runner(render(spec, _bare(applicable(spec)["lr_x0.1"]))))
    record["counterfactuals"]["lr_x0.1"] = run
    if run["outcome"] == "trained" and run["end"] * CUT_BETTER <= bare["end"]:
        bare["outcome"] = "unclear"
        bare["why"] = (f"the loss went {bare['peak'] / bare['first']:.3g}x above its first value "
                       f"and came back to {bare['end']:.4g}; a tenfold smaller lr ended at "
                       f"{run['end']:.4g} ({bare['end'] / run['end']:.3g}x lower)")


def _absurd_is_no_fix(runs: dict[str, dict[str, Any]]) -> None:
    """A counterfactual that "trained" at ``ABSURD`` times what the standard init reaches only
    descended by noise at an absurd level (a smaller step from weights 100x too large): no fix."""
    init = runs.get("standard_init") or {}
    reached = init.get("end", 0) if init.get("outcome") in ("trained", "unclear") else 0
    if not reached > 0:
        return
    for name, run in runs.items():
        if name != "standard_init" and run.get("outcome") == "trained" \
                and run.get("end", 0) >= ABSURD * reached:  # fmt: skip
            run["outcome"] = "failed"
            run["why"] = (f"the loss ended at {run['end']:.3g}, {run['end'] / reached:.3g}x "
                          f"above the {reached:.3g} the same fit reaches from a standard init")


def _bare(change: Change | None = None) -> Change:
    return replace(change or Change(), monitor=False)


def decide(spec: Spec, bare: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The label and the rule that gave it, or ``dropped`` with the reason.

    * bare trained: ``healthy`` (unless it ended ``ABSURD`` times above what a standard init
      reaches: then it failed, :func:`establish`); bare raised or unclear: dropped.
    * bare failed: the interventions that name one cause and make the run train at the
      original step size decide: Adam's eps restored (``zero_division``), the stable form or an
      epsilon at the log of a probability (``log_of_zero``), an epsilon at the division by a
      norm or a spread (``zero_division``), float32 instead of half (``fp16_overflow``), the
      update's sign fixed (``update_sign_error``), the NaN/inf rows dropped
      (``nonfinite_input``), the finite extreme rows dropped (``extreme_batch``), the raw-unit
      columns standardised
      (``step_size_too_large``: their scale is what makes the step too long), a standard init
      (``bad_initialization``). Such a fix decides even when an lr cut also trains (a smaller
      step postpones or hides almost any failure). Two fixes that name different causes make
      the scenario ambiguous: dropped.
    * none of those: gradient clipping that trains at the original lr while a tenfold lr cut
      does not is ``exploding_gradients`` (the gradient is out of scale, not the step: only a
      cut of 100x or more, if any, matches what clipping does); else an lr cut (x0.1, x0.01,
      x0.001) that trains is ``step_size_too_large``; else nothing removed the failure: dropped.
    """
    if bare["outcome"] == "trained":
        if bare.get("step_up"):
            return {"label": "healthy", "step_up": bare["step_up"],
                    "rule": f"the bare run trained after step-ups at updates {bare['step_up']}"}
        return {"label": "healthy", "rule": "the bare run trained"}
    if bare["outcome"] == "raised":
        return {"label": None, "dropped": "bare run raised", "rule": bare["why"]}
    if bare["outcome"] == "unclear":
        return {"label": None, "dropped": "bare run neither trained nor failed",
                "rule": bare["why"]}  # fmt: skip
    fixed = [name for name, run in runs.items() if run.get("outcome") == "trained"]
    specific = {name: SPECIFIC[name] for name in fixed if name in SPECIFIC}
    if specific:
        causes = set(specific.values())
        if len(causes) > 1:
            what = ", ".join(f"{name} ({cause})" for name, cause in specific.items())
            return {"label": None, "dropped": "ambiguous: fixes name different causes",
                    "rule": f"each of {what} removes the failure"}  # fmt: skip
        rule = f"{' and '.join(specific)} removes the failure at the original step size"
        also = [name for name in fixed if name not in specific]
        if also:
            rule += f" (also trained: {', '.join(also)})"
        return {"label": causes.pop(), "rule": rule}
    cuts = [name for name in ("lr_x0.1", "lr_x0.01", "lr_x0.001") if name in fixed]
    if "clipped" in fixed and "lr_x0.1" not in fixed:
        rule = ("clipping the gradient norm removes the failure at the original lr; a tenfold "
                "cut does not")
        if cuts:
            rule += f" (trained: {', '.join(cuts)})"
        return {"label": "exploding_gradients", "rule": rule}
    if cuts:
        rule = f"{cuts[0]} trains and no intervention that names another cause does"
        if "clipped" in fixed:
            rule += " (clipping also trains)"
        return {"label": "step_size_too_large", "rule": rule}
    return {"label": None, "dropped": "no intervention removes the failure",
            "rule": "; ".join(f"{n}: {r.get('outcome')}" for n, r in runs.items())}  # fmt: skip


def right_answer(answer: str | None, diagnosis: dict[str, Any], exit_code: int,
           label: dict[str, Any], accum: int) -> bool:  # fmt: skip
    """The answer is the label; or, for a healthy fit that came back from step-ups of its loss,
    a ``suspect`` verdict at one of them that did not stop the run (a loss that stepped up and
    descended again is at most suspect, and never stopped)."""
    if answer == label.get("label"):
        return True
    ups, step = label.get("step_up"), diagnosis.get("step")
    if not ups or diagnosis.get("verdict") != "suspect" or exit_code != 0 or step is None:
        return False
    # the losses are per micro-batch, the steps per update
    return any(abs(int(step) - -(-up // accum)) <= 2 for up in ups)
