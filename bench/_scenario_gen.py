"""Random training scripts drawn from a seed, for ``bench/scenarios.py``.

:func:`generate` draws a :class:`Spec` (a family, a task, a model, an optimizer, the data and the
fault the generator meant to put in, plus knobs that are usually harmless); :func:`render` writes
it as an ordinary, standalone training script, optionally under one :class:`Change` (the
counterfactual interventions that establish a scenario's label). The scripts use no nanscope
import except the numpy family, which watches its fit with ``nanscope.Monitor`` as the README
shows (``Change(monitor=False)`` leaves it out for the bare runs).

Every script keeps its per-update losses in a list named ``losses`` and prints one line per
epoch that starts with ``epoch`` (what the labeller and the comparison with the bare run read).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["FAMILIES", "INTERVENTIONS", "Change", "Spec", "applicable", "generate", "hazards",
           "render", "rows_of"]

#: the template each seed is rendered with: ``FAMILIES[seed % len(FAMILIES)]``
FAMILIES = ("mlp", "cnn", "rnn", "transformer", "manual", "numpy")

#: every intervention a label can rest on, in the order they are tried
INTERVENTIONS = (
    "lr_x0.1", "lr_x0.01", "lr_x0.001", "without_nonfinite_rows", "without_extreme_rows",
    "standardised", "float32", "eps_log", "eps_div", "sign_fixed", "clipped", "standard_init",
    "adam_eps",
)  # fmt: skip


@dataclass
class Spec:
    """Everything a scenario's script is rendered from; a field a family does not use keeps its
    default."""

    seed: int
    family: str
    #: the fault the generator meant to put in ("none" for a fit meant to be healthy); a label
    #: is never taken from it, only from the bare counterfactual runs
    injected: str = "none"
    #: regression, binary, multiclass, counts, log_counts (the log of counts that can be 0),
    #: embedding, sequence, lm
    task: str = "regression"
    # data
    n: int = 512
    d: int = 6
    classes: int = 3
    seq_len: int = 20
    features: int = 2
    vocab: int = 24
    #: columns recorded in raw units: (column, mean, scale, what it is)
    raw_columns: list[tuple[int, float, float, str]] = field(default_factory=list)
    #: the regression target in raw units: (mean, scale)
    raw_target: tuple[float, float] | None = None
    raw_pixels: bool = False
    #: a rarely-set 0/1 column
    flag_column: int | None = None
    #: a column recorded after the outcome: it nearly copies the label
    leak_column: int | None = None
    #: rows as they came from the source: (row, column or -1 for the target, value literal)
    bad_rows: list[tuple[int, int, str]] = field(default_factory=list)
    #: all-zero target rows (padding) for the embedding task
    zero_targets: list[int] = field(default_factory=list)
    #: constant samples: blank images, a stuck sensor
    blank_rows: list[int] = field(default_factory=list)
    #: the script standardises every feature column before training
    prep: bool = False
    # model
    model: str = "mlp"
    hidden: int = 32
    depth: int = 1
    act: str = "relu"
    #: the standard deviation the script initialises its weights with (None: the framework's
    #: default, or 1/sqrt(fan_in) for hand-written weights)
    init_std: float | None = None
    #: an RNN whose recurrence starts as the identity (IRNN, a published recipe for ReLU RNNs:
    #: not an init-scale fault, so no standard-init intervention)
    identity_recurrence: bool = False
    #: where the script divides by a spread it computed: per_sample (in forward), batch_std (in
    #: the loop), or None
    norm_op: str | None = None
    # loss
    loss: str = "mse"
    # optimisation
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    adam_eps: float | None = None
    weight_decay: float = 0.0
    schedule: str = "none"  # none, warmup, cosine, warmup_cosine, step
    warmup: int = 10
    clip: float | None = None
    accum: int = 1
    precision: str = "fp32"  # fp32, bf16_autocast, fp16_autocast, fp16_model, bf16_model
    scaler: bool = False
    #: a static loss scale (the loss times it before backward, the gradients divided after)
    loss_scale: float | None = None
    sign: int = 1
    update_style: str = "no_grad_sub"  # manual family: no_grad_sub, data_add, custom_opt
    epochs: int = 4
    batch: int = 32

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Spec:
        kept = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("raw_columns", "bad_rows"):
            kept[key] = [tuple(item) for item in kept.get(key, [])]
        if kept.get("raw_target") is not None:
            kept["raw_target"] = tuple(kept["raw_target"])
        return cls(**kept)


@dataclass(frozen=True)
class Change:
    """One counterfactual: what the script is rendered with instead of the spec's own knob."""

    lr_factor: float = 1.0
    #: drop the bad rows of this kind: "nonfinite" (NaN/inf) or "extreme" (finite)
    drop_rows: str | None = None
    standardise: bool = False
    float32: bool = False
    #: an epsilon (or the stable form) at the log of a probability
    eps_log: bool = False
    #: an epsilon at the division by a norm or a spread
    eps_div: bool = False
    fix_sign: bool = False
    clip: bool = False
    standard_init: bool = False
    adam_eps: bool = False
    #: numpy family: the Monitor lines (False for the bare runs)
    monitor: bool = True


def applicable(spec: Spec) -> dict[str, Change]:
    """The interventions that change this scenario's script, by name (the lr cuts always do)."""
    out = {f"lr_x{f:g}": Change(lr_factor=f) for f in (0.1, 0.01, 0.001)}
    for kind in ("nonfinite", "extreme"):
        if rows_of(spec, kind):
            out[f"without_{kind}_rows"] = Change(drop_rows=kind)
    if spec.raw_columns or spec.raw_target or spec.raw_pixels:
        out["standardised"] = Change(standardise=True)
    if spec.precision != "fp32":
        out["float32"] = Change(float32=True)
    if "log" in hazards(spec):
        out["eps_log"] = Change(eps_log=True)
    if "div" in hazards(spec):
        out["eps_div"] = Change(eps_div=True)
    if spec.sign < 0:
        out["sign_fixed"] = Change(fix_sign=True)
    if spec.clip is None and spec.optimizer != "lbfgs" and spec.family != "numpy":
        out["clipped"] = Change(clip=True)
    if spec.init_std is not None:
        out["standard_init"] = Change(standard_init=True)
    if spec.adam_eps == 0.0 and spec.optimizer in ("adam", "adamw"):
        out["adam_eps"] = Change(adam_eps=True)
    return out


def rows_of(spec: Spec, kind: str) -> list[int]:
    """The bad rows of one kind: ``nonfinite`` (NaN/inf) or ``extreme`` (finite)."""
    return sorted({row for row, _, value in spec.bad_rows
                   if ("nan" in value or "inf" in value) == (kind == "nonfinite")})  # fmt: skip


def hazards(spec: Spec) -> list[str]:
    """The ops an epsilon guards in this script: ``log`` (of a probability), ``div`` (by a norm
    or a spread)."""
    out = []
    if spec.loss in ("bce_manual", "log_softmax_manual") or spec.task == "log_counts":
        out.append("log")
    if spec.loss == "cosine_manual" or spec.norm_op is not None:
        out.append("div")
    return out


# ---------------------------------------------------------------------------------------------
# drawing a spec


SAFE_LR = {
    "sgd": 0.05, "momentum": 0.01, "adam": 1e-3, "adamw": 1e-3, "rmsprop": 1e-3,
    "adagrad": 0.05, "lbfgs": 0.5, "manual": 0.05,
}  # fmt: skip

