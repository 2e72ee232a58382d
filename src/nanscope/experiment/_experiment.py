"""``nanscope run --experiment``: after a step-size-like diagnosis, run the decisive experiment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nanscope.errors import NanscopeError
from nanscope.formatting import lr as format_lr

__all__ = ["TRIGGERS", "advise", "run_experiment"]

#: the causes a learning-rate sweep decides
TRIGGERS = ("step_size_too_large", "exploding_gradients", "update_sign_error")

#: the most updates an automatic experiment runs per factor
MAX_UPDATES = 500


def _cause_and_step(diagnosis: Any) -> tuple[str | None, int | None]:
    if isinstance(diagnosis, Mapping):
        cause, step = diagnosis.get("cause"), diagnosis.get("step")
    else:
        cause, step = getattr(diagnosis, "cause", None), getattr(diagnosis, "step", None)
    return (str(cause) if cause is not None else None), (
        int(step) if isinstance(step, int) and not isinstance(step, bool) else None
    )


def run_experiment(
    diagnosis: Any,
    argv: Sequence[str],
    updates: int | None = None,
    *,
    factors: Sequence[float] = (1.0, 0.1, 0.01),
    jobs: int | None = None,
    progress: bool | None = None,
    timeout: float | None = None,
) -> dict[str, Any] | None:
    """The ``experiment`` field for a diagnosis of the script ``argv``, or ``None`` when its cause
    is not one a learning-rate sweep decides (see :data:`TRIGGERS`).

    ``updates`` defaults to ``max(50, 2 × the update the run failed at)`` (at most 500), so that the
    original learning rate has the time to fail again. Never raises for a sweep that cannot run: the
    dict then has ``"error"`` and a ``text`` that says why.
    """
    cause, step = _cause_and_step(diagnosis)
    if cause not in TRIGGERS:
        return None
    if updates is None:
        updates = min(MAX_UPDATES, max(50, 2 * step if step else 50))
    from nanscope.experiment._runner import run_sweep

    base: dict[str, Any] = {
        "cause": cause,
        "updates": updates,
        "factors": [float(f) for f in factors],
    }
    try:
        result = run_sweep(argv, factors, updates, jobs=jobs, progress=progress, timeout=timeout)
    except NanscopeError as exc:
        return {
            **base,
            "results": [],
            "recommended_factor": None,
            "recommended_lr": None,
            "base_lr": None,
            "sign_error_confirmed": False,
            "text": f"the lr sweep could not run: {exc}",
            "error": str(exc),
        }
    confirmed = result.every_factor_ascends
    text = result.text()
    if cause == "update_sign_error" and confirmed:
        text += " (the sign error is confirmed: a smaller step only slows the ascent)"
    elif cause == "update_sign_error" and result.recommended is not None:
        text += " (a smaller step descends, so this is not a sign error after all)"
    data = result.to_dict()
    if any(r.extra.get("mode") == "manual" for r in result.results):
        # no optimizer to patch: each gradient was scaled after backward (see lrpatch)
        base["lr_cut"] = (
            "the script updates its weights by hand (no torch.optim): each gradient was scaled "
            "by the factor after backward (clip_grad_norm_ clipping the unscaled one), and the "
            "lr shown is the one its updates applied, read off the change of the weights and "
            "the gradient; for an update that normalises the gradient (a hand-written Adam) "
            "that is no cut at all, and the lr read off says so"
        )
        text += " (hand-made updates: each gradient scaled by the factor after backward)"
    return {
        **base,
        "factors": data["factors"],
        "results": data["results"],
        "recommended_factor": result.recommended_factor,
        "recommended_lr": result.recommended_lr,
        "base_lr": result.base_lr,
        "sign_error_confirmed": confirmed,
        "text": text,
    }


def advise(diagnosis: Any) -> None:
    """After ``run --experiment`` ran the sweep, the advice says what it found: the action that
    asked for the tenfold cut (it names ``nanscope sweep``) becomes the lr to use, or the news
    that no cut descended; a sweep that could not run leaves the advice as it was."""
    experiment = diagnosis.extra.get("experiment")
    if not isinstance(experiment, Mapping) or experiment.get("error"):
        return
    found = str(experiment.get("text") or "").rstrip(".")
    best = experiment.get("recommended_lr")
    if best is not None:
        action = (f"Use lr {format_lr(best)} and rerun: the tenfold cut already ran ({found}); "
                  "the ledger remembers it for this script (`nanscope history`).")  # fmt: skip
    elif experiment.get("sign_error_confirmed") and experiment.get("cause") == "update_sign_error":
        action = (f"Fix the sign of the update: the tenfold cut already ran and every lr still "
                  f"climbs ({found}).")  # fmt: skip
    else:
        action = (f"No lr of the tenfold cut descended ({found}): the step size alone does not "
                  "explain it; follow the other actions.")  # fmt: skip
    actions = list(diagnosis.actions)
    if best is not None:  # the ledger did it already
        actions = [a for a in actions if not a.startswith("Record the learning rate that worked")]
    asked = [i for i, a in enumerate(actions) if "nanscope sweep" in a]
    if asked:
        actions[asked[0]] = action
        actions = [a for i, a in enumerate(actions) if i not in asked[1:]]
    else:
        actions.insert(0, action)
    diagnosis.actions = actions

