"""The vocabulary of the lint rules: the kinds a value can have, the tables of names implying them.

:class:`K` holds the bit flags :meth:`nanscope.lint.inference.FileContext.kind` gives an expression
(a probability, an unbounded linear output, a norm, a loss, something clamped...). The tables below
are the function, method, layer and loss names of the frameworks that produce, keep or remove
those kinds; the rules and the inference read them, nothing writes them.
"""

from __future__ import annotations

import re

__all__ = [
    "CLAMPS",
    "CLIPPING",
    "COLLECTIVES",
    "CONSTRUCTORS",
    "DEFAULT_ROOTS",
    "EPS_NAME",
    "FN_TO_VALUE",
    "FRAMEWORKS",
    "GRAD_NAME",
    "INPLACE_METHODS",
    "INTERESTING_STRINGS",
    "KERAS_LOSSES",
    "LINEAR_FUNCS",
    "LINEAR_LAYERS",
    "LOGIT_NAME",
    "LOSS_FUNCS",
    "LOSS_NAME",
    "MEAN_FUNCS",
    "MSE_NAMES",
    "OPTIMIZERS",
    "PACKAGE_WIDE",
    "PASS_FUNCS",
    "PASS_METHODS",
    "PROB_NAME",
    "RANDOM_DRAWS",
    "REBINDING_METHODS",
    "SCALERS",
    "SELECTIONS",
    "SUM_FUNCS",
    "VALUE_TO_FN",
    "ZERO_GRAD_ATTRS",
    "K",
    "name_kind",
]


class K:
    """Bit flags describing what a value is."""

    PROB = 1 << 0  # a probability in [0, 1] that can reach exactly 0 or 1
    SIGMOID = 1 << 1  # ... produced by a sigmoid
    SOFTMAX = 1 << 2  # ... produced by a softmax
    SAFE = 1 << 3  # clamped, clipped, or offset by an epsilon
    LINEAR = 1 << 4  # an unbounded linear output (matmul, Linear layer)
    EXP = 1 << 5  # the result of exp (positive)
    NORM = 1 << 6  # a norm (zero for a zero vector)
    STD = 1 << 7  # a standard deviation (zero for a constant input)
    SUM = 1 << 8  # a sum or count (zero for an empty mask)
    SUMEXP = 1 << 9  # a sum of exps (positive)
    SQUARE = 1 << 10  # an elementwise square
    SUMSQ = 1 << 11  # a sum or mean of squares
    HALF = 1 << 12  # float16
    LOSS = 1 << 13  # a loss value
    GRAD = 1 << 14  # a gradient
    MODEL = 1 << 15  # a module / layer object
    VAR = 1 << 16  # a variance
    CONST = 1 << 17  # a literal
    OPTIM = 1 << 18  # an optimizer object
    MAX = 1 << 19  # a max (subtracting it bounds exp)
    # what calling a callable value yields
    FN_PROB = 1 << 20
    FN_SIGMOID = 1 << 21
    FN_SOFTMAX = 1 << 22
    FN_LINEAR = 1 << 23
    FN_LOSS = 1 << 24
    FN_BCE = 1 << 25  # torch BCELoss: prediction is argument 0
    FN_BCE_TF = 1 << 26  # keras BinaryCrossentropy: prediction is argument 1
    FN_MSE = 1 << 27
    NONZERO = 1 << 28  # nonzero by construction: a random draw, a mask with a row of ones

    RISK = PROB | NORM | STD | SUM | SUMSQ | SQUARE | VAR
    ZERO = NORM | STD | SUM
    ARITH = LINEAR | HALF | LOSS | GRAD
    PROBS = PROB | SIGMOID | SOFTMAX
    CARRY = (
        PROBS | SAFE | LINEAR | HALF | LOSS | GRAD | NORM | STD | SUM | EXP | SUMEXP | VAR | MAX
        | NONZERO
    )  # fmt: skip


FRAMEWORKS = frozenset({"torch", "numpy", "tensorflow", "keras", "jax", "math", "scipy", "cupy"})
DEFAULT_ROOTS = {
    "np": "numpy",
    "numpy": "numpy",
    "torch": "torch",
    "tf": "tensorflow",
    "tensorflow": "tensorflow",
    "F": "torch.nn.functional",
    "nn": "torch.nn",
    "jnp": "jax.numpy",
    "jax": "jax",
    "math": "math",
    "keras": "keras",
}

