"""Text nanscope prints about a user's files: made safe to echo, and warnings as one line.

- :func:`clean`: text echoed from a user's file (a column name, a line of a log, an error message
  that quotes bytes) with control and escape characters removed and its length bounded, so a
  binary file never paints the terminal.
- :func:`warn`: a nanscope warning (:class:`NanscopeWarning`), which
  :func:`install_warning_format` prints as one ``nanscope: warning: ...`` line on stderr, never as
  ``path:line: UserWarning`` with a source line.

Library code (readers, scan, lint) uses these; the command line installs the format.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import TextIO

__all__ = [
    "NanscopeWarning",
    "clean",
    "hold_warnings",
    "install_warning_format",
    "quiet",
    "release_warnings",
    "set_quiet",
    "status",
    "warn",
]

#: ANSI escape sequences (CSI, OSC, and two-byte ESC forms), then every other control character
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufffd]")


def clean(text: object, limit: int = 300) -> str:
    """``text`` safe to print on one line: escapes and control characters dropped, newlines and
    tabs as spaces, at most ``limit`` characters (the cut marked with ``...``)."""
    out = _ESCAPES.sub("", str(text))
    out = out.replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\t", " ")
    out = _CONTROLS.sub("", out)
    if len(out) > limit:
        out = out[: max(0, limit - 3)].rstrip() + "..."
    return out


class NanscopeWarning(UserWarning):
    """A warning from nanscope itself (printed as one ``nanscope: warning:`` line)."""


def warn(message: str) -> None:
    """Warn the user once on stderr as ``nanscope: warning: message`` (via :mod:`warnings`, so
    ``-W error`` and ``pytest.warns`` see it)."""
    warnings.warn(clean(_strip_prefix(message), limit=2000), NanscopeWarning, stacklevel=2)


def _strip_prefix(message: str) -> str:
    text = str(message)
    for prefix in ("nanscope: warning: ", "nanscope: "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


_PACKAGE = str(Path(__file__).resolve().parent)


def _is_ours(message: Warning | str, category: type[Warning], filename: str) -> bool:
    if issubclass(category, NanscopeWarning):
        return True
    if category.__module__.startswith("nanscope"):
        return True
    try:
        inside = str(Path(filename).resolve()).startswith(_PACKAGE)
    except (OSError, ValueError):
        inside = False
    return inside or str(message).startswith("nanscope")


#: ``-q``: status and progress lines are not printed (results, warnings and errors still are)
_QUIET = False


def set_quiet(value: bool) -> None:
    """``-q`` given (or not) to the command that runs now."""
    global _QUIET
    _QUIET = bool(value)


def quiet() -> bool:
    """Whether ``-q`` silenced status and progress lines."""
    return _QUIET


def status(text: str) -> None:
    """A status or progress line on stderr (``nanscope run``'s memory line, a rollback, a
    sweep's factor done), unless ``-q``; stderr, so ``nanscope X > out.txt`` keeps the result."""
    if not _QUIET:
        print(text, file=sys.stderr, flush=True)


#: the formatters installed (so installing twice wraps nothing twice)
_INSTALLED: list[object] = []
#: warnings held back while a quick command runs (see :func:`hold_warnings`)
_HELD: list[str] | None = None


def hold_warnings() -> None:
    """Keep nanscope's warnings until :func:`release_warnings`: a command that ends in an error
    then says it in one line (the warning as its reason), one that succeeds prints them."""
    global _HELD
    _HELD = []


def release_warnings(*, show: bool = True) -> list[str]:
    """Stop holding; print the held warnings (``show``) and return their texts."""
    global _HELD
    held, _HELD = _HELD or [], None
    if show:
        for text in held:
            _emit(text, sys.stderr)
    return held


def _emit(text: str, stream: TextIO) -> None:
    try:
        stream.write(f"nanscope: warning: {text}\n")
        stream.flush()
    except (OSError, ValueError):
        pass


def install_warning_format() -> None:
    """Print nanscope's own warnings as one ``nanscope: warning: ...`` line on stderr; every other
    warning (the user's script's, a library's) keeps Python's usual format."""
    original = warnings.showwarning
    if original in _INSTALLED:
        return

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not _is_ours(message, category, filename):
            original(message, category, filename, lineno, file, line)
            return
        text = clean(_strip_prefix(str(message)), 2000)
        if _HELD is not None and file is None:
            _HELD.append(text)
            return
        _emit(text, file or sys.stderr)

    _INSTALLED.append(show)
    warnings.showwarning = show


