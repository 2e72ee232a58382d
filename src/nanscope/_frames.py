"""Whose code a frame runs: the user's, nanscope's, or a library's.

The one list of code that is never the user's line: torch, numpy, the trainers (Lightning,
transformers, accelerate), the standard library, and nanscope itself. The adapter's call sites
(``torch/_hooks.py``, ``torch/history.py``), the first-update watch, the replay and numpy's
floating-point errors (``probes/``) and ``nanscope run``'s tracebacks all ask it, so they agree
on where the user's code is.

A package is matched by its folder only inside an installed-packages folder (``site-packages``,
``dist-packages``), so a user's own folder named ``torch`` or ``lightning`` stays theirs.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType
from typing import Literal

__all__ = ["FRAMEWORKS", "PACKAGES", "PATCHES", "Owner", "is_nanscope", "is_user_file", "owner",
           "user_frame"]  # fmt: skip

Owner = Literal["user", "nanscope", "library"]

#: installed packages whose frames are never the user's
PACKAGES = ("torch", "numpy", "lightning", "pytorch_lightning", "lightning_fabric",
            "transformers", "accelerate")  # fmt: skip
_NANSCOPE_DIRS = tuple(
    {os.path.dirname(os.path.abspath(__file__)) + os.sep,
     os.path.realpath(os.path.dirname(os.path.abspath(__file__))) + os.sep}
)  # fmt: skip
#: nanscope's patches of torch (a loss module's call, ``GradScaler.step``): they only call
#: through to the user's code, so their frames count as a library's
PATCHES = os.path.join("nanscope", "torch", "_hooks.py")

#: the frameworks whose folders count wherever they are installed (an editable install too)
FRAMEWORKS = ("torch", "numpy")

_OWNER: dict[str, Owner] = {}
_LIBRARY_DIRS: dict[tuple[bool, ...], tuple[str, ...]] = {}


def _library_dirs() -> tuple[str, ...]:
    """The standard library's folder and the frameworks' (once imported: before, no frame can
    be theirs), as named and resolved."""
    modules = [sys.modules.get(name) for name in FRAMEWORKS]
    key = tuple(m is not None for m in modules)
    dirs = _LIBRARY_DIRS.get(key)
    if dirs is None:
        found = [os.path.dirname(os.__file__)]
        paths = sysconfig.get_paths()
        found += [paths[k] for k in ("stdlib", "platstdlib") if paths.get(k)]
        found += [os.path.dirname(str(m.__file__)) for m in modules
                  if m is not None and getattr(m, "__file__", None)]  # fmt: skip
        named = {os.path.abspath(d) + os.sep for d in found}
        dirs = tuple(named | {os.path.realpath(d) + os.sep for d in found})
        _LIBRARY_DIRS[key] = dirs
    return dirs


def _classify(filename: str) -> Owner:
    if not filename or filename.startswith("<frozen"):
        return "library"  # the interpreter's frozen standard library modules
    if filename.startswith("<"):
        return "user"  # code the user ran from a string (``python -c``, exec, a notebook cell)
    names = (filename, os.path.realpath(filename))
    for name in names:
        if name.startswith(_NANSCOPE_DIRS):
            return "library" if name.endswith(PATCHES) else "nanscope"
    for name in names:
        if "-packages" + os.sep in name:  # an installed package: the ones above, or the user's
            if os.sep + "nanscope" + os.sep in name:
                return "nanscope"
            return "library" if any(os.sep + part + os.sep in name for part in PACKAGES) else "user"
        if name.startswith(_library_dirs()):
            return "library"
    return "user"


def owner(filename: str) -> Owner:
    """``"user"``, ``"nanscope"`` or ``"library"``: who wrote the code of a frame's file."""
    hit = _OWNER.get(filename)
    if hit is None:
        hit = _classify(filename)
        if len(_OWNER) > 4096:
            _OWNER.clear()
        _OWNER[filename] = hit
    return hit


def is_user_file(filename: str) -> bool:
    """A file of the user's code that can be shown and read (not code run from a string)."""
    return not filename.startswith("<") and owner(filename) == "user"


def is_nanscope(filename: str) -> bool:
    """A file of nanscope's own (its patches of torch included)."""
    return owner(filename) == "nanscope" or (
        filename.endswith(PATCHES) and filename.startswith(_NANSCOPE_DIRS)
    )


def user_frame(frame: FrameType | None, limit: int = 64, *,
               through: tuple[str, ...] = ()) -> FrameType | None:  # fmt: skip
    """The innermost frame, from ``frame`` outwards, that runs the user's code.

    Library frames and frames of the files in ``through`` (the caller's own) are walked past; a
    nanscope frame ends the walk with ``None``: what nanscope's own code runs is not the user's.
    """
    for _ in range(limit):
        if frame is None:
            return None
        filename = frame.f_code.co_filename
        if filename not in through:
            kind = owner(filename)
            if kind == "user":
                return frame
            if kind == "nanscope":
                return None
        frame = frame.f_back
    return None