#: (fault, weight) per family: what the generator means to put in
MENUS: dict[str, list[tuple[str, float]]] = {
    "mlp": [("none", 3), ("high_lr", 2), ("raw_units", 1.5), ("nan_rows", 1),
            ("extreme_rows", 1), ("log_prob", 1.5), ("div", 0.7), ("init", 1),
            ("adam_eps0", 0.7), ("half", 1)],
    "cnn": [("none", 3), ("high_lr", 2), ("raw_units", 0.6), ("nan_rows", 1),
            ("extreme_rows", 0.8), ("log_prob", 0.5), ("div", 1), ("init", 0.6), ("half", 1),
            ("adam_eps0", 0.5)],
    "rnn": [("none", 3), ("high_lr", 1.5), ("explode", 2), ("raw_units", 1), ("nan_rows", 1),
            ("extreme_rows", 0.7), ("div", 1), ("half", 0.8), ("init", 0.7)],
    "transformer": [("none", 3), ("high_lr", 2), ("log_prob", 0.6), ("adam_eps0", 1),
                    ("half", 1.2), ("init", 0.6)],
    "manual": [("none", 3), ("high_lr", 1.5), ("raw_units", 1.2), ("nan_rows", 1),
               ("extreme_rows", 1), ("sign", 2), ("log_prob", 1.5), ("init", 1)],
    "numpy": [("none", 3), ("high_lr", 1.5), ("raw_units", 1.2), ("nan_rows", 1),
              ("extreme_rows", 1), ("sign", 2), ("log_prob", 1.5), ("div", 1), ("init", 1)],
}  # fmt: skip

RAW_COLUMNS = [
    (5000.0, 1000.0, "income, in dollars"), (40.0, 12.0, "age, in years"),
    (1500.0, 400.0, "floor area, in square feet"), (200.0, 80.0, "price, in thousands"),
    (1.0e4, 3.0e3, "distance, in metres"), (70.0, 15.0, "heart rate, per minute"),
    (300.0, 100.0, "duration, in seconds"), (8000.0, 2500.0, "annual mileage"),
]  # fmt: skip


def _weighted(r: random.Random, menu: list[tuple[str, float]]) -> str:
    names, weights = zip(*menu)
    return r.choices(names, weights=weights)[0]


def _loguniform(r: random.Random, low: float, high: float) -> float:
    value = 10 ** r.uniform(low, high)
    return float(f"{value:.2g}")


def generate(seed: int, family: str | None = None) -> Spec:
    """The scenario of ``seed`` (its family is ``FAMILIES[seed % 6]`` unless given)."""
    family = family or FAMILIES[seed % len(FAMILIES)]
    r = random.Random(f"nanscope-scenario-{seed}-{family}")
    spec = Spec(seed=seed, family=family, injected=_weighted(r, MENUS[family]))
    {"mlp": _draw_mlp, "cnn": _draw_cnn, "rnn": _draw_rnn, "transformer": _draw_transformer,
     "manual": _draw_manual, "numpy": _draw_numpy}[family](r, spec)  # fmt: skip
    return spec


def _pick_rows(r: random.Random, n: int, k: int) -> list[int]:
    return sorted(r.sample(range(n), k))


def _nonfinite_literal(r: random.Random) -> str:
    return r.choice(["np.nan", "np.nan", "np.inf", "-np.inf"])


def _tabular_faults(r: random.Random, spec: Spec, *, targets_ok: bool) -> None:
    """Rows, raw-unit columns and the flag column of the tabular families."""
    fault = spec.injected
    spec.prep = fault not in ("raw_units", "extreme_rows") and r.random() < 0.3
    #: raw units are harmless (as a distractor) where the optimizer or the script rescales
    harmless = spec.prep or spec.optimizer in ("adam", "adamw", "rmsprop", "adagrad")
    spec.flag_column = spec.d - 1 if r.random() < 0.5 else None
    if fault == "log_prob" and spec.task in ("binary", "multiclass"):
        spec.leak_column = 0
    free = [c for c in range(spec.d) if c not in (spec.flag_column, spec.leak_column)]
    if fault == "raw_units" or (harmless and r.random() < 0.25):
        for col in r.sample(free, r.choice([1, 1, 2])):
            mean, scale, what = r.choice([c for c in RAW_COLUMNS if c[1] >= 400]
                                         if fault == "raw_units" else RAW_COLUMNS)  # fmt: skip
            spec.raw_columns.append((col, mean, scale, what))
        spec.raw_columns.sort()
    if spec.task == "regression" and ((fault == "raw_units" and r.random() < 0.3) or
                                      (harmless and r.random() < 0.1)):  # fmt: skip
        spec.raw_target = (r.choice([200.0, 300.0, 5000.0]), r.choice([50.0, 80.0, 1000.0]))
    if fault == "nan_rows":
        for row in _pick_rows(r, spec.n, r.choice([1, 1, 2, 3])):
            col = -1 if targets_ok and r.random() < 0.3 else r.choice(free)
            spec.bad_rows.append((row, col, _nonfinite_literal(r)))
    if fault == "extreme_rows" or r.random() < 0.08:
        for row in _pick_rows(r, spec.n, r.choice([1, 1, 2])):
            col = -1 if targets_ok and r.random() < 0.3 else r.choice(free)
            spec.bad_rows.append((row, col, r.choice(["1e6", "5e7", "-2e6", "3e8", "1e5"])))


def _optimizer(r: random.Random, spec: Spec, choices: list[str]) -> None:
    fault = spec.injected
    if fault == "half":
        choices = [c for c in choices if c != "lbfgs"]
    plain = [c for c in choices if c in ("sgd", "momentum", "lbfgs")] or choices
    if fault == "adam_eps0":
        spec.optimizer = r.choice(["adam", "adamw"])
        spec.adam_eps = 0.0
    elif fault == "raw_units":
        spec.optimizer = r.choice(plain)
    elif fault in ("extreme_rows", "init") and r.random() < 0.75:
        spec.optimizer = r.choice([c for c in plain if c != "lbfgs"] or plain)
    elif fault == "half":
        spec.optimizer = r.choice([c for c in choices if c in ("adam", "adamw")] or choices)
    elif fault == "log_prob":
        spec.optimizer = r.choice([c for c in choices if c in ("adam", "adamw", "momentum")]
                                  or choices)  # fmt: skip
    else:
        spec.optimizer = r.choice(choices)
    safe = SAFE_LR[spec.optimizer]
    if fault == "high_lr":
        spec.lr = _loguniform(r, 1.5 + (0.5 if spec.optimizer in ("adam", "adamw") else 0), 3.5)
        spec.lr = float(f"{safe * spec.lr:.2g}")
    elif fault == "log_prob" and spec.optimizer in ("adam", "adamw", "momentum"):
        spec.lr = _loguniform(r, -2, -1.5) if spec.optimizer != "momentum" else 0.1
    else:
        spec.lr = float(f"{safe * 10 ** r.uniform(-0.8, 0.2):.2g}")
    if spec.optimizer in ("adam", "adamw"):
        spec.weight_decay = r.choice([0.0, 0.0, 0.01]) if spec.optimizer == "adam" else 0.01
    spec.schedule = r.choice(["none", "none", "warmup", "cosine", "warmup_cosine", "step"])
    spec.warmup = r.choice([5, 10, 20])
    if spec.optimizer != "lbfgs":
        spec.clip = r.choice([None, None, None, 1.0, 5.0]) if fault != "explode" else None
        spec.accum = r.choice([1, 1, 1, 1, 2, 4])


