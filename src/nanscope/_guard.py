"""The one fault guard: a bug inside nanscope never kills the user's training run.

Every part of nanscope that runs inside someone else's fit (the Monitor's measures and writes, the
torch adapter's hooks, the trainer callbacks) runs through a :class:`FaultGuard`::

    guard = FaultGuard()
    guard.run("forward pre", hook, args)      # returns None instead of raising on a fault

On the first fault of a named part the guard warns once (``RuntimeWarning`` naming the part and the
error), remembers it in ``guard.faults`` and turns that part off: later calls to ``run`` with that
name return ``None`` without calling it. :class:`nanscope.DivergenceError` (how a stop travels)
always passes through.

``fault(name, exc, disable=False)`` warns once but leaves the part on: for parts whose next call is
independent of the failed one (one write of ``diagnosis.json``, one probe).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from nanscope.errors import DivergenceError

__all__ = ["REPORT", "FaultGuard"]

T = TypeVar("T")

REPORT = "Please report this to the nanscope issue tracker, with the warning text."


class FaultGuard:
    """Runs nanscope's own code inside a fit; on an internal bug: warn once, that part off, go on.

    kind: the word the warning uses for a part (``"hook"`` for the torch adapter's hooks,
        ``"check"`` for the Monitor's measures).
    off: the names of the parts turned off; faults: ``{name: "Type: message"}`` of each fault.
    """

    def __init__(self, kind: str = "check") -> None:
        self.kind = kind
        self.off: set[str] = set()
        self.faults: dict[str, str] = {}

    def is_off(self, name: str) -> bool:
        return name in self.off

    def run(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)``, or None when it faulted (now or before: the part is off)."""
        if name in self.off:
            return None
        try:
            return fn(*args, **kwargs)
        except DivergenceError:
            raise
        except Exception as exc:
            self.fault(name, exc, stacklevel=4)
            return None

    def fault(
        self, name: str, exc: BaseException, *, disable: bool = True, stacklevel: int = 3
    ) -> None:
        """Record a fault of part ``name``: one warning per part; ``disable`` turns the part off."""
        if disable:
            self.off.add(name)
        if name in self.faults:
            return
        self.faults[name] = f"{type(exc).__name__}: {exc}"
        now = f"that {self.kind} is now off and your" if disable else "your"
        warnings.warn(
            f"nanscope: internal error in its {name} {self.kind} ({type(exc).__name__}: {exc}); "
            f"{now} training goes on. {REPORT}",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
