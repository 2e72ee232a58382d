"""nanscope: when a gradient-descent fit goes NaN, say what happened, where, why, and what to do."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
