"""Finding the Python files under the paths given on the command line, honouring ``.gitignore``.

The matcher implements the common ``.gitignore`` syntax (no dependency): blank lines and ``#``
comments, ``!`` negation, a trailing ``/`` for directories only, a leading or inner ``/`` to anchor
a pattern to the directory of its ``.gitignore``, ``*``, ``?``, ``[...]`` and ``**``. Every
``.gitignore`` from the walked directory up to the repository root applies, plus the ones met on
the way down, each to its own subtree; the last matching pattern wins.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PYTHON_SUFFIXES", "GitIgnore", "iter_python_files", "translate_glob"]

PYTHON_SUFFIXES = (".py", ".pyi")
#: directories never walked into (they are not the user's training code)
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        "node_modules",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "site-packages",
        ".eggs",
    }
)


def translate_glob(glob: str) -> str:
    """A glob (``*``, ``?``, ``[...]``, ``**``) as the body of a regular expression on paths."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            if glob.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
                continue
            if glob.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = glob.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = glob[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = j
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 1
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


class GitIgnore:
    """The patterns of one ``.gitignore`` file, matched against paths relative to its directory."""

    def __init__(self, base: Path, lines: list[str]) -> None:
        self.base = base
        self.patterns: list[_Pattern] = []
        for raw in lines:
            line = raw.rstrip("\n").rstrip("\r")
            if not line.strip() or line.startswith("#"):
                continue
            if not line.endswith("\\ "):
                line = line.rstrip()
            negate = line.startswith("!")
            if negate or line.startswith("\\!") or line.startswith("\\#"):
                line = line[1:]
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            if not line:
                continue
            anchored = "/" in line
            line = line.lstrip("/")
            body = translate_glob(line)
            regex = f"^{body}(?:/.*)?$" if anchored else f"^(?:.*/)?{body}(?:/.*)?$"
            self.patterns.append(_Pattern(re.compile(regex), negate, dir_only))

    @classmethod
    def load(cls, directory: Path) -> GitIgnore | None:
        path = directory / ".gitignore"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        ignore = cls(directory, text.splitlines())
        return ignore if ignore.patterns else None

    def match(self, path: Path, is_dir: bool) -> bool | None:
        """True: ignored, False: re-included by a ``!`` pattern, None: no pattern matched."""
        try:
            rel = path.relative_to(self.base).as_posix()
        except ValueError:
            return None
        result: bool | None = None
        for pattern in self.patterns:
            if pattern.dir_only and not is_dir:
                continue
            if pattern.regex.match(rel):
                result = not pattern.negate
        return result


def _ignored(path: Path, is_dir: bool, ignores: list[GitIgnore]) -> bool:
    verdict = False
    for ignore in ignores:
        got = ignore.match(path, is_dir)
        if got is not None:
            verdict = got
    return verdict


def _ancestor_ignores(directory: Path) -> list[GitIgnore]:
    """The ``.gitignore`` files above ``directory`` up to its repository root (if it is in one)."""
    chain: list[Path] = []
    current = directory.resolve()
    for parent in [current, *current.parents]:
        chain.append(parent)
        if (parent / ".git").exists():
            break
    else:
        chain = [current]
    found = [GitIgnore.load(p) for p in reversed(chain[1:])]
    return [g for g in found if g is not None]


def iter_python_files(directory: Path) -> Iterator[Path]:
    """The Python files under ``directory``, sorted, skipping ignored and tool directories."""
    root = directory.resolve()
    base_ignores = _ancestor_ignores(root)

    def walk(current: Path, ignores: list[GitIgnore]) -> Iterator[Path]:
        own = GitIgnore.load(current)
        if own is not None:
            ignores = [*ignores, own]
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                if entry.name in SKIP_DIRS or entry.name.startswith("."):
                    continue
                if _ignored(path, True, ignores):
                    continue
                yield from walk(path, ignores)
            elif (
                entry.name.endswith(PYTHON_SUFFIXES)
                and entry.is_file()
                and not _ignored(path, False, ignores)
            ):
                yield path

    yield from walk(root, base_ignores)
