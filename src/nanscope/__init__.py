"""nanscope: when a gradient-descent fit goes NaN, say what happened, where, why, and what to do.

The public surface is small::

    mon = nanscope.Monitor()                 # framework-free: numpy, jax, torch tensors
    mon.update(loss, params=..., grads=..., lr=..., inputs=..., targets=...)
    nanscope.diagnose("run/trace.jsonl")     # after the fact, on a trace or a log
    nanscope.watch(model, optimizer)         # PyTorch (imported lazily)
"""

from __future__ import annotations

from typing import Any

from nanscope._version import __version__
from nanscope.diagnose import CAUSES, Diagnosis
from nanscope.diagnose.diagnosis import set_html_renderer as _set_html_renderer
from nanscope.errors import (
    DivergenceError,
    InputError,
    MissingExtraError,
    NanscopeError,
    TraceError,
    UsageError,
)
from nanscope.loading import diagnose
from nanscope.monitor import Monitor
from nanscope.trace import Trace, read_trace

__all__ = [
    "CAUSES",
    "Diagnosis",
    "DivergenceError",
    "InputError",
    "MissingExtraError",
    "Monitor",
    "NanscopeError",
    "Trace",
    "TraceError",
    "UsageError",
    "__version__",
    "diagnose",
    "read_trace",
    "scan",
    "sweep",
    "watch",
]

_LAZY = {
    "watch": ("nanscope.torch", "watch"),
    "scan": ("nanscope.data", "scan"),
    "sweep": ("nanscope.experiment", "sweep"),
}


def _html_fragment(diagnosis: Diagnosis) -> str:
    # the page is imported on first display (Jupyter), never by the diagnosis itself
    from nanscope.report.html import diagnosis_fragment

    return diagnosis_fragment(diagnosis)


_set_html_renderer(_html_fragment)


def __getattr__(name: str) -> Any:
    # framework-specific entry points import their framework only when first used
    if name in _LAZY:
        import importlib

        from nanscope._extras import needs

        module_name, attr = _LAZY[name]
        with needs(f"nanscope.{name}"):
            return getattr(importlib.import_module(module_name), attr)
    raise AttributeError(f"module 'nanscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the public names, the lazy ones included (not the helpers this module imports)
    return sorted(set(__all__) | set(_LAZY))
