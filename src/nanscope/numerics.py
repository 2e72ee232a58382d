"""Numeric facts the probes and the rules share: dtype limits, op names and op families, and the
reading of a recorded value as a finite number.

A leaf: it imports nothing of nanscope and no framework, so the probes (which name the op that
made a non-finite value) and the rules (which read that op) agree on one definition of each.

An op's family is matched by substring of its lowercased name (``"logbackward0"`` is a log,
``"addmm"`` a growth op), so one tuple serves the forward names (``log``, ``div``), autograd's
backward node names (``LogBackward0``) and numpy's ufuncs (``divide``).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BF16_MAX", "DIVISION_OPS", "FLOAT_MAX", "GROWTH_OPS", "HALF_MAX", "HALF_TINY",
           "LOG_OPS", "NAME_FIXES", "OUTLIER_Z", "RAW_UNITS", "finite_float",
           "op_name"]  # fmt: skip

#: the largest finite float16
HALF_MAX = 65504.0
#: the smallest positive float16 (a subnormal): anything below rounds to 0
HALF_TINY = 5.960464477539063e-08
#: a data value this large is not in standardised units (10 standard deviations out)
RAW_UNITS = 10.0
#: a row this many robust standard deviations out is an outlier worth naming (heavy tails reach
#: ~20 routinely); at the batch where the loss jumped, it is what threw it
OUTLIER_Z = 50.0
#: the largest finite bfloat16
BF16_MAX = 3.3895313892515355e38
#: the largest finite value of each floating dtype, by torch's name for it
FLOAT_MAX = {"float16": HALF_MAX, "bfloat16": BF16_MAX, "float32": 3.4028234663852886e38,
             "float64": 1.7976931348623157e308}  # fmt: skip

#: Python's spelling of an op (``__truediv__``, ``x /= y``, ``x.square()``) -> the op's name
NAME_FIXES = {
    "truediv": "div", "rtruediv": "div", "true_divide": "div", "divide": "div", "rpow": "pow",
    "rdiv": "div", "rmul": "mul", "rsub": "sub", "radd": "add", "itruediv": "div",
    "imul": "mul", "iadd": "add", "isub": "sub", "ipow": "pow", "square": "pow",
}  # fmt: skip

#: log-like ops: they turn 0 (or a value outside their domain) into -inf / NaN
LOG_OPS = ("log", "xlogy", "binary_cross_entropy", "binarycrossentropy", "nll", "crossentropy",
           "cross_entropy", "logit", "digamma", "lgamma", "acosh", "atanh", "special_entr",
           "specialentr")  # fmt: skip
#: division-like ops: they turn a 0 denominator (or the gradient of a root at 0) into inf / NaN
DIVISION_OPS = ("div", "reciprocal", "rsqrt", "sqrt", "norm", "std", "var", "cosine",
                "normalize", "cdist", "pdist", "remainder", "fmod")  # fmt: skip
#: ops that overflow from large finite inputs
GROWTH_OPS = ("exp", "pow", "square", "mul", "multiply", "matmul", "mm", "addmm", "linear", "sum",
              "mean", "cumsum", "conv", "einsum", "bmm", "baddbmm", "addmv", "mv", "dot", "power",
              "prod", "cosh", "sinh", "expm1", "add", "subtract", "sub", "softplus", "mse",
              "tocopy", "to", "copy", "float", "half", "bfloat16", "type")  # fmt: skip


def op_name(func: Any) -> str:
    """The name of the op a callable runs (``torch.Tensor.__truediv__`` -> ``"div"``)."""
    name = getattr(func, "__name__", None) or str(func)
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    name = name.strip("_")
    return NAME_FIXES.get(name, name)


def finite_float(value: Any) -> float | None:
    """A recorded value as a float when it is a finite number, else None (a string, a NaN)."""
    if type(value) is float:  # the common case, first: the detectors read every record with it
        return value if math.isfinite(value) else None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None
