"""Import hooks that wait for a module (torch) and run code right after it is imported.

Such a finder finds nothing itself: it asks the other finders on ``sys.meta_path`` for the real
spec and wraps its loader. Both of nanscope's hooks (the autowatch's, the sweep's learning-rate
patch) ask the same way.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["spec_elsewhere"]


def spec_elsewhere(
    finder: importlib.abc.MetaPathFinder,
    name: str,
    path: Sequence[str] | None,
    target: ModuleType | None = None,
) -> importlib.machinery.ModuleSpec | None:
    """The spec the first of the other finders on ``sys.meta_path`` gives for ``name``; None when
    none of them finds it."""
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(name, path, target)
        if spec is not None:
            return spec
    return None