def _precision(r: random.Random, spec: Spec) -> None:
    if spec.injected == "half":
        # Adam's state in half (its eps rounds to 0), a static loss scale, or autocast
        kind = r.choices(["adam", "static", "autocast"], weights=[0.45, 0.4, 0.15])[0]
        spec.precision = "fp16_autocast" if kind == "autocast" else "fp16_model"
        spec.scaler = kind == "autocast" and r.random() < 0.5
        if kind == "static":
            spec.optimizer = r.choice(["sgd", "momentum"])
            spec.lr = float(f"{SAFE_LR[spec.optimizer] * 10 ** r.uniform(-0.8, 0.2):.2g}")
            spec.loss_scale = r.choice([16384.0, 32768.0, 65536.0])
            spec.accum, spec.clip = 1, None
    elif r.random() < 0.12 and spec.optimizer != "lbfgs":
        spec.precision = r.choice(["bf16_autocast", "bf16_autocast", "bf16_model"])


def _init(r: random.Random, spec: Spec, stds: list[float]) -> None:
    if spec.injected == "init":
        spec.init_std = r.choice(stds)


def _draw_mlp(r: random.Random, spec: Spec) -> None:
    fault = spec.injected
    tasks = ["regression"] * 4 + ["binary"] * 3 + ["multiclass"] * 2 + ["counts", "embedding"]
    if fault == "log_prob":
        tasks = ["binary", "binary", "log_counts"]
    elif fault == "raw_units":
        tasks = ["regression"] * 3 + ["binary", "multiclass", "counts"]
    elif fault == "div":
        tasks = ["embedding"]
    elif fault == "half":
        tasks = ["regression", "regression", "binary", "multiclass"]
    elif fault == "init":
        tasks = ["regression", "regression", "counts", "binary"]
    spec.task = r.choice(tasks)
    spec.n = r.choice([256, 384, 512])
    spec.d = r.choice([4, 6, 8, 12])
    spec.batch = r.choice([16, 32, 64])
    spec.epochs = r.choice([3, 4, 6])
    spec.hidden = r.choice([16, 32, 64])
    spec.depth = r.choice([1, 2, 2, 3]) if fault != "init" else r.choice([3, 4, 5])
    if fault == "init":
        spec.hidden = r.choice([32, 64])
    spec.act = r.choice(["relu", "relu", "tanh", "gelu"])
    _optimizer(r, spec, ["sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad", "lbfgs"])
    if spec.optimizer == "lbfgs":
        spec.epochs = r.choice([15, 20, 30])  # full-batch steps
    _tabular_faults(r, spec, targets_ok=spec.task in ("regression", "counts", "log_counts"))
    if spec.task == "binary":
        spec.loss = "bce_manual" if fault == "log_prob" or r.random() < 0.3 else "bce_logits"
    elif spec.task == "multiclass":
        spec.loss = "log_softmax_manual" if fault == "log_prob" or r.random() < 0.2 else "ce"
    elif spec.task == "counts":
        spec.loss = "poisson_exp"
    elif spec.task == "log_counts":
        spec.loss = "mse"
    elif spec.task == "embedding":
        spec.loss = "cosine_manual"
        if fault == "div" or r.random() < 0.3:
            spec.zero_targets = _pick_rows(r, spec.n, r.choice([1, 3, 8]))
    else:
        spec.loss = r.choice(["mse", "mse", "mse_manual", "huber"])
    if fault == "log_prob":
        spec.epochs = r.choice([10, 15])
        spec.batch = r.choice([16, 32])
    _precision(r, spec)
    _init(r, spec, [0.5, 1.0, 2.0] if spec.task == "counts" else [1.0, 2.0, 5.0])


def _sample_faults(r: random.Random, spec: Spec, *, cells: int, extreme: list[str],
                   extreme_rows: list[int] | None, div_rate: float, blank_rows: list[int]) -> None:
    """Bad rows (one cell each: a pixel, a time step) and constant samples for the image and
    sequence families; ``extreme_rows`` None: one extreme row."""
    fault = spec.injected
    if fault == "nan_rows":
        spec.bad_rows = [(row, r.randrange(cells), _nonfinite_literal(r))
                         for row in _pick_rows(r, spec.n, r.choice([1, 2]))]  # fmt: skip
    if fault == "extreme_rows" or r.random() < 0.06:
        count = r.choice(extreme_rows) if extreme_rows else 1
        spec.bad_rows += [(row, r.randrange(cells), r.choice(extreme))
                          for row in _pick_rows(r, spec.n, count)]  # fmt: skip
    if fault == "div" or r.random() < div_rate:
        spec.norm_op = "per_sample"
        if fault == "div" or r.random() < 0.3:
            spec.blank_rows = _pick_rows(r, spec.n, r.choice(blank_rows))


def _draw_cnn(r: random.Random, spec: Spec) -> None:
    fault = spec.injected
    spec.task = "multiclass"
    spec.n = r.choice([192, 256, 384])
    spec.batch = r.choice([16, 32, 64])
    spec.epochs = r.choice([3, 4, 5])
    spec.hidden = r.choice([4, 8, 16])
    spec.model = "cnn"
    _optimizer(r, spec, ["sgd", "momentum", "adam", "adamw", "rmsprop"])
    spec.raw_pixels = fault == "raw_units" or r.random() < 0.15
    _sample_faults(r, spec, cells=144, extreme=["1e5", "3e6", "-1e6"], extreme_rows=[1, 2],
                   div_rate=0.2, blank_rows=[1, 2, 4])  # fmt: skip
    spec.loss = "log_softmax_manual" if fault == "log_prob" or r.random() < 0.2 else "ce"
    if fault == "log_prob":
        spec.epochs = max(spec.epochs, 5)
        spec.lr = float(f"{spec.lr * r.choice([1, 3, 10]):.2g}")
    _precision(r, spec)
    _init(r, spec, [1.0, 2.0, 5.0])


def _draw_rnn(r: random.Random, spec: Spec) -> None:
    fault = spec.injected
    spec.task = "sequence"
    spec.n = r.choice([128, 192, 256])
    spec.batch = r.choice([16, 32])
    spec.epochs = r.choice([3, 4, 6])
    spec.hidden = r.choice([16, 32])
    spec.features = r.choice([2, 3])
    spec.seq_len = r.choice([10, 20, 30])
    if fault == "explode":
        spec.model = "rnn_relu"
        spec.identity_recurrence = True
        spec.seq_len = r.choice([100, 150, 200])
        spec.hidden = 32
    elif fault == "init":
        spec.model = r.choice(["rnn_relu", "rnn_relu", "rnn_tanh", "gru"])
    else:
        spec.model = r.choice(["lstm", "gru", "rnn_relu", "rnn_tanh"])
    _optimizer(r, spec, ["sgd", "momentum", "adam", "rmsprop"])
    if fault == "explode":
        spec.optimizer = r.choice(["sgd", "momentum"])
        spec.lr = _loguniform(r, -2.5, -1.5)
    elif spec.model == "rnn_relu" and r.random() < 0.2:
        spec.identity_recurrence = True  # the recipe, at a common length: usually fine
    if fault == "raw_units" or r.random() < 0.15:
        mean, scale, what = r.choice(RAW_COLUMNS)
        spec.raw_columns = [(spec.features - 1, mean, scale, what)]
    _sample_faults(r, spec, cells=spec.seq_len, extreme=["1e5", "2e6", "-5e5"], extreme_rows=None,
                   div_rate=0.15, blank_rows=[1, 2])  # fmt: skip
    spec.loss = "mse"
    _precision(r, spec)
    _init(r, spec, [0.5, 1.0, 2.0])


