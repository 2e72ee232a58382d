"""The scale of initial weights against a standard initialiser's, framework-free.

A standard initialiser (PyTorch's default, Kaiming, Xavier, ``randn / sqrt(fan_in)`` by hand)
gives each weight matrix ``std(W) * sqrt(fan_in)`` of about 0.5 to 1.5: each layer then keeps its
input's scale. Far from it, either way, activations grow or vanish layer after layer. Read once,
on the weights before any update: by :class:`nanscope.Monitor` at its first ``update`` (numpy
loops pass the weights before their step) and by ``nanscope run`` at a bare-tensor loop's first
backward (:mod:`nanscope.torch.first_update`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["array_stats", "weight_scale"]


#: a weight matrix as :func:`weight_scale` reads it: its name, its shape and the std of its values
Matrix = tuple[str, tuple[int, ...], float]


def array_stats(params: Iterable[tuple[str, np.ndarray]]) -> list[Matrix]:
    """``(name, shape, std)`` of each 2-d floating array whose values are all finite."""
    out = []
    for name, w in params:
        if w.ndim == 2 and w.size >= 2 and np.issubdtype(w.dtype, np.floating) and (
            np.isfinite(w).all()
        ):
            out.append((name, tuple(int(f) for f in w.shape), float(w.std(dtype=np.float64))))
    return out


def weight_scale(matrices: Iterable[Matrix], widths: set[int]) -> dict[str, Any]:
    """``{"layers": [{param, fan_in, ratio}], "median_ratio", "max_ratio", "min_ratio"}`` over
    the weight matrices given as ``(name, shape, std)`` (``{}`` when there are none), the shape
    the probes' measure of a model's weights has.

    A matrix used as ``x @ W`` contracts its first dimension with the input, ``F.linear`` its
    second: which one is its fan-in cannot always be read from a loop written by hand, so each
    gets the more charitable of the two (the ratio nearer 1), unless the first dimension is a
    width the batch has (``widths``: the first layer's fan-in is then known). A scale far from 1
    is then far whichever way the matrix is used.
    """
    layers: list[dict[str, Any]] = []
    for name, shape, std in matrices:
        fans = [f for f in shape if f >= 2]
        if shape[0] in widths:
            fans = [shape[0]]
        if not fans or not std > 0.0 or not math.isfinite(std):
            continue
        ratios = [std * math.sqrt(f) for f in fans]
        ratio = min(ratios, key=lambda r: abs(math.log(r)))
        layers.append({"param": name, "fan_in": fans[ratios.index(ratio)], "ratio": ratio})
    if not layers:
        return {}
    ratios = sorted(x["ratio"] for x in layers)
    return {"layers": layers, "median_ratio": ratios[len(ratios) // 2],
            "max_ratio": ratios[-1], "min_ratio": ratios[0]}  # fmt: skip