PROB_NAME = re.compile(
    r"^(p|probs?|proba|probas|probabilit(y|ies)|p_?hat|\w+_probs?|\w+_proba|probs?_\w+)$"
)
LOSS_NAME = re.compile(r"^(loss|losses|cost|nll|objective|\w+_loss|loss_\w+)$", re.I)
GRAD_NAME = re.compile(
    r"^(g|grad|grads|gradient|gradients|g_?[wbWB]\d*|g_?theta|\w+_grads?|grads?_\w+|d[wb]|dw\d*|db\d*|dtheta|d_\w+|"
    r"dl_?d\w+|dloss\w*)$",
    re.I,
)
#: a name that holds a small positive constant added to keep a value away from zero
EPS_NAME = re.compile(
    r"^_*(eps|epsilon|\w+_eps|eps_\w+|\w+_epsilon|epsilon_\w+|tiny|\w+_tiny|smooth\w*|"
    r"\w+_smooth\w*|floor|\w+_floor|min_(norm|std|denom\w*|value|val))$",
    re.I,
)
LOGIT_NAME = re.compile(r"^(logits?|\w+_logits?|logits?_\w+)$")

SUM_FUNCS = frozenset({"sum", "reduce_sum", "nansum", "count_nonzero"})
MEAN_FUNCS = frozenset({"mean", "reduce_mean", "nanmean", "average"})
CLAMPS = frozenset(
    {
        "clamp",
        "clip",
        "clamp_",
        "clip_",
        "clamp_min",
        "clamp_max",
        "clip_by_value",
        "maximum",
        "minimum",
        "fmax",
        "fmin",
        "nan_to_num",
        "relu",
        "softplus",
    }
)
PASS_METHODS = frozenset(
    {
        "detach",
        "squeeze",
        "unsqueeze",
        "view",
        "reshape",
        "flatten",
        "contiguous",
        "clone",
        "cpu",
        "cuda",
        "numpy",
        "t",
        "transpose",
        "permute",
        "gather",
        "index_select",
        "narrow",
        "expand",
        "expand_as",
        "view_as",
        "reshape_as",
        "type_as",
        "to",
        "float",
        "double",
        "half",
        "bfloat16",
        "train",
        "eval",
        "requires_grad_",
        "copy",
        "astype",
        "ravel",
        "squeeze_",
        "unsqueeze_",
        "select",
        "take",
        "take_along_dim",
        "diagonal",
        "repeat",
        "repeat_interleave",
        "tile",
        "masked_select",
        "type",
    }
)
PASS_FUNCS = frozenset(
    {
        "gather",
        "take_along_axis",
        "take_along_dim",
        "squeeze",
        "reshape",
        "transpose",
        "take",
        "index_select",
        "asarray",
        "array",
        "tensor",
        "as_tensor",
        "convert_to_tensor",
        "stop_gradient",
    }
)
LINEAR_FUNCS = frozenset(
    {
        "matmul",
        "mm",
        "bmm",
        "dot",
        "einsum",
        "linear",
        "tensordot",
        "inner",
        "addmm",
        "baddbmm",
        "mv",
        "vdot",
    }
)
LOSS_FUNCS = frozenset(
    {
        "cross_entropy",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "kl_div",
        "poisson_nll_loss",
        "gaussian_nll_loss",
        "cosine_embedding_loss",
        "margin_ranking_loss",
        "ctc_loss",
        "softmax_cross_entropy_with_logits",
        "sigmoid_cross_entropy_with_logits",
        "sparse_softmax_cross_entropy_with_logits",
        "sparse_categorical_crossentropy",
        "categorical_crossentropy",
        "binary_crossentropy",
        "mean_squared_error",
        "log_loss",
        "hinge_loss",
        "softmax_cross_entropy",
        "sigmoid_cross_entropy",
    }
)
MSE_NAMES = frozenset({"mse_loss", "mean_squared_error", "MSELoss", "MeanSquaredError"})
LINEAR_LAYERS = frozenset(
    {
        "Linear",
        "LazyLinear",
        "Bilinear",
        "Conv1d",
        "Conv2d",
        "Conv3d",
        "ConvTranspose1d",
        "ConvTranspose2d",
        "ConvTranspose3d",
        "Dense",
        "Conv1D",
        "Conv2D",
        "Conv3D",
        "EinsumDense",
    }
)
KERAS_LOSSES = frozenset(
    {
        "BinaryCrossentropy",
        "CategoricalCrossentropy",
        "SparseCategoricalCrossentropy",
        "MeanSquaredError",
        "MeanAbsoluteError",
        "Huber",
        "KLDivergence",
        "BinaryFocalCrossentropy",
        "LogCosh",
        "Poisson",
    }
)
OPTIMIZERS = frozenset(
    {
        "SGD",
        "Adam",
        "AdamW",
        "RMSprop",
        "Adagrad",
        "Adadelta",
        "Adamax",
        "NAdam",
        "Nadam",
        "RAdam",
        "LBFGS",
        "Lion",
        "Adafactor",
        "SparseAdam",
        "ASGD",
        "Rprop",
        "Ftrl",
    }
)
#: methods that update their receiver in place (torch, TensorFlow variables)
INPLACE_METHODS = frozenset(
    {
        "add_",
        "sub_",
        "mul_",
        "div_",
        "lerp_",
        "copy_",
        "addcmul_",
        "addcdiv_",
        "assign",
        "assign_add",
        "assign_sub",
    }
)
ZERO_GRAD_ATTRS = frozenset({"zero_grad", "clear_grad", "clear_gradients"})
#: loss scalers: with one, float16 gradients are kept in range
SCALERS = frozenset({"GradScaler", "LossScaleOptimizer", "DynamicLossScale", "ShardedGradScaler"})
#: gradient clipping, by function, option or keyword
CLIPPING = frozenset(
    {
        "clip_grad_norm_",
        "clip_grad_norm",
        "clip_grad_value_",
        "clip_by_global_norm",
        "clip_by_norm",
        "clipnorm",
        "clipvalue",
        "global_clipnorm",
        "gradient_clip_val",
        "max_grad_norm",
        "clip_gradients",
        "clip_grad_by_norm",
        "clip_by_average_norm",
    }
)
#: the names a run looks for in every file of the package (a scaler or clipping set up elsewhere)
PACKAGE_WIDE = SCALERS | CLIPPING

