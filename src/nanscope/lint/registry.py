"""The table of lint codes. A code, once given, never changes meaning and is never reused.

``L000`` is not a rule: it is the finding reported for a file that does not parse.
"""

from __future__ import annotations

from nanscope.lint._types import Rule
from nanscope.lint.rules.L001_log_of_probability import LogOfProbability
from nanscope.lint.rules.L002_bce_on_sigmoid import BceOnSigmoid
from nanscope.lint.rules.L003_division_without_epsilon import DivisionWithoutEpsilon
from nanscope.lint.rules.L004_sqrt_of_sum_of_squares import SqrtOfSumOfSquares
from nanscope.lint.rules.L005_gradient_ascent_update import GradientAscentUpdate
from nanscope.lint.rules.L006_nan_masking import NanMasking
from nanscope.lint.rules.L007_half_without_grad_scaler import HalfWithoutGradScaler
from nanscope.lint.rules.L008_relu_recurrent_without_clipping import ReluRecurrentWithoutClipping
from nanscope.lint.rules.L009_exp_of_linear_output import ExpOfLinearOutput
from nanscope.lint.rules.L010_step_without_zero_grad import StepWithoutZeroGrad

__all__ = ["RULES", "SYNTAX_ERROR_CODE"]

SYNTAX_ERROR_CODE = "L000"

#: code -> rule class, in code order
RULES: dict[str, type[Rule]] = {
    rule.code: rule
    for rule in (
        LogOfProbability,
        BceOnSigmoid,
        DivisionWithoutEpsilon,
        SqrtOfSumOfSquares,
        GradientAscentUpdate,
        NanMasking,
        HalfWithoutGradScaler,
        ReluRecurrentWithoutClipping,
        ExpOfLinearOutput,
        StepWithoutZeroGrad,
    )
}
