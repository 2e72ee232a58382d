"""The triage engine: run every rule on a trace, rank the findings into one diagnosis.

The engine takes a :class:`~nanscope.trace.Trace` (or a list of records) and knows no file or log
format: paths are read by :mod:`nanscope.loading`. Besides the rules' verdicts it gives two that
are never ``healthy``:

* ``unobserved``: the trace holds no update, so nothing was watched (the evidence says why), or
  its updates carry no loss and nothing non-finite (a log of accuracies only): nothing says how
  the fit went;
* ``interrupted``: the run was stopped from outside (an ``interrupted`` event, see
  :func:`interruption`) and no failure was found in the updates seen;
* ``crashed``: the script ended with its own exception (a ``crashed`` event, see :func:`crash`)
  and no failure was found before it; a failure found before it stands, the crash noted.

A trace read from a file that was cut short (``trace.meta["truncated"]``) says so in the
evidence, and a healthy verdict from it gets a lower confidence.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from nanscope.detectors import stuck_at_zero
from nanscope.diagnose.context import Context
from nanscope.diagnose.decide import UNCONFIRMED, Decision, decide, first_actions
from nanscope.diagnose.diagnosis import Diagnosis, Evidence, Finding
from nanscope.diagnose.rules import load_rules
from nanscope.diagnose.rules._logs import from_log, record_more
from nanscope.diagnose.verdict import Verdict
from nanscope.formatting import number as num
from nanscope.outcome import FAR, Outcome, OutcomeKind
from nanscope.trace import Trace

__all__ = [
    "crash",
    "crash_note",
    "diagnose",
    "interruption",
    "note_crash",
    "note_interruption",
    "run_rules",
    "saw_no_update",
    "unwatched",
]

#: a finding must be at least this sure to call a finite run "suspect"
SUSPECT = 0.6
#: below this, a broken run is "unknown" rather than a guess
CONFIDENT = 0.3
#: the most a healthy verdict can claim from a file that was cut short
TRUNCATED_CONFIDENCE = 0.5
#: fewer updates than this cannot show the detectors' fingerprint (four rises in a row, each
#: larger than the last): a healthy verdict from them claims at most FEW_CONFIDENCE
FEW_RECORDS = 8
FEW_CONFIDENCE = 0.5


def interruption(trace: Trace) -> dict[str, Any] | None:
    """The last ``interrupted`` event of a trace (``{"event", "signal", "step", ...}``), or None.

    Events are what :meth:`~nanscope.trace.TraceWriter.event` wrote and
    :func:`~nanscope.trace.read_trace` collected into ``trace.meta["events"]``.
    """
    return _last_event(trace, "interrupted")


def crash(trace: Trace) -> dict[str, Any] | None:
    """The ``crashed`` event of a trace: the script's own exception (``type``, ``message``,
    ``file``, ``line``) and the last update before it (``step``), or None."""
    return _last_event(trace, "crashed")


def _last_event(trace: Trace, name: str) -> dict[str, Any] | None:
    events = trace.meta.get("events") or []
    found = None
    if isinstance(events, list):
        for event in events:
            if isinstance(event, Mapping) and event.get("event") == name:
                found = dict(event)
    return found


def run_rules(ctx: Context) -> list[Finding]:
    """Every rule's finding, most confident first; a failing rule is skipped with a warning."""
    findings: list[Finding] = []
    for rule in load_rules():
        try:
            finding = rule.check(ctx)
        except Exception as exc:  # a rule bug must not hide the other rules' answers
            warnings.warn(
                f"nanscope: rule {getattr(rule, 'CODE', rule.__name__)} failed "
                f"({type(exc).__name__}: {exc}); please report this",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        if finding is not None:
            findings.append(finding)
    findings.sort(key=lambda f: -f.confidence)
    return findings


def diagnose(trace: Trace | Any, evidence: Mapping[str, Any] | None = None) -> Diagnosis:
    """Diagnose a trace (a :class:`~nanscope.trace.Trace` or a list of records).

    A path is not read here: use :func:`nanscope.diagnose` or :func:`nanscope.loading.load`.
    """
    if not isinstance(trace, Trace):
        if isinstance(trace, (str, bytes)) or hasattr(trace, "__fspath__"):
            raise TypeError(
                "nanscope.diagnose.engine.diagnose takes a Trace or a list of records; to read "
                f"the file {trace!r} use nanscope.diagnose(path) or nanscope.loading.load(path)"
            )
        trace = Trace(list(trace))
    run = dict((evidence or {}).get("run") or {})
    stopped = interruption(trace)
    crashed = crash(trace)
    if len(trace) == 0:
        if crashed is not None:
            return _crashed(trace, None, [], crashed, run)
        return _unobserved(trace, evidence, stopped, run)
    ctx = Context(trace, evidence)
    if ctx.fail is None and not trace.has("loss"):
        if crashed is not None:
            return _crashed(trace, ctx, [], crashed, run)
        return _no_loss(ctx, stopped, run)
    findings = run_rules(ctx)
    outcome = ctx.outcome
    if ctx.fail is not None:
        verdict = Verdict.NONFINITE
    elif ctx.stop is not None:
        verdict = Verdict.DIVERGING
    elif outcome.kind == OutcomeKind.BLOWN:
        verdict = Verdict.DIVERGING  # it was not stopped, but it ended far above where it began
    elif crashed is not None:
        return _crashed(trace, ctx, findings, crashed, run)
    elif findings and findings[0].confidence >= SUSPECT:
        verdict = Verdict.SUSPECT
    elif stopped is not None:
        return _interrupted(ctx, findings, stopped, run)
    elif outcome.kind == OutcomeKind.RETURNED:
        verdict = Verdict.SUSPECT  # it survived an explosion, or stepped up by design: not healthy
    else:
        verdict = Verdict.HEALTHY
    if verdict == Verdict.HEALTHY and _zeros(ctx) is not None:
        verdict = Verdict.SUSPECT  # a loss stuck at exactly 0.0 is not a converged one
    held = _last_event(trace, "held")
    if verdict == Verdict.HEALTHY and held is not None:
        verdict = Verdict.SUSPECT  # the loss stepped up with its data: not stopped, not healthy
    summary = _summary(ctx)
    notes = _notes(ctx, stopped)
    if verdict == Verdict.SUSPECT and outcome.kind == OutcomeKind.RETURNED:
        notes.insert(0, _outcome_evidence(outcome))
    if held is not None and verdict == Verdict.SUSPECT:
        notes.insert(0, Evidence("replay", str(held.get("text")), {"step": held.get("step")}))
    if crashed is not None:  # a failure found before the script's own exception: it stands
        notes.append(crash_note(crashed))
    if verdict == Verdict.HEALTHY:
        return _healthy(ctx, findings, notes, summary, run)
    if outcome.kind == OutcomeKind.BLOWN and ctx.fail is None and ctx.stop is None:
        notes.insert(0, _outcome_evidence(outcome))
    findings, decided = _decided(ctx, findings)
    if decided.unknown and not (findings and findings[0].confidence >= CONFIDENT):
        notes.extend(Evidence("replay", text, {}) for text in decided.evidence)
        return _unknown(ctx, verdict, findings, summary, run, notes, decided.tried)
    top = findings[0] if findings and findings[0].confidence >= CONFIDENT else None
    if top is None:
        return _unknown(ctx, verdict, findings, summary, run, notes)
    return _named(ctx, verdict, top, findings, notes, summary, run)


def _healthy(ctx: Context, findings: list[Finding], notes: list[Evidence],
             summary: dict[str, Any], run: dict[str, Any]) -> Diagnosis:  # fmt: skip
    """A healthy run's diagnosis: it claims less where the trace was cut or short."""
    confidence = 1.0 - (findings[0].confidence if findings else 0.0) / 2
    if ctx.trace.meta.get("truncated"):
        confidence = min(confidence, TRUNCATED_CONFIDENCE)
    if ctx.n < FEW_RECORDS:
        confidence = min(confidence, FEW_CONFIDENCE)
    return Diagnosis(
        verdict=Verdict.HEALTHY,
        cause="healthy",
        confidence=round(confidence, 3),
        step=ctx.step_at(ctx.n - 1),
        evidence=[Evidence("engine", _healthy_text(ctx), summary), *notes, *_few(ctx)],
        actions=[],
        alternatives=[
            {"cause": f.cause, "confidence": round(f.confidence, 3)} for f in findings[:3]
        ],
        run=run,
        granularity=ctx.granularity,
        summary=summary,
    )


def _named(ctx: Context, verdict: Verdict, top: Finding, findings: list[Finding],
           notes: list[Evidence], summary: dict[str, Any],
           run: dict[str, Any]) -> Diagnosis:  # fmt: skip
    """The diagnosis that names ``top``'s cause, the other findings as alternatives."""
    alternatives: dict[str, float] = {}
    for f in findings[1:]:
        if f.cause != top.cause:
            alternatives[f.cause] = max(alternatives.get(f.cause, 0.0), f.confidence)
    for cause, conf in top.alternatives:
        if cause != top.cause:
            alternatives[cause] = max(alternatives.get(cause, 0.0), conf)
    contributing = [e.to_dict() for e in top.contributing]
    for f in findings[1:]:
        if f.cause != top.cause and f.confidence >= 0.5 and f.evidence:
            contributing.append({**f.evidence[0].to_dict(), "cause": f.cause})
    actions = list(top.actions)
    if ctx.granularity == "epoch" and not any("per update" in a for a in actions):
        actions.append(
            "Log the loss per update, not per epoch: it shows whether the loss grew before it "
            "broke, which settles the cause."
        )
    # an op that produced a non-finite value is evidence only when something went non-finite
    located = top.located or (ctx.located if ctx.fail is not None else None)
    return Diagnosis(
        verdict=verdict,
        cause=top.cause,
        confidence=round(top.confidence, 3),
        step=top.step if top.step is not None else ctx.step_at(ctx.break_index),
        first_nonfinite=ctx.first_nonfinite,
        evidence=[*top.evidence, *notes],
        actions=actions,
        alternatives=[
            {"cause": c, "confidence": round(v, 3)}
            for c, v in sorted(alternatives.items(), key=lambda kv: -kv[1])
        ],
        contributing=contributing,
        located=located,
        rows=[_public_row(r) for r in top.rows[:10]],
        run=run,
        granularity=ctx.granularity,
        rule=top.rule,
        summary=summary,
        confirmation=_confirmation(ctx),
        extra=_extra(ctx),
    )


def _decided(ctx: Context, findings: list[Finding]) -> tuple[list[Finding], Decision]:
    """The findings as the window replays left them (:mod:`nanscope.diagnose.decide`): the cause
    an intervention confirmed on top, the causes a replay contradicted gone, the rest capped
    when a replay was tried and could not decide."""
    rows = [r for r in ctx.rows if r.get("why") in ("nonfinite", "nan", "inf")]
    confirmation = _confirmation(ctx)
    replayed = any(e.get("rows_nonfinite") for e in confirmation)  # (a batch the probes missed)
    decision = decide(
        confirmation,
        [(f.cause, f.confidence) for f in findings],
        rows_nonfinite=bool(rows) or replayed,
        gradient_grew=_gradient_grew(ctx),
    )
    if decision.cap is not None:
        note = Evidence("replay", f"not confirmed by a replay: {decision.note}", {})
        return [replace(f, confidence=min(f.confidence, decision.cap),
                        evidence=[*f.evidence, note]) for f in findings], decision  # fmt: skip
    kept = [f for f in findings if f.cause not in decision.contradicted]
    if decision.cause is None:
        if decision.tried:
            # the control reproduced the failure; what no intervention removed stays a guess
            note = Evidence("replay", "no replayed intervention removed the failure (tried: "
                            + ", ".join(decision.tried) + ")", {})  # fmt: skip
            kept = [replace(f, confidence=min(f.confidence, UNCONFIRMED),
                            evidence=[*f.evidence, note]) for f in kept]  # fmt: skip
        return kept, decision
    evidence = [Evidence("replay", text, {"decided": decision.cause})
                for text in decision.evidence]  # fmt: skip
    if decision.note:
        evidence.append(Evidence("replay", decision.note, {}))
    match = next((f for f in kept if f.cause == decision.cause), None)
    if match is not None:
        top = replace(match, confidence=max(match.confidence, decision.confidence),
                      evidence=[*evidence, *match.evidence])  # fmt: skip
        rest = [f for f in kept if f is not match]
    else:
        top = Finding(rule="replay", cause=decision.cause, confidence=decision.confidence,
                      evidence=evidence, actions=first_actions(decision.cause, ctx,
                                            lr_cut_fixed=decision.lr_cut_fixed),
                      step=ctx.step_at(ctx.break_index))  # fmt: skip
        rest = kept
    if decision.rival:
        rival = (decision.rival, decision.confidence - 0.15)
        note = Evidence("replay", f"not confirmed over {decision.rival}: a smaller step removed "
                        "the failure in the replayed window too, and which of the two the whole "
                        "run needs the window cannot show", {})  # fmt: skip
        top = replace(top, confidence=min(top.confidence, decision.confidence),
                      alternatives=[*top.alternatives, rival], evidence=[*top.evidence, note])
    if decision.lead and not any(a.startswith("Standardise") for a in top.actions[:1]):
        top = replace(top, actions=[decision.lead, *[a for a in top.actions
                                                     if not a.startswith("Standardise")]])
    return [top, *rest], decision


def _gradient_grew(ctx: Context) -> bool:
    """The gradient norm grew by two orders of magnitude or more while the loss stayed within
    ``FAR`` of where it was: the gradient exploded before the loss followed."""
    grad = ctx.trace.column("grad_norm")[: ctx.end + 1]
    loss = ctx.loss[: ctx.end + 1]
    ok = np.isfinite(grad) & (grad > 0) & np.isfinite(loss)
    if int(ok.sum()) < 4:
        return False
    g, l_ = grad[ok], loss[ok]
    half = max(1, g.size // 2)
    base_g, base_l = float(np.median(g[:half])), float(np.median(l_[:half]))
    peak = int(np.argmax(g))
    return g[peak] >= 100 * base_g and (base_l <= 0 or l_[peak] <= FAR * base_l)


def _outcome_evidence(outcome: Outcome) -> Evidence:
    """The engine's word on how the loss ended, when that is what makes the run not healthy."""
    data = {"outcome": outcome.kind, "start": outcome.start, "end": outcome.end,
            "peak": outcome.peak, "end_ratio": outcome.end_ratio,
            "peak_ratio": outcome.peak_ratio}  # fmt: skip
    return Evidence("engine", outcome.text(), data)


def _unknown(
    ctx: Context,
    verdict: str,
    findings: list[Finding],
    summary: dict[str, Any],
    run: dict[str, Any],
    notes: list[Evidence],
    tried: list[str] | None = None,
) -> Diagnosis:
    seen = []
    if tried:
        seen.append("the failing window was replayed from a snapshot and reproduced the failure, "
                    "but none of the interventions removed it (" + ", ".join(tried) + ")")
    if ctx.first_nonfinite:
        fn = ctx.first_nonfinite
        seen.append(f"the first non-finite {fn['what']} appeared at update {fn['step']}")
    if ctx.alarm:
        seen.append(str(ctx.alarm.get("text")))
    zeros = _zeros(ctx)
    if zeros is not None:
        first, count = zeros
        seen.append(
            f"the loss fell to exactly 0.0 at update {ctx.step_at(first)} and stayed there for "
            f"the last {count} updates, after finite non-zero losses: a real loss almost never "
            "reaches exact zero; a logger that writes 0 for NaN, batches whose labels are all "
            "masked out, or a loss saturated in float precision does, and nothing is learned"
        )
    for m in ctx.messages_of("oom", "nccl", "traceback"):
        seen.append(f"log line {m.get('line')}: {m.get('text')}")
    text = "; ".join(seen) or "something went wrong but no rule recognised it"
    missing = []
    for key, what in (("grad_norm", "gradients (grads=)"), ("weight_norm", "weights (params=)"),
                      ("input_absmax", "the input batch (inputs=, targets=)")):  # fmt: skip
        if not ctx.trace.has(key):
            missing.append(what)
    actions = []
    if missing:
        actions.append(record_more(ctx, [k for k in ("grad_norm", "weight_norm", "input_absmax")
                                         if not ctx.trace.has(k)],
                                   "Record more per update so the rules can decide: "
                                   + ", ".join(missing) + "."))  # fmt: skip
    if zeros is not None:
        actions.insert(
            0,
            f"Look at update {ctx.step_at(zeros[0])}: print the loss before any logging filter, "
            "the gradient norm (0 or NaN means nothing is learned) and the batch's labels.",
        )
    if not from_log(ctx):
        actions.append(
            "Run the script under `nanscope run` (PyTorch) so the failing update is replayed and "
            "the op, module and source line are named."
        )
    if ctx.granularity == "epoch":
        actions.append("Log the loss per update, not per epoch.")
    return Diagnosis(
        verdict=verdict,
        cause="unknown",
        confidence=0.0,
        step=ctx.step_at(ctx.break_index),
        first_nonfinite=ctx.first_nonfinite,
        evidence=[Evidence("engine", text, {}), *notes],
        actions=actions,
        alternatives=[{"cause": f.cause, "confidence": round(f.confidence, 3)} for f in findings],
        located=ctx.located,
        run=run,
        granularity=ctx.granularity,
        summary=summary,
        confirmation=_confirmation(ctx),
        extra=_extra(ctx),
    )


def _confirmation(ctx: Context) -> list[dict[str, Any]]:
    found = ctx.evidence.get("confirmation")
    return [dict(c) for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def _notes(ctx: Context, stopped: Mapping[str, Any] | None) -> list[Evidence]:
    """Evidence about the trace itself: cut short, stopped from outside."""
    notes = []
    meta = ctx.trace.meta
    if meta.get("truncated"):
        unit = "epochs" if ctx.granularity == "epoch" else "updates"
        notes.append(
            Evidence(
                "engine",
                f"the file was cut short (its last line is unfinished): only the first {ctx.n} "
                f"{unit} were read, and the run was probably killed while writing",
                {"truncated": True, "updates": ctx.n},
            )
        )
    if stopped is not None:
        notes.append(Evidence("engine", _stopped_text(stopped), _event_data(stopped)))
    unit = "epochs" if ctx.granularity == "epoch" else "updates"
    skipped = int(ctx.skipped.sum())
    if skipped:
        unit = unit[:-1] if skipped == 1 else unit
        notes.append(
            Evidence(
                "engine",
                f"{skipped} {unit} had a non-finite loss or gradient and were skipped: the values "
                "after them are finite, so those updates never reached the weights (a loss "
                "scaler skips such steps); they are not where a fit broke",
                {"skipped": skipped},
            )
        )
    return notes


def _few(ctx: Context) -> list[Evidence]:
    """A healthy verdict from fewer than FEW_RECORDS updates says how little it rests on."""
    if ctx.n >= FEW_RECORDS:
        return []
    unit = ("epoch" if ctx.granularity == "epoch" else "update") + ("s" if ctx.n != 1 else "")
    return [
        Evidence(
            "engine",
            f"only {ctx.n} {unit} recorded: too few to tell a descent from noise or from the "
            "start of a divergence",
            {"records": ctx.n, "few": FEW_RECORDS},
        )
    ]


def _stopped_text(event: Mapping[str, Any]) -> str:
    how = event.get("signal") or "from outside"
    text = f"the run was interrupted ({how})"
    if event.get("step") is not None:
        text += f" after update {event['step']}"
    return text


def _event_data(event: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "event"}


def _unobserved(
    trace: Trace,
    evidence: Mapping[str, Any] | None,
    stopped: Mapping[str, Any] | None,
    run: dict[str, Any],
) -> Diagnosis:
    """No update was recorded: nothing was watched, so nothing can be said about the fit."""
    reason = (evidence or {}).get("unobserved") or trace.meta.get("unobserved")
    faults = trace.meta.get("hook_faults")  # the torch adapter's hooks that failed, and why
    if not reason and isinstance(faults, dict) and faults:
        reason = "nanscope's " + "; ".join(f"{name} hook failed ({error})"
                                           for name, error in faults.items())  # fmt: skip
        reason += " and was switched off: no update could be recorded"
    if not reason:
        if stopped is not None:
            reason = _stopped_text(stopped) + " before nanscope saw its first update"
        else:
            reason = (
                "the trace holds no update: no loss was recorded (nothing called "
                "Monitor.update, or no optimizer stepped under watch)"
            )
    data: dict[str, Any] = {"updates": 0}
    if stopped is not None:
        data.update(_event_data(stopped))
    actions = [
        "Check that the training loop ran: nanscope records an update each time "
        "Monitor.update is called or a watched optimizer steps.",
        "Under `nanscope run`, every torch optimizer the script creates is watched; a loop "
        "without one (numpy, JAX) needs a Monitor.update call per update.",
    ]
    return Diagnosis(
        verdict=Verdict.UNOBSERVED,
        cause="unknown",
        confidence=0.0,
        step=None,
        evidence=[Evidence("engine", str(reason), data)],
        actions=actions,
        run=run,
        granularity=trace.granularity,
        summary={"updates": 0, "nonfinite_updates": 0},
    )


def _no_loss(ctx: Context, stopped: Mapping[str, Any] | None, run: dict[str, Any]) -> Diagnosis:
    """Updates were recorded but none carries a loss, and nothing in them is non-finite: the fit
    may have gone anywhere, so the verdict is ``unobserved``, never ``healthy``."""
    unit = "epochs" if ctx.granularity == "epoch" else "updates"
    keys: list[str] = []
    for record in ctx.records:
        for key in (*record, *(record.get("extra") or {})):
            if key not in ("step", "epoch", "extra", "time", "events") and key not in keys:
                keys.append(key)
    shown = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
    text = (
        f"{ctx.n} {unit} were recorded but none carries a training loss"
        + (f" (what they carry: {shown})" if keys else "")
        + ", and nothing in them is non-finite: nothing says whether the fit learned or diverged"
    )
    scale = ctx.trace.meta.get("loss_scale")
    skips = sum("skipped_step" in (r.get("events") or ()) for r in ctx.records)
    if skips and isinstance(scale, Mapping):
        # a log of loss-scaler messages only (the reader made a record of each skipped step)
        went = (f", the scale {num(scale['first'])} -> {num(scale['last'])}"
                if "first" in scale else "")  # fmt: skip
        text = (
            f"the log holds loss-scaler messages and no loss: {skips} steps "
            f"skipped for inf/NaN in the scaled float16 gradients{went}, never to its floor: "
            "a scaler skips steps while it finds its scale, which is routine; nothing says how "
            "the fit went"
        )
        keys = [key for key in keys if key not in ("skipped_step", "line", "loss_scale")]
    data: dict[str, Any] = {"updates": ctx.n, "keys": keys, "loss_recorded": False}
    evidence = [Evidence("engine", text, data)]
    if stopped is not None:
        evidence.append(Evidence("engine", _stopped_text(stopped), _event_data(stopped)))
    actions = [
        "Log the training loss (per update, not only per epoch) next to the other metrics, or "
        "name its column: a metric that only rises or falls slowly cannot show a divergence.",
    ]
    if any("loss" in key.lower() and "scale" not in key.lower() for key in keys):
        actions.append(
            "A validation loss alone says little about the updates: it is measured once per "
            "evaluation, on other data."
        )
    return Diagnosis(
        verdict=Verdict.UNOBSERVED,
        cause="unknown",
        confidence=0.0,
        step=ctx.step_at(ctx.n - 1),
        evidence=evidence,
        actions=actions,
        run=run,
        granularity=ctx.granularity,
        summary=_summary(ctx),
        extra=_extra(ctx),
    )


def _interrupted(
    ctx: Context, findings: list[Finding], stopped: Mapping[str, Any], run: dict[str, Any]
) -> Diagnosis:
    """Stopped from outside with no failure in the updates seen: not healthy, not a failure."""
    summary = _summary(ctx)
    seen = _healthy_text(ctx)
    evidence = [
        Evidence("engine", _stopped_text(stopped), _event_data(stopped)),
        Evidence("engine", f"no failure in the updates seen: {seen}", summary),
    ]
    if ctx.trace.meta.get("truncated"):
        evidence.extend(n for n in _notes(ctx, None))
    return Diagnosis(
        verdict=Verdict.INTERRUPTED,
        cause="unknown",
        confidence=0.0,
        step=ctx.step_at(ctx.n - 1),
        evidence=evidence,
        actions=[
            "Nothing went wrong before the interruption; rerun to the end (or resume from a "
            "checkpoint) for a verdict on the whole fit."
        ],
        alternatives=[
            {"cause": f.cause, "confidence": round(f.confidence, 3)} for f in findings[:3]
        ],
        run=run,
        granularity=ctx.granularity,
        summary=summary,
        extra=_extra(ctx),
    )


def crash_note(event: Mapping[str, Any]) -> Evidence:
    """The evidence a ``crashed`` event adds to the diagnosis of a failure found before it."""
    return Evidence("engine", _crash_text(event), _event_data(event))


def _crash_text(event: Mapping[str, Any]) -> str:
    what = str(event.get("type") or "an exception")
    if event.get("message"):
        what += f": {event['message']}"
    where = f" ({event['file']}:{event['line']})" if event.get("file") else ""
    step = event.get("step")
    when = f"after update {step}" if step is not None else "before any update"
    return f"the script ended with its own exception {when}: {what}{where}"


def unwatched(
    reason: str, *, program: bool = False, crashed: bool = False, refused: bool = False
) -> Diagnosis:
    """The diagnosis of a run nanscope could not watch: ``unobserved``, ``reason`` its evidence.

    ``nanscope run`` asks for it when the script created no Monitor and stepped no watched
    optimizer, ran a program that is not Python (``program``), stopped with its own exception
    before any update (``crashed``) or was never started because its command line was refused
    (``refused``); each of those gets the one action that helps."""
    diagnosis = _unobserved(Trace(), {"unobserved": reason}, None, {})
    if refused:
        diagnosis.actions = ["Fix the command line (the error above), then run it again."]
    elif program:
        diagnosis.actions = [
            "Run the Python training script itself under nanscope (nanscope run -- python "
            "train.py): a Python fit is watched through torch.optim or nanscope.Monitor.",
        ]
    elif crashed:
        diagnosis.actions = [
            "The script raised before its first update (its traceback is above): fix that "
            "error, then run it again under nanscope.",
        ]
    return diagnosis


def saw_no_update(diagnosis: Diagnosis, reason: str) -> Diagnosis:
    """The verdict of a Monitor that recorded no update and was not stopped: never ``healthy``
    (:func:`unwatched`, ``reason`` its evidence); any other verdict stands."""
    return unwatched(reason) if diagnosis.verdict == Verdict.HEALTHY else diagnosis


def note_interruption(diagnosis: Diagnosis, signal_name: str, step: int | None) -> None:
    """Judge ``diagnosis`` again for a run that ``nanscope run`` saw stopped from outside
    (``signal_name``, after update ``step``): with no failure found it is ``interrupted``, never
    ``healthy``, also when it recorded no update (the script was watched, and stopped); a failure
    or a crash found before it stands, the interruption noted beside it."""
    noted = {"signal": signal_name, "step": step}
    if diagnosis.verdict not in (Verdict.HEALTHY, Verdict.UNOBSERVED, Verdict.INTERRUPTED):
        diagnosis.extra.setdefault("interrupted", noted)
        return
    where = f" after update {step}" if step is not None else " before any update"
    text = f"the run was interrupted ({signal_name}){where}; no failure was seen up to there"
    if diagnosis.verdict != Verdict.INTERRUPTED:
        diagnosis.verdict = Verdict.INTERRUPTED
        if diagnosis.cause == "healthy":
            diagnosis.cause = "unknown"
            diagnosis.confidence = 0.0
        diagnosis.step = step
    if not any("interrupted" in e.text for e in diagnosis.evidence):
        diagnosis.evidence.insert(0, Evidence("run", text, dict(noted)))
    diagnosis.extra.setdefault("interrupted", noted)


def note_crash(diagnosis: Diagnosis, crash: Mapping[str, Any], step: int | None) -> None:
    """A failure found before the script's own exception stands (the Monitor diagnosed it when
    it was found); the exception (``crash``: a ``crashed`` event's fields) is noted beside it."""
    event = {**crash, "step": step}
    diagnosis.extra.setdefault("crashed", event)
    if any(e.data.get("type") == crash["type"] and e.data.get("line") == crash["line"]
           for e in diagnosis.evidence):  # fmt: skip
        return
    diagnosis.evidence.append(crash_note(event))


def _crashed(
    trace: Trace,
    ctx: Context | None,
    findings: list[Finding],
    event: Mapping[str, Any],
    run: dict[str, Any],
) -> Diagnosis:
    """The script raised its own exception, with no failure found before it: not healthy (the fit
    did not finish), not a divergence (nothing went wrong in the updates seen)."""
    evidence = [Evidence("engine", _crash_text(event), _event_data(event))]
    summary: dict[str, Any] = {"updates": 0, "nonfinite_updates": 0}
    if ctx is not None:
        summary = _summary(ctx)
        seen = _healthy_text(ctx) if ctx.trace.has("loss") else f"{ctx.n} updates recorded"
        evidence.append(Evidence("engine", f"no failure in the updates seen: {seen}", summary))
        if ctx.trace.meta.get("truncated"):
            evidence.extend(_notes(ctx, None))
    where = f" ({event['type']} at {event['file']}:{event['line']})" if event.get("file") else ""
    return Diagnosis(
        verdict=Verdict.CRASHED,
        cause="unknown",
        confidence=0.0,
        step=event.get("step") if ctx is None else ctx.step_at(ctx.n - 1),
        evidence=evidence,
        actions=[
            f"Fix the error its traceback shows{where}, then rerun: nothing went non-finite or "
            "diverged in the updates watched before it."
        ],
        alternatives=[
            {"cause": f.cause, "confidence": round(f.confidence, 3)} for f in findings[:3]
        ],
        run=run,
        granularity=trace.granularity,
        summary=summary,
        extra=_extra(ctx) if ctx is not None else {},
    )


def _zeros(ctx: Context) -> tuple[int, int] | None:
    """Where a finite run's loss got stuck at exactly 0.0 (index, count), or None."""
    if ctx.fail is not None:
        return None
    idx = np.flatnonzero(np.isfinite(ctx.loss))
    found = stuck_at_zero(ctx.loss[idx])
    return (int(idx[found[0]]), found[1]) if found is not None else None


def _public_row(row: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("batch_row", "dataset_row", "column", "value", "why", "source", "step", "z")
    return {k: row[k] for k in keep if row.get(k) is not None}


def _extra(ctx: Context) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    messages = ctx.messages
    if messages:
        extra["messages"] = messages[:20]
    return extra


def _summary(ctx: Context) -> dict[str, Any]:
    loss = ctx.loss
    finite = loss[np.isfinite(loss)]
    thinned = ctx.trace.meta.get("thinned")  # a long log read in part: count them all
    updates = thinned.get("of", ctx.n) if isinstance(thinned, Mapping) else ctx.n
    out: dict[str, Any] = {"updates": updates}
    if finite.size:
        out.update(
            first_loss=float(finite[0]),
            best_loss=float(finite.min()),
            last_finite_loss=float(finite[-1]),
        )
    out["nonfinite_updates"] = int(np.sum(~np.isfinite(loss)))
    return out


def _healthy_text(ctx: Context) -> str:
    s = _summary(ctx)
    unit = "epochs" if ctx.granularity == "epoch" else "updates"
    if "first_loss" not in s:
        return f"{ctx.n} {unit}, no loss recorded"
    trend = "fell" if s["last_finite_loss"] < s["first_loss"] else "went"
    finite = "all finite" if not ctx.skipped.any() else "all applied ones finite"
    text = (
        f"{s['updates']:,} {unit}, {finite}; the loss {trend} from {num(s['first_loss'])} to "
        f"{num(s['last_finite_loss'])} (best {num(s['best_loss'])})"
    )
    if not math.isfinite(s["first_loss"]):
        text = f"{ctx.n} {unit}"
    return text