#: functions whose result is built from constants (it has no gradient)
CONSTRUCTORS = frozenset(
    {"arange", "linspace", "logspace", "meshgrid", "zeros", "ones", "full", "eye", "range"}
)
#: random draws: a continuous one is nonzero almost surely
RANDOM_DRAWS = frozenset(
    {"rand", "randn", "normal", "uniform", "standard_normal", "random", "rand_like", "randn_like"}
)
#: in-place methods after which the receiver holds a different kind of value (``x.sigmoid_()``
#: makes ``x`` a probability, ``x.clamp_(min=eps)`` makes it safe); the plain arithmetic ones
#: (``add_``...) are the update steps of :data:`INPLACE_METHODS` instead
REBINDING_METHODS = frozenset(
    {
        "sigmoid_",
        "exp_",
        "clamp_",
        "clamp_min_",
        "clamp_max_",
        "clip_",
        "log_",
        "sqrt_",
        "relu_",
        "tanh_",
        "nan_to_num_",
        "softmax_",
    }
)
#: element selections ``where(cond, a, b)``: a value from either branch, not a clamp
SELECTIONS = frozenset({"where", "select", "switch"})
#: collective communication calls: what they return is a value of the same kind as their input
#: (an all-reduced max is still a max)
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_",
        "reduce",
        "broadcast",
        "all_gather",
        "all_gather_tensor",
        "all_reduce_coalesced",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "psum",
        "pmax",
        "pmean",
    }
)
INTERESTING_STRINGS = frozenset({"mixed_float16", "float16", "16-mixed", "fp16"})

FN_TO_VALUE = (
    (K.FN_PROB, K.PROB),
    (K.FN_SIGMOID, K.SIGMOID),
    (K.FN_SOFTMAX, K.SOFTMAX),
    (K.FN_LINEAR, K.LINEAR),
    (K.FN_LOSS, K.LOSS),
    (K.FN_BCE, K.LOSS),
    (K.FN_BCE_TF, K.LOSS),
    (K.FN_MSE, K.LOSS | K.SUMSQ),
)
VALUE_TO_FN = (
    (K.PROB, K.FN_PROB),
    (K.SIGMOID, K.FN_SIGMOID),
    (K.SOFTMAX, K.FN_SOFTMAX),
    (K.LINEAR, K.FN_LINEAR),
    (K.LOSS, K.FN_LOSS),
)


def name_kind(name: str) -> int:
    """What a variable's name alone suggests (used when its value cannot be followed)."""
    k = 0
    if LOSS_NAME.match(name):
        k |= K.LOSS
    if GRAD_NAME.match(name):
        k |= K.GRAD
    return k
