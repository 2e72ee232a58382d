"""The cause, decided by the decisive experiment: which intervention removed the failure.

The rules read the trace and give priors: a cause that fits the shape of the curve, with the
evidence for it. When the failing window could be replayed (:mod:`nanscope.probes.replay`), its
``confirmation`` entries say what each intervention did, and this module turns them into the
answer:

* an intervention that **removes** the failure names its cause: the suspect rows left out
  (``without_rows``: ``nonfinite_input`` when the rows held NaN/inf, else ``extreme_batch``),
  float32 instead of half precision (``fp16_overflow``), an epsilon at the producing op or in the
  optimizer (``log_of_zero`` for a log, else ``zero_division``), the applied update turned
  round (``update_sign_error``: it trains where the script's own update climbs), the unscaled
  columns
  standardised or a smaller learning rate (``step_size_too_large``), the gradient norm clipped
  (``exploding_gradients``), a standard initialisation (``bad_initialization``);
* where several remove it, a fix at the script's own learning rate that names one cause wins
  over a smaller step (a smaller step postpones almost any failure), in the seed's triage order:
  the data, the precision, the op, the column scale, the initialisation (only when the initial
  weights were measured far from the framework's default scale), then the gradient (clipping
  that cures it where a tenth of the learning rate does not, or after the gradient norm grew by
  orders of magnitude while the loss barely moved), then the step;
* a cause whose intervention ran and did **not** remove the failure is contradicted: it is not
  reported, whatever its rule said;
* when the control reproduced the failure and nothing removed it, the answer is ``unknown``, with
  what was tried.

A replay that could not run, or did not reproduce the failure, decides nothing: the rules' answer
stands, its confidence capped at ``UNCONFIRMED`` and the reason in the evidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CONFIRMED", "INIT_SCALE_FAR", "TESTS", "UNCONFIRMED", "Decision", "decide",
           "first_actions", "lr_that_worked"]

#: the confidence of a cause an intervention confirmed
CONFIRMED = 0.95
#: the most a rule's answer may claim when a replay was tried and could not decide
UNCONFIRMED = 0.7
#: initial weights whose std is this many times the framework default's are a bad
#: initialisation: beyond the spread of the standard initialisers themselves (He normal is
#: sqrt(6) = 2.45 times torch's default for a linear layer, an orthogonal or identity recurrence
#: sqrt(3) = 1.73 times an RNN's), so no standard scheme chose them
INIT_SCALE_FAR = 3.0

#: a replay whose loss climbed this many times above its first value leapt (an order of
#: magnitude, the labels' and the detectors' measure of a blow-up)
LEAP = 10.0

#: the interventions that cure almost any failure (a smaller or bounded step): a cure by them
#: alone says the step is out of scale, not why
GENERIC = frozenset({"lr_x0.1", "lr_x0.01", "lr_x0.001", "clipped"})
#: causes a bad row can carry: leaving the rows out removes each of them
_ROW_BORNE = ("nonfinite_input", "extreme_batch", "log_of_zero", "zero_division", "fp16_overflow")

#: the interventions that test each cause (an entry's ``change``)
TESTS: dict[str, tuple[str, ...]] = {
    "step_size_too_large": ("lr_x0.1", "lr_x0.01", "lr_x0.001", "standardised"),
    "nonfinite_input": ("without_rows", "without_nonfinite_rows"),
    "extreme_batch": ("without_rows",),
    "fp16_overflow": ("float32",),
    "log_of_zero": ("eps",),
    "zero_division": ("eps", "optimizer_eps"),
    "exploding_gradients": ("clipped",),
    "bad_initialization": ("standard_init",),
    "update_sign_error": ("sign_flipped",),
}


@dataclass
class Decision:
    """What the replays decided: ``cause`` (None: they decided nothing), how sure, which causes
    they contradicted, and the evidence in words."""

    cause: str | None = None
    confidence: float = 0.0
    contradicted: set[str] = field(default_factory=set)
    evidence: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    unknown: bool = False  # the control reproduced the failure and nothing removed it
    #: the first thing to do, when the intervention that decided says it best
    lead: str | None = None
    cap: float | None = None  # a replay was tried and could not decide: cap the rules' answer
    note: str | None = None
    lr_cut_fixed: bool = False  # a smaller learning rate alone removed the failure
    #: a cause a generic cure also supports, which the window cannot rule out (a smaller step
    #: cured it as well as the epsilon did): the decision is not confirmed over it
    rival: str | None = None


def decide(entries: Sequence[Mapping[str, Any]], priors: Sequence[tuple[str, float]] = (),
           *, rows_nonfinite: bool = False, gradient_grew: bool = False) -> Decision:  # fmt: skip
    """Decide from the window replays among ``entries`` (the ``confirmation`` list).

    priors: the rules' ``(cause, confidence)``, most confident first (they break ties between
    interventions that both cure the failure). rows_nonfinite: the suspect rows hold NaN/inf.
    gradient_grew: the gradient norm grew by orders of magnitude while the loss barely moved."""
    window = [e for e in entries if e.get("scope") == "window"]
    decision = Decision()
    if not window:
        return decision
    control = next((e for e in window if e.get("change") == "control"), None)
    if control is None:
        not_run = next((e for e in window if not e.get("ran")), None)
        decision.cap = UNCONFIRMED
        decision.note = str(not_run.get("text")) if not_run else "no replay could run"
        return decision
    if not control.get("reproduced"):
        decision.cap = UNCONFIRMED
        decision.note = str(control.get("text") or "the replay did not reproduce the failure")
        return decision
    ran = [e for e in window if e.get("ran") and e.get("change") != "control"]
    fixed = {str(e["change"]) for e in ran if e.get("fixed")}
    failed = {str(e["change"]) for e in ran if not e.get("fixed")}
    if _out_of_reach(decision, control, window, fixed, priors):
        return decision
    ran += _single_update_fixes(entries, ran, control, fixed, failed)
    decision.tried = [str(e["change"]) for e in ran]
    for tested, tests in TESTS.items():
        relevant = [t for t in tests if t in fixed or t in failed]
        if relevant and not any(t in fixed for t in relevant):
            decision.contradicted.add(tested)
    prior = dict(priors)
    lr_fixed = sorted((c for c in fixed if c.startswith("lr_x")), key=lambda c: -float(c[4:]))
    cause: str | None = None
    if "without_rows" in fixed:
        cause = _rows_cause(ran, fixed | failed, fixed, priors, rows_nonfinite)
    elif "float32" in fixed:
        cause = "fp16_overflow"
    elif "optimizer_eps" in fixed:
        cause = "zero_division"
    elif "standardised" in fixed and (lr_fixed or "eps" not in fixed):
        # the column in raw units made the values the op met over the steps (a sigmoid
        # saturated by a logit in dollars): the scale, not the op. Where no smaller step helps
        # and an epsilon does, no step made them: the op met its 0 from the first forward on
        cause = "step_size_too_large"
    elif "eps" in fixed and not (lr_fixed and _leapt_only_with(ran, "eps", lr_fixed)):
        # the epsilon at the op cures it at the script's own step: the op's, even where a smaller
        # step cures it too (a smaller step postpones or hides almost any failure); but where
        # the loss still leapt an order of magnitude with the epsilon and not at the smaller
        # step, the epsilon removed the NaN, not the failure: the op only met what the
        # oversized steps made
        op_cause = "log_of_zero" if prior.get("log_of_zero", 0.0) >= prior.get(
            "zero_division", 0.0) else "zero_division"
        cause = _eps_cause(entries) or op_cause
    elif "sign_flipped" in fixed and not lr_fixed:
        # turned round, the update trains at the script's own lr: it pointed uphill
        cause = "update_sign_error"
    elif "standard_init" in fixed and _init_far(entries):
        # a standard initialisation cures it at the script's own lr, and the initial weights
        # were measured far from the framework's default scale: the init, not the step
        cause = "bad_initialization"
    elif "clipped" in fixed and ("lr_x0.1" not in fixed or gradient_grew):
        # bounding the gradient cures it at the script's own lr where a tenfold smaller step
        # does not: the gradient, not the step, is out of scale
        cause = "exploding_gradients"
    elif "sign_flipped" in fixed:
        cause = "update_sign_error"
    elif lr_fixed:
        cause = "step_size_too_large"
    elif "clipped" in fixed:
        cause = "exploding_gradients"
    elif "eps" in fixed:
        cause = _eps_cause(entries) or "zero_division"
    if cause is not None:
        decision.cause = cause
        decision.confidence = CONFIRMED
        decision.contradicted.discard(cause)
        for e in ran:
            if e.get("fixed") or str(e.get("change")) in TESTS.get(cause, ()):
                decision.evidence.append(str(e.get("text")))
        decision.lr_cut_fixed = bool(lr_fixed)
        if cause in ("log_of_zero", "zero_division") and "eps" in fixed and lr_fixed:
            # both cure the window; over the whole run one of them may only postpone the NaN
            # (measured on 2000:3000: 7 such fits were the op's, 6 the step's)
            decision.rival = "step_size_too_large"
            decision.confidence = UNCONFIRMED
        if lr_fixed and cause == "step_size_too_large":
            decision.note = f"the largest learning rate factor that removed it: {lr_fixed[0][4:]}"
        if cause == "step_size_too_large" and "standardised" in fixed:
            columns = next((e.get("columns") for e in ran if e.get("change") == "standardised"),
                           None)  # fmt: skip
            named = ", ".join(str(c) for c in columns) if columns else "in raw units"
            decision.lead = (f"Standardise input column(s) {named} (subtract the mean, divide by "
                             "the std): rerun from update 1 with them standardised, the fit no "
                             "longer diverges at its own learning rate.")  # fmt: skip
        return decision
    decision.unknown = not fixed
    decision.evidence = [str(e.get("text")) for e in ran]
    return decision


def _out_of_reach(decision: Decision, control: Mapping[str, Any],
                  window: Sequence[Mapping[str, Any]], fixed: set[str],
                  priors: Sequence[tuple[str, float]]) -> bool:  # fmt: skip
    """Where the cause lies in data the replay could not change, fill ``decision`` and say so.

    * NaN/inf came in with data the step reads (the control saw it, ``data_nonfinite``), and
      nothing removed the failure: the data's, ``nonfinite_input``, unless the rules saw how the
      data got it (a log of zero counts in the preparation): that stands, capped.
    * the rules see suspect rows and the replay could not leave them out, and only a smaller or
      clipped step removed the failure: those only bound what the rows do; the rules' answer
      stands, capped."""
    prior = dict(priors)
    if control.get("data_nonfinite") and not fixed:
        decision.note = str(control.get("text"))
        made = [c for c, p in priors if c in _ROW_BORNE and c not in ("nonfinite_input",
                                                                     "extreme_batch") and p >= 0.5]
        if made:
            decision.cap = UNCONFIRMED
            return True
        decision.cause, decision.confidence = "nonfinite_input", UNCONFIRMED
        decision.evidence, decision.note = [decision.note], None
        return True
    unrun = next((e for e in window if e.get("change") == "without_rows" and not e.get("ran")),
                 None)  # fmt: skip
    if unrun is not None and fixed and fixed <= GENERIC and max(
            prior.get("extreme_batch", 0.0), prior.get("nonfinite_input", 0.0)) >= 0.5:
        decision.cap = UNCONFIRMED
        decision.note = str(unrun.get("text"))
        return True
    return False


def _rows_cause(ran: Sequence[Mapping[str, Any]], tried: set[str], fixed: set[str],
                priors: Sequence[tuple[str, float]], rows_nonfinite: bool) -> str:  # fmt: skip
    """The cause when leaving the suspect rows out cured the failure."""
    if "without_nonfinite_rows" in tried:
        # NaN/inf rows and finite outliers both in the window: the NaN/inf rows left out alone
        # decide which of them the cure was
        return "nonfinite_input" if "without_nonfinite_rows" in fixed else "extreme_batch"
    # the rows broke it; how they did is the rules' word when they saw the op that made their
    # NaN (a log of a zero count in the loop, an overflow in half precision)
    borne = [(c, p) for c, p in priors if c in _ROW_BORNE and p >= 0.5]
    if _only_nonfinite_rows(ran):
        # the rows left out held NaN/inf and no finite outlier: no extreme row was the cure
        borne = [(c, p) for c, p in borne if c != "extreme_batch"]
    if borne:
        return borne[0][0]
    return "nonfinite_input" if rows_nonfinite else "extreme_batch"


def _only_nonfinite_rows(ran: Sequence[Mapping[str, Any]]) -> bool:
    """The window rerun without the suspect rows left out rows holding NaN/inf, and none that
    held a finite outlier (``rows_extreme`` false: the replay read every kept batch in full)."""
    return any(e.get("change") == "without_rows" and e.get("scope") == "window"
               and e.get("rows_nonfinite") and e.get("rows_extreme") is False
               for e in ran)  # fmt: skip


def _leapt_only_with(ran: Sequence[Mapping[str, Any]], change: str,
                     lr_fixed: Sequence[str]) -> bool:  # fmt: skip
    """The replay with ``change`` kept the loss finite but still leapt ``LEAP`` times above its
    first value, while a smaller step that removed the failure did not: ``change`` removed the
    non-finite value, not the failure."""
    by_change = {str(e.get("change")): e for e in ran}
    return _leapt(by_change.get(change)) and any(
        not _leapt(by_change.get(c)) for c in lr_fixed if c in by_change)


def _leapt(entry: Mapping[str, Any] | None) -> bool:
    losses = [v for v in (entry or {}).get("losses") or [] if isinstance(v, (int, float))]
    if len(losses) < 2 or not losses[0] > 0:
        return False
    return max(losses) >= LEAP * losses[0]


def _single_update_fixes(entries: Sequence[Mapping[str, Any]], ran: list[Mapping[str, Any]],
                         control: Mapping[str, Any], fixed: set[str],
                         failed: set[str]) -> list[Mapping[str, Any]]:  # fmt: skip
    """The failing update alone rerun in float32, or without its suspect rows, and finite: the
    same evidence for the precision and the rows as a window rerun (the window cannot rerun a
    loop's own preprocessing, whose output it feeds the model as it was). A window rerun of the
    same change, over several updates, has the last word, unless it passed the update where the
    control failed and failed later: that update's failure is removed, and what follows is
    another, like an unscaled loss scale's oversized steps. ``fixed`` and ``failed`` are
    updated; the entries that count are returned."""
    outlasted = {str(e["change"]) for e in ran if not e.get("fixed")
                 and int(e.get("updates") or 0) > int(control.get("updates") or 0)}  # fmt: skip
    counted = []
    for e in entries:
        change = str(e.get("change"))
        single = e.get("scope") != "window" and change in ("float32", "without_rows")
        if e.get("rows_from") == "producer" and e.get("producer_phase") == "backward":
            # the rows where a backward op passed the range: where a growing gradient overflowed
            # first, not rows whose data is suspect (every row's gradient was on its way)
            continue
        if single and e.get("finite") is True and (change not in failed or change in outlasted):
            fixed.add(change)
            failed.discard(change)
            counted.append(e)
    return counted


def _init_far(entries: Sequence[Mapping[str, Any]]) -> bool:
    """The standard-init replay measured initial weights ``INIT_SCALE_FAR`` times or more the
    framework default's scale for their module (too small an init vanishes; it does not blow up
    a loss, which is what a failure here is)."""
    for e in entries:
        if e.get("change") == "standard_init" and e.get("scope") == "window":
            ratio = (e.get("initial_scale") or {}).get("ratio")
            if isinstance(ratio, (int, float)) and ratio > 0:
                return ratio >= INIT_SCALE_FAR
    return False


def _eps_cause(entries: Sequence[Mapping[str, Any]]) -> str | None:
    """``log_of_zero`` when the epsilon went to a log, ``zero_division`` for a division-like op."""
    for e in entries:
        if e.get("change") == "eps" and e.get("scope") == "window":
            op = str(e.get("op") or "").split(".")[0]
            return "log_of_zero" if op in ("log", "log2", "log10", "log1p", "xlogy") else (
                "zero_division")
    return None


#: what to do first, by cause, when the replay decided a cause no rule had proposed
_ACTIONS = {
    "step_size_too_large": "Cut the learning rate tenfold and rerun (the replay showed a smaller "
                           "step removes the failure).",
    "nonfinite_input": "Drop or impute the rows that hold NaN/inf, and check the data pipeline "
                       "that made them (`nanscope scan DATA`).",
    "extreme_batch": "Inspect or drop the extreme rows the replay left out, and clip the gradient "
                     "norm so one row cannot dominate an update.",
    "log_of_zero": "Compute the loss from logits in its stable form (log_softmax, "
                   "BCEWithLogitsLoss) or clamp the probabilities into [eps, 1 - eps].",
    "zero_division": "Add an epsilon to the denominator (or the optimizer's eps), or mask the "
                     "entries that are exactly zero.",
    "fp16_overflow": "Run that op in float32 or bf16, and use a dynamic loss scaler.",
    "exploding_gradients": "Clip the gradient norm (torch.nn.utils.clip_grad_norm_(params, 1.0)); "
                           "check recurrent weights and activations.",
    "bad_initialization": "Use the framework's default (or a standard) initialiser for the "
                          "layers the script initialises itself.",
}  # fmt: skip


def first_actions(cause: str, ctx: Any = None, *, lr_cut_fixed: bool = True) -> list[str]:
    """What to do, for a cause the replay decided without a rule's finding of its own
    (``lr_cut_fixed``: whether a smaller learning rate alone removed the failure)."""
    if cause == "step_size_too_large" and not lr_cut_fixed:
        return ["If it still diverges, cut the learning rate tenfold (the replay's learning rate "
                "cuts alone did not remove the failure)."]
    action = _ACTIONS.get(cause)
    return [action] if action else []


def lr_that_worked(entries: Sequence[Mapping[str, Any]], lr: float | None) -> float | None:
    """The largest learning rate a window replay showed to remove the failure, or None."""
    if lr is None or not math.isfinite(lr):
        return None
    best = None
    for e in entries:
        change = str(e.get("change") or "")
        if e.get("scope") == "window" and e.get("fixed") and change.startswith("lr_x"):
            factor = float(change[4:])
            best = factor if best is None else max(best, factor)
    return lr * best if best is not None else None