def _draw_transformer(r: random.Random, spec: Spec) -> None:
    fault = spec.injected
    spec.task = "lm"
    spec.model = "transformer"
    spec.n = r.choice([128, 192, 256])
    spec.batch = r.choice([16, 32])
    spec.epochs = r.choice([3, 4, 6])
    spec.hidden = r.choice([16, 32])
    spec.depth = r.choice([1, 2])
    spec.vocab = r.choice([16, 24, 32])
    spec.seq_len = r.choice([8, 12, 16])
    _optimizer(r, spec, ["adamw", "adamw", "adam", "sgd", "momentum"])
    if spec.optimizer in ("adam", "adamw") and r.random() < 0.6:
        spec.schedule = "warmup_cosine"
    if r.random() < 0.4 and spec.clip is None and fault != "high_lr":
        spec.clip = 1.0
    spec.loss = "log_softmax_manual" if fault == "log_prob" or r.random() < 0.2 else "ce"
    if fault == "log_prob":
        spec.epochs = max(spec.epochs, 6)
        spec.lr = float(f"{spec.lr * r.choice([3, 10]):.2g}")
    _precision(r, spec)
    _init(r, spec, [1.0, 2.0, 5.0])


def _hand_written(r: random.Random, spec: Spec, tasks: list[str], log_prob_tasks: list[str],
                  epochs: list[int]) -> None:  # fmt: skip
    """What the two hand-written families draw alike: the task, the model, the sizes."""
    fault = spec.injected
    spec.task = r.choice(tasks)
    if fault == "log_prob":
        spec.task = r.choice(log_prob_tasks)
    elif fault == "sign":
        spec.task = "regression"
    elif fault == "init":
        spec.task = r.choice(["counts", "counts", "regression"])
    spec.model = r.choice(["linear", "linear", "mlp"]) if spec.task != "counts" else "linear"
    spec.n = r.choice([256, 384, 512])
    spec.d = r.choice([3, 5, 8])
    spec.batch = r.choice([16, 32, 64])
    spec.epochs = r.choice(epochs)
    spec.hidden = r.choice([16, 32])
    spec.optimizer = "manual"


def _hand_lr(r: random.Random, spec: Spec) -> None:
    """The step of a hand-written update, and its sign."""
    safe = SAFE_LR["manual"]
    if spec.injected == "high_lr":
        spec.lr = float(f"{safe * 10 ** r.uniform(1.3, 3.0):.2g}")
    else:
        spec.lr = float(f"{safe * 10 ** r.uniform(-0.8, 0.2):.2g}")
    spec.sign = -1 if spec.injected == "sign" else 1


def _draw_manual(r: random.Random, spec: Spec) -> None:
    fault = spec.injected
    _hand_written(r, spec, ["regression", "regression", "binary"], ["binary", "log_counts"],
                  [3, 4, 6])  # fmt: skip
    spec.update_style = r.choice(["no_grad_sub", "no_grad_sub", "data_add", "custom_opt"])
    _hand_lr(r, spec)
    spec.clip = 1.0 if r.random() < 0.15 else None
    _tabular_faults(r, spec, targets_ok=spec.task == "regression")
    if spec.task == "binary":
        spec.loss = "bce_manual" if fault == "log_prob" or r.random() < 0.4 else "bce_logits"
    elif spec.task == "counts":
        spec.loss = "poisson_exp"
    else:
        spec.loss = r.choice(["mse", "mse_manual"])
    if fault == "log_prob" and spec.task == "binary":
        spec.epochs = 15
        spec.lr = _loguniform(r, 0.3, 1.0)
    if fault == "sign":
        spec.epochs = max(spec.epochs, 6)
    _init(r, spec, [3.0, 10.0, 30.0])


def _draw_numpy(r: random.Random, spec: Spec) -> None:
    fault = spec.injected
    _hand_written(r, spec, ["regression", "regression", "binary", "multiclass"],
                  ["binary", "log_counts", "log_counts"], [4, 6, 8])  # fmt: skip
    _hand_lr(r, spec)
    _tabular_faults(r, spec, targets_ok=spec.task == "regression")
    if fault == "div" or r.random() < 0.1:
        spec.norm_op = "batch_std"
        if spec.flag_column is None:
            spec.flag_column = spec.d - 1
            spec.raw_columns = [c for c in spec.raw_columns if c[0] != spec.flag_column]
            spec.bad_rows = [b for b in spec.bad_rows if b[1] != spec.flag_column]
        spec.prep = False
    if spec.task == "binary":
        spec.loss = "bce_manual" if fault == "log_prob" or r.random() < 0.5 else "bce_logits"
    elif spec.task == "multiclass":
        spec.loss = "log_softmax_manual" if r.random() < 0.5 else "ce"
    elif spec.task == "counts":
        spec.loss = "poisson_exp"
    else:
        spec.loss = "mse"
    if fault == "log_prob" and spec.task == "binary":
        spec.epochs = 15
        spec.lr = _loguniform(r, -0.3, 0.5)
    if fault == "sign":
        spec.epochs = max(spec.epochs, 8)
    _init(r, spec, [3.0, 10.0, 30.0])


# ---------------------------------------------------------------------------------------------
# rendering


class _Code:
    """Lines with an indentation that ``block`` raises for the lines written inside it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, *lines: str) -> None:
        for line in lines:
            self.lines.append(("    " * self.depth + line) if line else "")

    @contextlib.contextmanager
    def block(self, head: str) -> Iterator[None]:
        self(head)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def text(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"


def _num(value: float) -> str:
    """A float literal as people write one: ``5000.0``, ``32768.0``, ``0.001``, ``1e-05``."""
    if value == int(value) and abs(value) < 1e6:
        return f"{value:.1f}"
    text = f"{value:.3g}"
    return text if any(ch in text for ch in ".e") else f"{text}.0"


def render(spec: Spec, change: Change | None = None) -> str:
    """The script of ``spec`` under ``change`` (none: the scenario as drawn)."""
    change = change or Change()
    return {"mlp": _render_torch, "cnn": _render_torch, "rnn": _render_torch,
            "transformer": _render_torch, "manual": _render_manual,
            "numpy": _render_numpy}[spec.family](spec, change)  # fmt: skip


def _effective(spec: Spec, change: Change) -> Spec:
    """The spec with the change's knobs applied where a knob says it all."""
    out = replace(spec, lr=spec.lr * change.lr_factor)
    if change.float32:
        out.precision, out.scaler = "fp32", False
    if change.fix_sign:
        out.sign = 1
    if change.clip and out.clip is None:
        out.clip = 1.0
    if change.standard_init:
        out.init_std = None
    if change.adam_eps:
        out.adam_eps = None
    return out


