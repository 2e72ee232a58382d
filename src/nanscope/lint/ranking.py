"""Where a finding stands: in a loss or an update, in model code, or in data, metrics or inference.

A hazard that reaches a loss or an update is what turns a training run into NaN; the same division
in a data loader, a metric or an inference script can only spoil a number that nothing trains on.
:func:`place_of` says which, from what the source shows: the function and class a node is in
(a loss class, an optimizer's ``step``, a ``Dataset.__getitem__``, an ``evaluate`` function), the
name the statement stores its value in (``loss = ...``), whether it runs under ``no_grad``, and
the file's path (``data/``, ``metrics.py``, ``inference/``). A loss computed in a validation or
evaluation function is a metric. The findings are ranked by it
(:data:`RANK`), and the division rule asks for more in the last three places (nothing anywhere in
the function bounds the denominator).
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import TYPE_CHECKING

from nanscope.lint.vocabulary import LOSS_NAME

if TYPE_CHECKING:
    from nanscope.lint.inference import FileContext
    from nanscope.lint.scopes import Scope, Site

__all__ = ["QUIET_PLACES", "RANK", "place_of"]

#: place -> rank (lower first)
RANK = {
    "loss": 0,
    "update": 0,
    "model": 1,
    "training": 1,
    "other": 2,
    "data": 3,
    "metrics": 3,
    "inference": 3,
}
#: the places where nothing trains on the value
QUIET_PLACES = frozenset({"data", "metrics", "inference"})

#: codes whose finding is by its nature in a loss or an update
_BY_CODE = {
    "L002": "loss",
    "L005": "update",
    "L006": "loss",
    "L007": "training",
    "L008": "model",
    "L010": "update",
}

_LOSS_FUNC = re.compile(
    r"(^|_)(loss|losses|criterion|objective|nll|elbo|kl|kld|neg_loss|focal|dice|bce|ce)(_|$)|"
    r"^(compute|calc|get)_loss|loss$",
    re.I,
)
_LOSS_CLASS = re.compile(r"(Loss|Criterion|Objective|Criteria)\w*$")
_OPTIM_CLASS = re.compile(r"(Optimi[sz]er|^SGD|^Adam\w*|^Lamb|^Lars|^Lion|^Adafactor)\w*$")
_MODEL_BASES = frozenset({"Module", "Layer", "Model", "LightningModule", "Sequential"})
_DATA_BASES = frozenset({"Dataset", "IterableDataset", "Sampler", "DataLoader", "Sequence"})
_DATA_FUNC = re.compile(
    r"^(__getitem__|__iter__|__len__|collate\w*|\w*_collate\w*|preprocess\w*|\w*_preprocess\w*|"
    r"transform\w*|augment\w*|load_\w*|read_\w*|make_dataset|build_dataset|\w*_sampler?|"
    r"normali[sz]e_(audio|image|data|features?)|\w*sampl\w*_(probs?|ratios?|weights?)\w*)$"
)
_DATA_PATH = re.compile(
    r"^(data|datasets?|dataloaders?|loaders?|preprocess\w*|preprocessing|transforms?|augment\w*|"
    r"samplers?|\w*_dataset|\w*_datasets|data_\w+|\w+_data|processors?|\w*_processors?)$"
)
_METRIC_FUNC = re.compile(
    r"^(\w*metrics?\w*|accuracy\w*|\w*_accuracy|evaluat\w*|eval_\w*|\w*_eval|score\w*|\w*_score|"
    r"valid\w*|\w*_valid|\w*_validation|measure\w*|"
    r"bleu\w*|precision\w*|recall\w*|f1\w*|\w*_iou|iou\w*|log_\w+|summar\w*|report\w*|"
    r"\w*stats?|statistics\w*|visuali[sz]\w*|plot\w*|draw\w*|print\w*|show\w*|\w*_meter)$"
)
_METRIC_PATH = re.compile(
    r"^(metrics?|\w*_metrics?|eval|evals?|evaluation|evaluators?|\w*_evaluation|\w*_evaluator|"
    r"eval_\w+|\w*_eval|scoring|scorers?|bleu|meters?|logging|loggers?|visuali[sz]\w*|plots?|"
    r"plotting|stats|statistics|analysis|\w*_analysis|benchmarks?|profil\w*|measure\w*)$"
)
_INFER_FUNC = re.compile(
    r"^(inference\w*|\w*_inference|predict\w*|\w*_predict|generate\w*|\w*_generate|sample\w*|"
    r"infer\w*|beam\w*|\w*_search|search\w*|export\w*|postprocess\w*|"
    r"post_process\w*|demo\w*|test_\w+)$"
)
_INFER_PATH = re.compile(
    r"^(inference|infer|generation|\w*generators?|generate\w*|demos?|serve|serving|deploy\w*|"
    r"export\w*|tools|scripts|postprocess\w*|\w*_inference|interactive|hub_utils)$"
)


def _functions(scope: Scope) -> list[Scope]:
    """The scope and its enclosing functions and classes, innermost first."""
    out: list[Scope] = []
    s: Scope | None = scope
    while s is not None and s.kind != "module":
        out.append(s)
        s = s.parent
    return out


def _path_place(path: str) -> str | None:
    parts = PurePath(path).with_suffix("").parts
    for part in reversed(parts):
        lower = part.lower()
        if _INFER_PATH.match(lower):
            return "inference"
        if _METRIC_PATH.match(lower):
            return "metrics"
        if _DATA_PATH.match(lower):
            return "data"
    return None


def place_of(code: str, site: Site, ctx: FileContext) -> str:
    """One of :data:`RANK`'s places for a finding of ``code`` at ``site``."""
    fixed = _BY_CODE.get(code)
    if fixed is not None:
        return fixed
    enclosing = _functions(site.scope)
    for s in enclosing:
        if s.kind == "class":
            if _LOSS_CLASS.search(s.name) or any(_LOSS_CLASS.search(b) for b in s.bases):
                return "loss"
            if _OPTIM_CLASS.search(s.name) or "Optimizer" in s.bases:
                return "update"
        elif _LOSS_FUNC.search(s.name):
            return "loss"
    if site.no_grad:
        return "inference"
    for s in enclosing:
        name = s.name.lstrip("_") if not s.name.startswith("__") else s.name
        if s.kind == "class":
            if any(b in _DATA_BASES for b in s.bases):
                return "data"
        elif _DATA_FUNC.match(name):
            return "data"
        elif _METRIC_FUNC.match(name):
            return "metrics"  # a validation loss is a metric: nothing trains on it
        elif _INFER_FUNC.match(name):
            return "inference"
    if site.sink and site.sink != "return" and LOSS_NAME.match(site.sink):
        return "loss"
    by_path = _path_place(ctx.path)
    if by_path is not None:
        return by_path
    for s in enclosing:
        if s.kind == "class" and any(b in _MODEL_BASES for b in s.bases):
            return "model"
        if s.name == "forward":
            return "model"
    return "training" if "backward" in ctx.idents else "other"
