"""nanscope.torch: the PyTorch adapter.

``nanscope.watch`` (or ``from nanscope.torch import watch``) hooks one model and optimizer into a
:class:`nanscope.Monitor`; :mod:`nanscope.torch.autowatch` (used by ``nanscope run``) watches every
optimizer a script creates, with no change to the script. See ``docs/torch.md``.

Importing this package does not import torch: ``watch`` and ``Watcher`` are loaded on first use,
so ``nanscope run`` can arm :mod:`nanscope.torch.autowatch` for a script that may never use torch.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanscope.torch.watch import Watcher, watch

__all__ = ["Watcher", "watch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        from nanscope._extras import needs

        with needs(f"nanscope.torch.{name}"):
            module = importlib.import_module("nanscope.torch.watch")
        # importing the submodule bound ``watch`` to it on this package: bind the function back
        globals().update(watch=module.watch, Watcher=module.Watcher)
        return globals()[name]
    raise AttributeError(f"module 'nanscope.torch' has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps ``nanscope.torch.watch`` the function when the submodule of that name is imported.

    The import system binds a submodule on its package once it ran (``from nanscope.torch.watch
    import Watcher`` would leave ``nanscope.torch.watch`` -- and so ``nanscope.watch`` -- the
    module); the function and the class are bound instead.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "watch" and isinstance(value, types.ModuleType) and hasattr(value, "watch"):
            super().__setattr__("Watcher", value.Watcher)
            value = value.watch
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