def _tabular_data(c: _Code, spec: Spec, change: Change) -> None:
    """numpy lines that make ``X`` and ``y`` (shared by the tabular families)."""
    c(f"rng = np.random.default_rng({spec.seed})",
      f"n, d = {spec.n}, {spec.d}",
      "X = rng.normal(size=(n, d))")  # fmt: skip
    if spec.task == "regression":
        c("y = X @ rng.normal(size=d) + 0.1 * rng.normal(size=n)")
    elif spec.task == "binary":
        c("y = (X @ rng.normal(size=d) + 0.3 * rng.normal(size=n) > 0).astype(np.float64)")
    elif spec.task == "multiclass":
        c(f"y = (X @ rng.normal(size=(d, {spec.classes}))).argmax(axis=1)")
    elif spec.task in ("counts", "log_counts"):
        c("y = rng.poisson(np.exp(0.8 * X @ rng.normal(size=d) / np.sqrt(d))).astype(np.float64)")
        if spec.task == "log_counts":
            c("y = np.log1p(y)  # model the log of the count" if change.eps_log
              else "y = np.log(y)  # model the log of the count")  # fmt: skip
    elif spec.task == "embedding":
        c("y = np.tanh(X @ rng.normal(size=(d, 4)))")
    if spec.raw_target is not None:
        mean, scale = spec.raw_target
        c(f"y = {_num(mean)} + {_num(scale)} * y  # the target in its own units")
    if spec.leak_column is not None:
        k = spec.leak_column
        # float64 (numpy) saturates a sigmoid only past 36.7: its leak is recorded in larger units
        size = 12.0 if spec.family == "numpy" else 3.0
        leak = f"{size} * (2 * y - 1) + 0.5" if spec.task == "binary" else "2.0 * y + 0.3"
        c(f"X[:, {k}] = {leak} * rng.normal(size=n)  # recorded after the outcome")
    if spec.flag_column is not None:
        c(f"X[:, {spec.flag_column}] = (rng.random(n) < 0.03).astype(np.float64)"
          "  # a rarely-set flag")  # fmt: skip
    for col, mean, scale, what in spec.raw_columns:
        c(f"X[:, {col}] = {_num(mean)} + {_num(scale)} * X[:, {col}]  # {what}")
    for row in spec.zero_targets:
        c(f"y[{row}] = 0.0  # padding")
    for row, col, value in spec.bad_rows:
        c(f"y[{row}] = {value}" if col < 0 else f"X[{row}, {col}] = {value}")
    _drop(c, spec, change)
    if change.standardise:
        cols = [col for col, *_ in spec.raw_columns]
        if cols:
            c(f"raw = {cols}",
              "X[:, raw] = ((X[:, raw] - np.nanmean(X[:, raw], axis=0))",
              "             / np.nanstd(X[:, raw], axis=0))")  # fmt: skip
        if spec.raw_target is not None:
            c("y = (y - np.nanmean(y)) / np.nanstd(y)")
    if spec.prep:
        c("X = (X - X.mean(axis=0)) / X.std(axis=0)  # standardise the features")


def _drop(c: _Code, spec: Spec, change: Change) -> None:
    rows = rows_of(spec, change.drop_rows) if change.drop_rows else []
    if rows:
        c(f"bad = {rows}",
          "X, y = np.delete(X, bad, axis=0), np.delete(y, bad, axis=0)",
          "n = len(X)")  # fmt: skip


def _images_data(c: _Code, spec: Spec, change: Change) -> None:
    c(f"rng = np.random.default_rng({spec.seed})",
      f"n = {spec.n}",
      "X = rng.normal(0.0, 0.3, size=(n, 1, 12, 12))",
      "y = rng.integers(0, 3, size=n)",
      "pos = rng.integers(2, 10, size=n)")  # fmt: skip
    with c.block("for i in range(n):  # a horizontal bar, a vertical bar or the diagonal"):
        with c.block("if y[i] == 0:"):
            c("X[i, 0, pos[i], :] += 1.0")
        with c.block("elif y[i] == 1:"):
            c("X[i, 0, :, pos[i]] += 1.0")
        with c.block("else:"):
            c("X[i, 0, np.arange(12), np.arange(12)] += 1.0")
    if spec.raw_pixels:
        c("X = np.clip(np.round(100.0 + 80.0 * X), 0, 255)  # 8-bit pixel values")
    for row in spec.blank_rows:
        c(f"X[{row}] = 0.0  # an empty frame")
    for row, pixel, value in spec.bad_rows:
        c(f"X[{row}, 0, {pixel // 12}, {pixel % 12}] = {value}")
    _drop(c, spec, change)
    if change.standardise and spec.raw_pixels:
        c("X = (X - np.nanmean(X)) / np.nanstd(X)")


def _sequence_data(c: _Code, spec: Spec, change: Change) -> None:
    c(f"rng = np.random.default_rng({spec.seed})",
      f"n, T, f = {spec.n}, {spec.seq_len}, {spec.features}",
      "X = rng.normal(size=(n, T, f))",
      "y = X[:, -5:, 0].mean(axis=1) + 0.5 * X[:, :, 1].mean(axis=1)")  # fmt: skip
    for col, mean, scale, what in spec.raw_columns:
        c(f"X[:, :, {col}] = {_num(mean)} + {_num(scale)} * X[:, :, {col}]  # {what}")
    for row in spec.blank_rows:
        c(f"X[{row}] = X[{row}, 0]  # a sensor that got stuck")
    for row, t, value in spec.bad_rows:
        c(f"X[{row}, {t}, 0] = {value}")
    _drop(c, spec, change)
    if change.standardise:
        for col, *_ in spec.raw_columns:
            c(f"X[:, :, {col}] = (X[:, :, {col}] - np.nanmean(X[:, :, {col}])) / "
              f"np.nanstd(X[:, :, {col}])")  # fmt: skip


def _tokens_data(c: _Code, spec: Spec) -> None:
    c(f"rng = np.random.default_rng({spec.seed})",
      f"n, T, V = {spec.n}, {spec.seq_len}, {spec.vocab}",
      "start = rng.integers(1, V, size=(n, 1))",
      "stride = rng.choice([1, 2, 3], size=(n, 1))",
      "tokens = 1 + (start + stride * np.arange(T + 1)) % (V - 1)  # 0 is padding",
      "length = rng.integers(T // 2, T + 2, size=n)",
      "tokens[np.arange(T + 1) >= length[:, None]] = 0",
      "X, y = tokens[:, :-1], tokens[:, 1:]")  # fmt: skip


_ACT = {"relu": "nn.ReLU()", "tanh": "nn.Tanh()", "gelu": "nn.GELU()"}


