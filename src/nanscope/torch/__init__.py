"""nanscope.torch: the PyTorch adapter.

Imported lazily (``nanscope.watch`` or ``from nanscope.torch import watch``): ``import nanscope``
never imports torch. :func:`watch` hooks one model and optimizer into a :class:`nanscope.Monitor`;
:mod:`nanscope.torch.autowatch` (used by ``nanscope run``) watches every optimizer a script
creates, with no change to the script. See ``docs/torch.md``.
"""

from __future__ import annotations

from nanscope.torch.watch import Watcher, watch

__all__ = ["Watcher", "watch"]
