"""``[tool.nanscope.lint]`` in ``pyproject.toml``: which rules run on which files.

The table takes the options a ruff user knows::

    [tool.nanscope.lint]
    select = ["L"]                 # codes or prefixes; default: all
    extend-select = []             # added to select
    ignore = ["L008"]
    exclude = ["scripts/legacy", "**/generated_*.py"]
    per-file-ignores = { "tests/**" = ["L003"], "__init__.py" = ["ALL"] }

Each file is linted with the closest ``pyproject.toml`` above it that has the table; its patterns
are relative to that file's directory. A pattern with no ``/`` matches a file or directory name
anywhere below it; one with a ``/`` matches the path from the directory (``*``, ``?``, ``[...]``
and ``**`` as in ``.gitignore``). The command-line ``--select`` replaces ``select``,
``--extend-select`` and ``--ignore`` add to theirs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanscope.errors import InputError, UsageError
from nanscope.lint._files import translate_glob
from nanscope.lint.registry import RULES, SYNTAX_ERROR_CODE

__all__ = [
    "KNOWN_OPTIONS",
    "ConfigFinder",
    "LintConfig",
    "Selection",
    "check_codes",
    "find_config",
    "load_config",
    "split_codes",
]

KNOWN_OPTIONS = ("select", "extend-select", "ignore", "exclude", "per-file-ignores")
_KNOWN_CODES = (SYNTAX_ERROR_CODE, *RULES)


def split_codes(text: str | Sequence[str] | None) -> list[str]:
    """``"L001, l003"`` or ``["L001"]`` -> ``["L001", "L003"]``."""
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip().upper() for item in items if item.strip()]


def check_codes(codes: Iterable[str], where: str) -> None:
    """Raise :class:`UsageError` for a code or prefix that matches no rule."""
    for code in codes:
        if code != "ALL" and not any(k.startswith(code) for k in _KNOWN_CODES):
            raise UsageError(
                f"{where}unknown rule code '{code}' "
                f"(known: {', '.join(_KNOWN_CODES)}; prefixes like L00 work)"
            )


def _matches(code: str, patterns: Iterable[str]) -> bool:
    return any(p == "ALL" or code.startswith(p) for p in patterns)


@dataclass(frozen=True)
class Selection:
    """The codes that run: those a ``select`` pattern matches and no ``ignore`` pattern does."""

    select: tuple[str, ...] = ("ALL",)
    ignore: tuple[str, ...] = ()

    def enabled(self, code: str) -> bool:
        return _matches(code, self.select) and not _matches(code, self.ignore)

    def without(self, codes: Iterable[str]) -> Selection:
        return Selection(self.select, (*self.ignore, *codes))


class _Glob:
    """One ``exclude`` / ``per-file-ignores`` pattern, relative to its config's directory."""

    def __init__(self, pattern: str) -> None:
        text = pattern.strip().rstrip("/")
        self.by_name = "/" not in text
        body = translate_glob(text.lstrip("/").removeprefix("./"))
        self.regex = re.compile(f"^{body}(?:/.*)?$" if not self.by_name else f"^{body}$")

    def match(self, rel: str) -> bool:
        if self.by_name:
            return any(self.regex.match(part) for part in rel.split("/"))
        return bool(self.regex.match(rel))


@dataclass
class LintConfig:
    """One ``[tool.nanscope.lint]`` table (or none: ``path`` is None and everything is default)."""

    path: Path | None = None
    select: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._exclude = [_Glob(p) for p in self.exclude]
        self._per_file = [(_Glob(p), codes) for p, codes in self.per_file_ignores.items()]

    @property
    def root(self) -> Path | None:
        return self.path.parent if self.path is not None else None

    def _relative(self, file: Path) -> str | None:
        if self.root is None:
            return None
        try:
            return file.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return None

    def excluded(self, file: Path) -> bool:
        rel = self._relative(file)
        return rel is not None and any(g.match(rel) for g in self._exclude)

    def selection(
        self,
        file: Path | None,
        select: Sequence[str] | None = None,
        extend_select: Sequence[str] = (),
        ignore: Sequence[str] = (),
    ) -> Selection:
        """The codes that run on ``file``: this table's, then the command line's on top."""
        chosen = list(select) if select else (self.select or ["ALL"])
        chosen += [*self.extend_select, *extend_select]
        ignored = [*self.ignore, *ignore]
        rel = self._relative(file) if file is not None else None
        if rel is not None:
            for glob, codes in self._per_file:
                if glob.match(rel):
                    ignored += codes
        return Selection(tuple(chosen), tuple(ignored))


def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from exc


def _table(data: dict[str, Any]) -> dict[str, Any] | None:
    tool = data.get("tool")
    nanscope = tool.get("nanscope") if isinstance(tool, dict) else None
    table = nanscope.get("lint") if isinstance(nanscope, dict) else None
    return table if isinstance(table, dict) else None


def _codes_option(table: dict[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if isinstance(value, str) or not isinstance(value, list):
        raise UsageError(f'{where}\'{key}\' must be a list of codes, like ["L001", "L00"]')
    codes = split_codes([str(v) for v in value])
    check_codes(codes, where)
    return codes


def load_config(path: Path) -> LintConfig:
    """The ``[tool.nanscope.lint]`` table of one ``pyproject.toml`` (defaults when it has none).

    Raises :class:`UsageError` for an unknown option or code, :class:`InputError` for a file that
    cannot be read or is not TOML.
    """
    table = _table(_load_toml(path))
    if table is None:
        return LintConfig()
    where = f"{path}: [tool.nanscope.lint]: "
    unknown = sorted(set(table) - set(KNOWN_OPTIONS))
    if unknown:
        raise UsageError(
            f"{where}unknown option '{unknown[0]}' (known: {', '.join(KNOWN_OPTIONS)})"
        )
    exclude = table.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise UsageError(f"{where}'exclude' must be a list of patterns")
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise UsageError(f"{where}'per-file-ignores' must be a table of pattern = [codes]")
    per_file_codes = {
        str(pattern): _codes_option({"codes": codes}, "codes", f"{where}per-file-ignores: ")
        for pattern, codes in per_file.items()
    }
    return LintConfig(
        path=path,
        select=_codes_option(table, "select", where),
        extend_select=_codes_option(table, "extend-select", where),
        ignore=_codes_option(table, "ignore", where),
        exclude=list(exclude),
        per_file_ignores=per_file_codes,
    )


class ConfigFinder:
    """The closest ``pyproject.toml`` with a ``[tool.nanscope.lint]`` table above a path, cached
    per directory."""

    def __init__(self) -> None:
        self._by_dir: dict[Path, LintConfig] = {}
        self._loaded: dict[Path, LintConfig] = {}

    def for_path(self, path: Path) -> LintConfig:
        start = path.resolve()
        directory = start if start.is_dir() else start.parent
        visited: list[Path] = []
        found = LintConfig()
        for current in [directory, *directory.parents]:
            cached = self._by_dir.get(current)
            if cached is not None:
                found = cached
                break
            visited.append(current)
            candidate = current / "pyproject.toml"
            if candidate.is_file():
                config = self._loaded.get(candidate)
                if config is None:
                    config = self._loaded[candidate] = load_config(candidate)
                if config.path is not None:
                    found = config
                    break
        for seen in visited:
            self._by_dir[seen] = found
        return found


def find_config(path: Path) -> LintConfig:
    """The configuration that applies to ``path`` (a file or a directory)."""
    return ConfigFinder().for_path(path)
