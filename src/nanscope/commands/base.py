"""What every command shares on its way in and out: one parser, one error line, one warning line.

- :class:`CommandParser`: an ``argparse`` parser whose errors raise :class:`UsageError` (the
  dispatcher prints one line and exits 2) instead of printing the usage and exiting itself.
- :func:`clean`: text echoed from a user's file (a column name, a line of a log, an error message
  that quotes bytes) with control and escape characters removed and its length bounded, so a
  binary file never paints the terminal.
- :func:`warn`: a nanscope warning, printed by :func:`install_warning_format` as one
  ``nanscope: warning: ...`` line on stderr, never as ``path:line: UserWarning`` with a source line.
- :func:`check_writable`: an output path (``--json``, ``--html``, ``-o``) checked before any work
  starts, so a long run never ends in an unwritable path; :func:`write_output` writes there.
- :meth:`CommandParser.valued_options`: which options take a value, read from the parser.

Results go to stdout, progress and warnings to stderr (:func:`say` and :func:`progress`).
This module imports nothing heavy: ``nanscope lint`` pays only for ``argparse``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, TextIO

from nanscope._messages import (
    NanscopeWarning,
    clean,
    install_warning_format,
    set_quiet,
    status,
    warn,
)
from nanscope.errors import UsageError

__all__ = [
    "CommandParser",
    "NanscopeWarning",
    "check_writable",
    "clean",
    "install_warning_format",
    "progress",
    "say",
    "warn",
    "write_output",
]

class CommandParser(argparse.ArgumentParser):
    """``argparse`` whose errors are one :class:`UsageError` line (exit 2 from the dispatcher).

    ``--help`` still prints the help and exits 0 (a ``SystemExit`` the dispatcher passes on).
    Every command has ``-q/--quiet``: no status or progress lines (results, warnings and errors
    are still printed).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument(
            "-q", "--quiet", action="store_true",
            help="no status or progress lines (the result, warnings and errors only)",
        )  # fmt: skip

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{clean(message)} (see '{self.prog} --help')")

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(self._join_values(args), namespace)
        if getattr(parsed, "quiet", False):
            set_quiet(True)
        return parsed, rest

    def valued_options(self) -> frozenset[str]:
        """The options that take a value (``--json PATH``), as this parser defines them: the one
        table of them, so that splitting a command line can never disagree with its parser."""
        return frozenset(s for a in self._actions if a.nargs is None and a.option_strings
                         for s in a.option_strings)  # fmt: skip

    def _join_values(self, args: Any) -> Any:
        """``--factors -1,0`` as ``--factors=-1,0``: a value that starts with ``-`` but is no
        option of ours reaches the option (and its own check) instead of an argparse message."""
        if args is None:
            return None
        args = list(args)
        valued = self.valued_options()
        known = {s for a in self._actions for s in a.option_strings}
        out: list[str] = []
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                out.extend(args[i:])
                break
            nxt = args[i + 1] if i + 1 < len(args) else None
            if (token in valued and nxt is not None and nxt.startswith("-") and nxt != "-"
                    and nxt != "--" and nxt.split("=", 1)[0] not in known):  # fmt: skip
                out.append(f"{token}={nxt}")
                i += 2
                continue
            out.append(token)
            i += 1
        return out


def write_output(text: str, path: str, option: str = "--json") -> None:
    """Write a command's result ``text`` where ``option`` said: ``-`` is stdout, anything else a
    file (its folder made, as :func:`check_writable` promised before the work started). A file
    that cannot be written is a :class:`UsageError` naming the option."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror}") from None


def say(text: str = "", *, file: TextIO | None = None) -> None:
    """A result line: stdout."""
    print(text, file=file or sys.stdout)


def progress(text: str) -> None:
    """A progress or status line: stderr, so ``nanscope X > out.txt`` keeps only the result;
    nothing under ``-q``."""
    status(text)


def check_writable(path: str | os.PathLike[str] | None, option: str = "output") -> None:
    """Raise :class:`UsageError` unless ``path`` can be written: not a directory, its folder
    exists (or can be made) and is writable, the file itself (if it exists) is writable.
    ``None`` and ``"-"`` (stdout) pass."""
    if path is None or str(path) == "-" or str(path) == "":
        return
    target = Path(path)
    where = f"{option} {clean(path)}"
    if target.is_dir():
        raise UsageError(f"cannot write {where}: it is a directory; give a file name")
    if target.exists():
        if not os.access(target, os.W_OK):
            raise UsageError(f"cannot write {where}: permission denied")
        return
    parent = target.parent if str(target.parent) else Path(".")
    existing = _writable_folder_above(parent, f"write {where}")
    _try_create(target, existing, where)


def _writable_folder_above(start: Path, what: str) -> Path:
    """The nearest folder at or above ``start`` that exists; a :class:`UsageError` ("cannot
    ``what``: ...") unless it is a folder this process can write into."""
    existing = start
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"cannot {what}: {clean(existing)} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot {what}: the folder {clean(existing)} is not writable")
    return existing


def _try_create(target: Path, existing: Path, where: str) -> None:
    """Create and remove what the command will write (the file, or the first folder it will
    make): the only sure test, where permissions say yes and the system says no (``/proc``, a
    read-only mount, root)."""
    try:
        if existing == (target.parent if str(target.parent) else Path(".")):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(target)
        else:
            first = target
            while first.parent != existing:
                first = first.parent
            os.mkdir(first)
            os.rmdir(first)
    except FileExistsError:
        return  # made meanwhile by someone else: it can be written to, or the write says why
    except OSError as exc:
        raise UsageError(f"cannot write {where}: {exc.strerror or exc}") from None


def check_folder(path: str | os.PathLike[str] | None, option: str) -> None:
    """Raise :class:`UsageError` unless ``path`` is (or can be made as) a writable folder."""
    if path is None:
        return
    target = Path(path)
    where = f"{option} {clean(path)}"
    existing = _writable_folder_above(target, f"use {where}")
    if existing != target:
        _try_create(target / "probe", existing, where)


def parse_values(argv: list[str], options: tuple[str, ...]) -> dict[str, Any]:
    """The values given to ``options`` in ``argv`` (``--opt V`` and ``--opt=V``), up to ``--``."""
    found: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            break
        name, eq, value = token.partition("=")
        if name in options:
            if eq:
                found[name] = value
            elif i + 1 < len(argv):
                found[name] = argv[i + 1]
                i += 1
        i += 1
    return found