def _model(c: _Code, spec: Spec, change: Change) -> None:
    """The nn.Module of the torch families, then ``model = ...``."""
    s = spec
    if s.family == "mlp":
        out = {"multiclass": s.classes, "embedding": 4}.get(s.task, 1)
        layers = [f"nn.Linear({s.d}, {s.hidden})", _ACT[s.act]]
        for _ in range(s.depth - 1):
            layers += [f"nn.Linear({s.hidden}, {s.hidden})", _ACT[s.act]]
        layers.append(f"nn.Linear({s.hidden}, {out})")
        c("model = nn.Sequential(")
        for layer in layers:
            c(f"    {layer},")
        c(")")
    elif s.family == "cnn":
        with c.block("class Net(nn.Module):"):
            with c.block("def __init__(self):"):
                c("super().__init__()",
                  f"self.conv1 = nn.Conv2d(1, {s.hidden}, 3, padding=1)",
                  f"self.conv2 = nn.Conv2d({s.hidden}, {2 * s.hidden}, 3, padding=1)",
                  "self.pool = nn.MaxPool2d(2)",
                  f"self.fc = nn.Linear({2 * s.hidden} * 3 * 3, 3)")  # fmt: skip
            c("")
            with c.block("def forward(self, x):"):
                if s.norm_op == "per_sample":
                    eps = " + 1e-5" if change.eps_div else ""
                    c("# each image on its own scale",
                      "x = (x - x.mean(dim=(1, 2, 3), keepdim=True)) / "
                      f"(x.std(dim=(1, 2, 3), keepdim=True){eps})")  # fmt: skip
                c("x = self.pool(torch.relu(self.conv1(x)))",
                  "x = self.pool(torch.relu(self.conv2(x)))",
                  "return self.fc(x.flatten(1))")  # fmt: skip
        c("", "", "model = Net()")
    elif s.family == "rnn":
        cell = {"lstm": f"nn.LSTM({s.features}, {s.hidden}, batch_first=True)",
                "gru": f"nn.GRU({s.features}, {s.hidden}, batch_first=True)",
                "rnn_relu": f'nn.RNN({s.features}, {s.hidden}, nonlinearity="relu", '
                            "batch_first=True)",
                "rnn_tanh": f"nn.RNN({s.features}, {s.hidden}, batch_first=True)",
                }[s.model]  # fmt: skip
        with c.block("class Net(nn.Module):"):
            with c.block("def __init__(self):"):
                c("super().__init__()", f"self.rnn = {cell}",
                  f"self.head = nn.Linear({s.hidden}, 1)")  # fmt: skip
                if s.identity_recurrence:
                    c("nn.init.eye_(self.rnn.weight_hh_l0)  # IRNN: start from the identity",
                      "nn.init.zeros_(self.rnn.bias_hh_l0)")  # fmt: skip
            c("")
            with c.block("def forward(self, x):"):
                if s.norm_op == "per_sample":
                    eps = " + 1e-5" if change.eps_div else ""
                    c("# each sequence on its own scale",
                      "x = (x - x.mean(dim=1, keepdim=True)) / "
                      f"(x.std(dim=1, keepdim=True){eps})")  # fmt: skip
                c("out, _ = self.rnn(x)", "return self.head(out[:, -1]).squeeze(1)")
        c("", "", "model = Net()")
    elif s.family == "transformer":
        with c.block("class TinyGPT(nn.Module):"):
            with c.block("def __init__(self):"):
                c("super().__init__()",
                  f"self.tok = nn.Embedding({s.vocab}, {s.hidden}, padding_idx=0)",
                  f"self.pos = nn.Embedding({s.seq_len}, {s.hidden})",
                  f"layer = nn.TransformerEncoderLayer({s.hidden}, 2, {4 * s.hidden}, "
                  "dropout=0.0, batch_first=True)",
                  f"self.blocks = nn.TransformerEncoder(layer, {s.depth}, "
                  "enable_nested_tensor=False)",
                  f"self.head = nn.Linear({s.hidden}, {s.vocab})")  # fmt: skip
            c("")
            with c.block("def forward(self, x):"):
                c("t = x.size(1)",
                  "mask = nn.Transformer.generate_square_subsequent_mask(t)",
                  "h = self.tok(x) + self.pos(torch.arange(t))",
                  "return self.head(self.blocks(h, mask=mask, is_causal=True))")  # fmt: skip
        c("", "", "model = TinyGPT()")
    if s.init_std is not None:
        kinds = {"mlp": "nn.Linear", "cnn": "(nn.Conv2d, nn.Linear)",
                 "transformer": "(nn.Linear, nn.Embedding)"}  # fmt: skip
        if s.family == "rnn":
            with (c.block("for name, p in model.rnn.named_parameters():"),
                  c.block('if name.startswith("weight"):')):  # fmt: skip
                c(f"nn.init.normal_(p, std={_num(s.init_std)})")
        else:
            with (c.block("for m in model.modules():"),
                  c.block(f"if isinstance(m, {kinds[s.family]}):")):  # fmt: skip
                c(f"nn.init.normal_(m.weight, std={_num(s.init_std)})")
    if s.precision == "fp16_model":
        c("model = model.half()")
    elif s.precision == "bf16_model":
        c("model = model.to(torch.bfloat16)")


def _optimizer_line(s: Spec) -> str:
    params = "model.parameters()"
    lr = _num(s.lr)
    wd = f", weight_decay={_num(s.weight_decay)}" if s.weight_decay else ""
    eps = ", eps=0.0" if s.adam_eps == 0.0 else ""
    return {
        "sgd": f"torch.optim.SGD({params}, lr={lr})",
        "momentum": f"torch.optim.SGD({params}, lr={lr}, momentum={_num(s.momentum)})",
        "adam": f"torch.optim.Adam({params}, lr={lr}{eps}{wd})",
        "adamw": f"torch.optim.AdamW({params}, lr={lr}{eps}{wd})",
        "rmsprop": f"torch.optim.RMSprop({params}, lr={lr})",
        "adagrad": f"torch.optim.Adagrad({params}, lr={lr})",
        "lbfgs": f"torch.optim.LBFGS({params}, lr={lr}, max_iter=5, history_size=10)",
    }[s.optimizer]


def _schedule(c: _Code, s: Spec, total: str) -> bool:
    if s.schedule == "none" or s.optimizer == "lbfgs":
        return False
    if s.schedule == "warmup":
        c("sched = torch.optim.lr_scheduler.LambdaLR(",
          f"    opt, lambda i: min(1.0, (i + 1) / {s.warmup}))")  # fmt: skip
    elif s.schedule == "cosine":
        c(f"sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max={total})")
    elif s.schedule == "step":
        c("sched = torch.optim.lr_scheduler.StepLR(",
          f"    opt, step_size=max(1, {total} // 3), gamma=0.5)")  # fmt: skip
    else:
        with c.block("def lr_lambda(i):"):
            with c.block(f"if i < {s.warmup}:"):
                c(f"return (i + 1) / {s.warmup}")
            c(f"progress = (i - {s.warmup}) / max(1, {total} - {s.warmup})",
              "return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))")  # fmt: skip
        c("", "sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)")
    return True


def _torch_loss(c: _Code, s: Spec, change: Change, out: str, target: str) -> None:
    """Lines that set ``loss`` from ``out`` and ``target``."""
    if s.loss in ("mse", "huber", "bce_logits", "ce"):
        c(f"loss = loss_fn({out}, {target})")
    elif s.loss == "mse_manual":
        c(f"loss = (({out} - {target}) ** 2).mean()")
    elif s.loss == "bce_manual":
        clamp = ".clamp(1e-7, 1 - 1e-7)" if change.eps_log else ""
        y = target
        c(f"p = torch.sigmoid({out}){clamp}",
          f"loss = -({y} * torch.log(p) + (1 - {y}) * torch.log(1 - p)).mean()")  # fmt: skip
    elif s.loss == "log_softmax_manual":
        logp = (f"torch.log_softmax({out}, dim=-1)" if change.eps_log
                else f"torch.log(torch.softmax({out}, dim=-1))")  # fmt: skip
        c(f"logp = {logp}",
          f"loss = -logp.gather(-1, {target}.unsqueeze(-1)).mean()")  # fmt: skip
    elif s.loss == "cosine_manual":
        eps = " + 1e-8" if change.eps_div else ""
        c(f"cos = ({out} * {target}).sum(dim=1) / ({out}.norm(dim=1) * {target}.norm(dim=1){eps})",
          "loss = (1 - cos).mean()")  # fmt: skip
    elif s.loss == "poisson_exp":
        c(f"rate = torch.exp({out})", f"loss = (rate - {target} * {out}).mean()")


