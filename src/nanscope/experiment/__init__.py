"""The decisive experiment: rerun the first updates of a fit at smaller learning rates.

::

    result = nanscope.experiment.sweep(fit, lrs=[1.0, 0.1, 0.01], updates=50)
    result.recommended_lr          # the largest lr whose loss descends steadily, or None

    $ nanscope sweep --factors 1,0.1,0.01 -- python train.py

A script under ``nanscope sweep`` has its PyTorch optimizers scaled automatically; a
framework-free fit multiplies its own learning rate by :func:`lr_factor`.
"""

from __future__ import annotations

from nanscope.experiment._experiment import TRIGGERS, advise, run_experiment
from nanscope.experiment.lrpatch import lr_factor
from nanscope.experiment.sweep import OUTCOMES, FactorResult, SweepResult, classify, sweep

__all__ = [
    "OUTCOMES",
    "TRIGGERS",
    "FactorResult",
    "SweepResult",
    "advise",
    "classify",
    "lr_factor",
    "run_experiment",
    "run_sweep",
    "sweep",
]


def run_sweep(*args: object, **kwargs: object) -> SweepResult:
    """Sweep a training *script* (see :func:`nanscope.experiment._runner.run_sweep`)."""
    from nanscope.experiment._runner import run_sweep as _run

    return _run(*args, **kwargs)  # type: ignore[arg-type]