def _loss_fn_line(s: Spec) -> str | None:
    nn = "torch.nn" if s.family == "manual" else "nn"
    name = {"mse": "MSELoss", "huber": "HuberLoss", "bce_logits": "BCEWithLogitsLoss",
            "ce": "CrossEntropyLoss"}.get(s.loss)  # fmt: skip
    return f"{nn}.{name}()" if name else None


def _render_torch(spec: Spec, change: Change) -> str:
    s = _effective(spec, change)
    c = _Code()
    c(f'"""{_doc(s)}"""', "")
    if s.schedule == "warmup_cosine" and s.optimizer != "lbfgs":
        c("import math", "")
    c("import numpy as np", "import torch", "from torch import nn",
      "from torch.utils.data import DataLoader, TensorDataset", "",
      f"torch.manual_seed({s.seed})")  # fmt: skip
    c("")
    if s.family == "mlp":
        _tabular_data(c, s, change)
    elif s.family == "cnn":
        _images_data(c, s, change)
    elif s.family == "rnn":
        _sequence_data(c, s, change)
    else:
        _tokens_data(c, s)
    c("")
    long_target = s.task in ("multiclass", "lm")
    column_target = s.task in ("regression", "binary", "counts", "log_counts")
    c("X = torch.tensor(X, dtype=torch.float32)" if s.family != "transformer"
      else "X = torch.tensor(X, dtype=torch.long)")  # fmt: skip
    if long_target:
        c("y = torch.tensor(y, dtype=torch.long)")
    elif column_target:
        c("y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)")
    else:
        c("y = torch.tensor(y, dtype=torch.float32)")
    c("")
    _model(c, s, change)
    c(f"opt = {_optimizer_line(s)}")
    fn = _loss_fn_line(s)
    if fn:
        c(f"loss_fn = {fn}")
    if s.optimizer == "lbfgs":
        _lbfgs_loop(c, s, change)
        return c.text()
    c(f"loader = DataLoader(TensorDataset(X, y), batch_size={s.batch}, shuffle=True)")
    total = f"{s.epochs} * len(loader) // {s.accum}" if s.accum > 1 else f"{s.epochs} * len(loader)"
    has_sched = _schedule(c, s, f"({total})")
    if s.scaler:
        c('scaler = torch.amp.GradScaler("cpu")')
    c("", "losses = []")
    half_in = s.precision in ("fp16_model", "bf16_model")
    cast = ".half()" if s.precision == "fp16_model" else ".to(torch.bfloat16)"
    with c.block(f"for epoch in range({s.epochs}):"):
        loop = "for i, (xb, yb) in enumerate(loader):" if s.accum > 1 else "for xb, yb in loader:"
        with c.block(loop):
            if s.accum == 1:
                c("opt.zero_grad()")
            if half_in and s.family != "transformer":
                c(f"xb = xb{cast}")
            if half_in and not long_target:
                c(f"yb = yb{cast}")
            if s.precision in ("bf16_autocast", "fp16_autocast"):
                dtype = "torch.bfloat16" if s.precision == "bf16_autocast" else "torch.float16"
                with c.block(f'with torch.autocast("cpu", dtype={dtype}):'):
                    _forward_and_loss(c, s, change)
            else:
                _forward_and_loss(c, s, change)
            if s.accum > 1:
                c(f"(loss / {s.accum}).backward()" if not s.scaler
                  else f"scaler.scale(loss / {s.accum}).backward()")  # fmt: skip
            elif s.loss_scale:
                c(f"(loss * {_num(s.loss_scale)}).backward()  # static loss scaling")
                with c.block("for p in model.parameters():"):
                    c(f"p.grad /= {_num(s.loss_scale)}")
            else:
                c("scaler.scale(loss).backward()" if s.scaler else "loss.backward()")
            step_block = (c.block(f"if (i + 1) % {s.accum} == 0:") if s.accum > 1
                          else contextlib.nullcontext())  # fmt: skip
            with step_block:
                if s.clip is not None:
                    if s.scaler:
                        c("scaler.unscale_(opt)")
                    c(f"torch.nn.utils.clip_grad_norm_(model.parameters(), {_num(s.clip)})")
                if s.scaler:
                    c("scaler.step(opt)", "scaler.update()")
                else:
                    c("opt.step()")
                if s.accum > 1:
                    c("opt.zero_grad()")
                if has_sched:
                    c("sched.step()")
            c("losses.append(loss.item())")
        c('print(f"epoch {epoch}: loss {losses[-1]:.4g}")')
    return c.text()


def _forward_and_loss(c: _Code, s: Spec, change: Change) -> None:
    if s.family == "transformer":
        c("logits = model(xb)")
        if s.loss == "ce":
            c(f"loss = loss_fn(logits.reshape(-1, {s.vocab}), yb.reshape(-1))")
        else:
            _torch_loss(c, s, change, "logits", "yb")
        return
    c("out = model(xb)")
    _torch_loss(c, s, change, "out", "yb")


def _lbfgs_loop(c: _Code, s: Spec, change: Change) -> None:
    c("", "")
    with c.block("def closure():"):
        c("opt.zero_grad()", "out = model(X)")
        _torch_loss(c, s, change, "out", "y")
        c("loss.backward()", "return loss")
    c("", "", "losses = []")
    with c.block(f"for epoch in range({s.epochs}):"):
        c("loss = opt.step(closure)", "losses.append(loss.item())",
          'print(f"epoch {epoch}: loss {losses[-1]:.4g}")')  # fmt: skip


def _doc(s: Spec) -> str:
    what = {"mlp": "An MLP", "cnn": "A small CNN", "rnn": f"A {s.model.upper()} model",
            "transformer": "A tiny transformer", "manual": "A hand-written model",
            "numpy": "A numpy model"}[s.family]  # fmt: skip
    return f"{what} on a synthetic {s.task} task."


def _render_manual(spec: Spec, change: Change) -> str:
    s = _effective(spec, change)
    c = _Code()
    c(f'"""{_doc(s)}"""', "", "import numpy as np", "import torch", "",
      f"torch.manual_seed({s.seed})", "")  # fmt: skip
    _tabular_data(c, s, change)
    c("", "X = torch.tensor(X, dtype=torch.float32)",
      "y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)", "")  # fmt: skip
    scale = "/ d ** 0.5" if s.init_std is None else f"* {_num(s.init_std)}"
    if s.model == "linear":
        c(f"w = (torch.randn(d, 1) {scale}).requires_grad_()",
          "b = torch.zeros(1, requires_grad=True)",
          "params = [w, b]")  # fmt: skip
    else:
        hscale = f"/ {s.hidden} ** 0.5" if s.init_std is None else f"* {_num(s.init_std)}"
        c(f"W1 = (torch.randn(d, {s.hidden}) {scale}).requires_grad_()",
          f"b1 = torch.zeros({s.hidden}, requires_grad=True)",
          f"W2 = (torch.randn({s.hidden}, 1) {hscale}).requires_grad_()",
          "b2 = torch.zeros(1, requires_grad=True)",
          "params = [W1, b1, W2, b2]")  # fmt: skip
    c(f"lr = {_num(s.lr)}")
    fn = _loss_fn_line(s)
    if fn:
        c(f"loss_fn = {fn}")
    if s.update_style == "custom_opt":
        c("", "")
        with c.block("class PlainSGD(torch.optim.Optimizer):"):
            with c.block("def __init__(self, params, lr):"):
                c("super().__init__(params, dict(lr=lr))")
            c("")
            c("@torch.no_grad()")
            alpha = "-group['lr']" if s.sign > 0 else "group['lr']"
            with (c.block("def step(self):"), c.block("for group in self.param_groups:"),
                  c.block("for p in group['params']:")):  # fmt: skip
                c(f"p.add_(p.grad, alpha={alpha})")
        c("", "", "opt = PlainSGD(params, lr=lr)")
    c("", "losses = []")
    with c.block(f"for epoch in range({s.epochs}):"):
        c("perm = torch.randperm(n)")
        with c.block(f"for start in range(0, n, {s.batch}):"):
            c(f"idx = perm[start:start + {s.batch}]", "xb, yb = X[idx], y[idx]")
            if s.model == "linear":
                c("out = xb @ w + b")
            else:
                c("out = torch.tanh(xb @ W1 + b1) @ W2 + b2")
            _torch_loss(c, s, change, "out", "yb")
            if s.update_style == "custom_opt":
                c("opt.zero_grad()", "loss.backward()")
                if s.clip is not None:
                    c(f"torch.nn.utils.clip_grad_norm_(params, {_num(s.clip)})")
                c("opt.step()")
            else:
                c("loss.backward()")
                if s.clip is not None:
                    c(f"torch.nn.utils.clip_grad_norm_(params, {_num(s.clip)})")
                with c.block("with torch.no_grad():"), c.block("for p in params:"):
                    if s.update_style == "no_grad_sub":
                        c("p -= lr * p.grad" if s.sign > 0 else "p += lr * p.grad")
                    else:
                        c("p.data.add_(p.grad, alpha=-lr)" if s.sign > 0
                          else "p.data.add_(p.grad, alpha=lr)")  # fmt: skip
                    c("p.grad.zero_()")
            c("losses.append(loss.item())")
        c('print(f"epoch {epoch}: loss {losses[-1]:.4g}")')
    return c.text()


def _render_numpy(spec: Spec, change: Change) -> str:
    s = _effective(spec, change)
    c = _Code()
    c(f'"""{_doc(s)}"""', "", "import numpy as np")
    if change.monitor:
        c("", "import nanscope")
    c("")
    _tabular_data(c, s, change)
    if s.task == "multiclass":
        c(f"Y = np.eye({s.classes})[y]  # one-hot")
    else:
        c("y = y.reshape(-1, 1)")
    c("")
    out = s.classes if s.task == "multiclass" else 1
    scale = "/ np.sqrt(d)" if s.init_std is None else f"* {_num(s.init_std)}"
    if s.model == "linear":
        c(f"w = rng.normal(size=(d, {out})) {scale}", f"b = np.zeros({out})")
        names = ["w", "b"]
    else:
        hscale = f"/ np.sqrt({s.hidden})" if s.init_std is None else f"* {_num(s.init_std)}"
        c(f"W1 = rng.normal(size=(d, {s.hidden})) {scale}", f"b1 = np.zeros({s.hidden})",
          f"W2 = rng.normal(size=({s.hidden}, {out})) {hscale}",
          f"b2 = np.zeros({out})")  # fmt: skip
        names = ["W1", "b1", "W2", "b2"]
    c(f"lr = {_num(s.lr)}")
    if change.monitor:
        c("mon = nanscope.Monitor()")
    c("", "losses = []")
    target = "Y" if s.task == "multiclass" else "y"
    with c.block(f"for epoch in range({s.epochs}):"):
        c("order = rng.permutation(len(X))")
        with c.block(f"for start in range(0, len(X), {s.batch}):"):
            c(f"idx = order[start:start + {s.batch}]", f"xb, yb = X[idx], {target}[idx]")
            if s.norm_op == "batch_std":
                eps = " + 1e-8" if change.eps_div else ""
                c(f"xb = (xb - xb.mean(axis=0)) / (xb.std(axis=0){eps})  # batch standardisation")
            if s.model == "linear":
                c("z = xb @ w + b")
            else:
                c("h = np.tanh(xb @ W1 + b1)", "z = h @ W2 + b2")
            _numpy_loss(c, s, change)
            if s.model == "linear":
                c("gw = xb.T @ dz", "gb = dz.sum(axis=0)")
            else:
                c("gW2 = h.T @ dz", "gb2 = dz.sum(axis=0)", "dh = (dz @ W2.T) * (1 - h ** 2)",
                  "gW1 = xb.T @ dh", "gb1 = dh.sum(axis=0)")  # fmt: skip
            if change.monitor:
                params = ", ".join(f'"{n}": {n}' for n in names)
                grads = ", ".join(f'"{n}": g{n}' for n in names)
                c("mon.update(",
                  "    loss,",
                  f"    params={{{params}}},",
                  f"    grads={{{grads}}},",
                  "    lr=lr, inputs=xb, targets=yb, index=idx,",
                  ")")  # fmt: skip
            op = "-=" if s.sign > 0 else "+="
            for name in names:
                c(f"{name} {op} lr * g{name}")
            c("losses.append(float(loss))")
        c('print(f"epoch {epoch}: loss {losses[-1]:.4g}")')
    return c.text()


def _numpy_loss(c: _Code, s: Spec, change: Change) -> None:
    """Lines that set ``loss`` and ``dz`` (the gradient of the loss at ``z``)."""
    if s.loss == "mse":
        c("err = z - yb", "loss = np.mean(err ** 2)", "dz = 2 * err / len(xb)")
    elif s.loss == "bce_logits":
        c("loss = np.mean(np.logaddexp(0.0, z) - yb * z)",
          "dz = (1 / (1 + np.exp(-z)) - yb) / len(xb)")  # fmt: skip
    elif s.loss == "bce_manual":
        c("p = 1 / (1 + np.exp(-z))")
        if change.eps_log:
            c("p = np.clip(p, 1e-7, 1 - 1e-7)")
        c("loss = -np.mean(yb * np.log(p) + (1 - yb) * np.log(1 - p))",
          "dz = (p - yb) / len(xb)")  # fmt: skip
    elif s.loss == "ce" or (s.loss == "log_softmax_manual" and change.eps_log):
        # the stable form: log-softmax through the shifted log-sum-exp
        c("z = z - z.max(axis=1, keepdims=True)",
          "logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))",
          "loss = -np.mean((yb * logp).sum(axis=1))",
          "dz = (np.exp(logp) - yb) / len(xb)")  # fmt: skip
    elif s.loss == "poisson_exp":
        c("rate = np.exp(z)", "loss = np.mean(rate - yb * z)", "dz = (rate - yb) / len(xb)")
    elif s.loss == "log_softmax_manual":
        c("e = np.exp(z)", "p = e / e.sum(axis=1, keepdims=True)",
          "loss = -np.mean((yb * np.log(p)).sum(axis=1))", "dz = (p - yb) / len(xb)")
