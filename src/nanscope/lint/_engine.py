"""Lint one source text: parse once, walk once, dispatch the recorded nodes to the rules.

The engine knows nothing about any particular hazard. It parses the module, builds a
:class:`~nanscope.lint.inference.FileContext` (one walk that records the nodes each rule asked for),
hands every recorded node to the rules subscribed to its type, turns their hits into
:class:`~nanscope.lint._types.LintFinding` records (with the place they stand, see
:mod:`nanscope.lint.ranking`) and drops the ones a ``noqa`` comment suppresses
(:mod:`nanscope.lint.noqa`). :func:`lint_paths` parses every file of a run before linting any, so
that a class imported from another file of the run is known (:mod:`nanscope.lint.project`), and
applies the ``[tool.nanscope.lint]`` configuration (:mod:`nanscope.lint.config`) closest to each
file.
"""

from __future__ import annotations

import ast
import gc
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nanscope.errors import InputError
from nanscope.lint._files import PYTHON_SUFFIXES, iter_python_files
from nanscope.lint._types import LintFinding, Rule
from nanscope.lint.config import (
    ConfigFinder,
    LintConfig,
    Selection,
    check_codes,
    split_codes,
)
from nanscope.lint.inference import FileContext
from nanscope.lint.noqa import Suppressions
from nanscope.lint.project import Project
from nanscope.lint.ranking import RANK, place_of
from nanscope.lint.registry import RULES, SYNTAX_ERROR_CODE
from nanscope.lint.scopes import NestingTooDeep

__all__ = [
    "LintReport",
    "lint_file",
    "lint_near",
    "lint_paths",
    "lint_source",
    "read_source",
    "select_rules",
]


def _selection(select: str | Sequence[str] | None, ignore: str | Sequence[str] | None) -> Selection:
    chosen = split_codes(select) or ["ALL"]
    ignored = split_codes(ignore)
    check_codes([*chosen, *ignored], "")
    return Selection(tuple(chosen), tuple(ignored))


def select_rules(
    select: str | Sequence[str] | None = None, ignore: str | Sequence[str] | None = None
) -> list[type[Rule]]:
    """The rule classes left after ``select`` and ``ignore`` (codes or code prefixes, ``ALL``).

    Raises :class:`~nanscope.errors.UsageError` for a code that matches no rule.
    """
    chosen = _selection(select, ignore)
    return [rule for code, rule in RULES.items() if chosen.enabled(code)]


def lint_source(
    source: str,
    path: str = "<string>",
    rules: Iterable[type[Rule]] | None = None,
    check_syntax: bool = True,
    *,
    project: Project | None = None,
    tree: ast.Module | None = None,
) -> list[LintFinding]:
    """Lint Python ``source``; ``path`` is used in the findings and to place them.

    A source that does not parse gives one finding with code ``L000`` (when ``check_syntax``).
    ``project`` holds the other files linted in the same run; ``tree`` is ``source`` already
    parsed.
    """
    rule_classes = list(RULES.values()) if rules is None else list(rules)
    if tree is None:
        parsed = _parse(source, path)
        if isinstance(parsed, LintFinding):
            return [parsed] if check_syntax else []
        tree = parsed
    lines = source.splitlines()
    suppressions = Suppressions(lines)
    if suppressions.file_exempt(SYNTAX_ERROR_CODE) and suppressions.file == frozenset():
        return []
    instances = [cls() for cls in rule_classes if not suppressions.file_exempt(cls.code)]
    by_type: dict[type[ast.AST], list[Rule]] = {}
    for rule in instances:
        for node_type in rule.node_types:
            by_type.setdefault(node_type, []).append(rule)
    if not by_type:
        return []
    limit = sys.getrecursionlimit()
    if limit < 20000:
        sys.setrecursionlimit(20000)
    # the walk allocates many small objects that are never cyclic garbage: pausing the cyclic
    # collector roughly halves the time on a large file
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _lint_tree(tree, source, path, suppressions, by_type, project)
    except NestingTooDeep as exc:
        if not check_syntax:
            return []
        fix = "split the deeply nested expression"
        return [_not_linted(path, f"could not analyse: {exc}", fix)]
    except RecursionError:
        if not check_syntax:
            return []
        return [
            _not_linted(
                path,
                "file is nested too deeply to analyse; the rules did not run on it",
                "split the deeply nested expression",
            )
        ]
    finally:
        sys.setrecursionlimit(limit)
        if gc_was_enabled:
            gc.enable()


def _parse(source: str, path: str) -> ast.Module | LintFinding:
    """The parsed module, or the one ``L000`` finding that says why it is not linted."""
    size = len(source.encode("utf-8", errors="replace"))
    if size > MAX_SOURCE_BYTES:
        return _too_large(path, size)
    try:
        tree = ast.parse(source, filename=path)
    except (RecursionError, MemoryError):
        return _not_linted(
            path,
            "could not parse: nested too deeply for Python's parser; the rules did not run",
            "split the deeply nested expression",
        )
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None) or 1
        col = getattr(exc, "offset", None) or 1
        msg = getattr(exc, "msg", None) or str(exc)
        return LintFinding(
            code=SYNTAX_ERROR_CODE,
            name="syntax-error",
            path=path,
            line=line,
            col=col,
            message=f"file does not parse ({type(exc).__name__}: {msg}); no rule ran on it",
            fix="fix the syntax error so the file can be linted",
        )
    return tree


#: the largest source linted: bigger files (generated code, a data blob saved as .py) get one
#: finding instead of minutes and gigabytes
MAX_SOURCE_BYTES = 1 << 20


def _too_large(path: str, size: int) -> LintFinding:
    return _not_linted(
        path,
        f"file is {size / 2**20:.1f} MiB, over the {MAX_SOURCE_BYTES / 2**20:g} MiB limit; "
        "no rule ran on it",
        "lint the training code itself, not generated code or data saved as .py",
    )


def _not_linted(path: str, message: str, fix: str) -> LintFinding:
    return LintFinding(SYNTAX_ERROR_CODE, "syntax-error", path, 1, 1, message, fix)


def _lint_tree(
    tree: ast.Module,
    source: str,
    path: str,
    suppressions: Suppressions,
    by_type: dict[type[ast.AST], list[Rule]],
    project: Project | None,
) -> list[LintFinding]:
    ctx = FileContext(tree, frozenset(by_type), project=project, path=path)
    ctx.source = source
    findings: dict[tuple[str, int, int], LintFinding] = {}
    for node, site in ctx.sites:
        for rule in by_type[type(node)]:
            for hit in rule.check(node, site, ctx):
                line = getattr(hit.node, "lineno", 1)
                col = getattr(hit.node, "col_offset", 0) + 1
                end_line = getattr(hit.node, "end_lineno", None)
                key = (rule.code, line, col)
                if key in findings or suppressions.suppressed(rule.code, line, end_line or line):
                    continue
                findings[key] = LintFinding(
                    code=rule.code,
                    name=rule.name,
                    path=path,
                    line=line,
                    col=col,
                    message=hit.message,
                    fix=hit.fix or rule.fix,
                    end_line=end_line,
                    end_col=(getattr(hit.node, "end_col_offset", None) or 0) + 1
                    if end_line
                    else None,
                    place=place_of(rule.code, site, ctx),
                    edits=hit.edits,
                )
    return sorted(findings.values(), key=lambda f: (f.line, f.col, f.code))


def read_source(path: Path) -> str:
    """Read a Python file as text: UTF-8 (with BOM), falling back to latin-1."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def lint_file(
    path: str | Path, rules: Iterable[type[Rule]] | None = None, display_path: str | None = None
) -> list[LintFinding]:
    """Lint one file. Raises ``OSError`` when it cannot be read."""
    p = Path(path)
    return lint_source(read_source(p), display_path or str(path), rules)


def lint_near(path: str, line: int, radius: int = 30) -> list[LintFinding]:
    """Findings in ``path`` within ``radius`` lines of ``line``, nearest first.

    Used by the reports when a diagnosis locates the failing op at a source line. A file that
    cannot be read (or is not Python) gives an empty list: the report still renders.
    """
    p = Path(path)
    if not p.is_file():
        return []
    try:
        findings = lint_file(p)
    except OSError:
        return []
    near = [f for f in findings if abs(f.line - line) <= radius and f.code != SYNTAX_ERROR_CODE]
    return sorted(near, key=lambda f: (abs(f.line - line), f.line, f.col))


@dataclass
class LintReport:
    """The result of linting some paths: the findings (those that reach a loss or an update
    first), and which files were looked at."""

    findings: list[LintFinding] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: shown path -> the source that was linted (for ``--fix`` / ``--diff``)
    sources: dict[str, str] = field(default_factory=dict)
    #: shown path -> the file on disk (None for standard input)
    locations: dict[str, Path | None] = field(default_factory=dict)
    #: shown path -> the rules that ran on it
    rules: dict[str, list[type[Rule]]] = field(default_factory=dict)

    @property
    def files_with_findings(self) -> int:
        return len({f.path for f in self.findings})


@dataclass
class _Target:
    shown: str
    location: Path | None
    config: LintConfig
    source: str = ""
    parsed: ast.Module | LintFinding | None = None
    #: the path that picks the per-file ignores (the file, or ``--stdin-filename``)
    named: Path | None = None


@dataclass
class Options:
    """How a run chooses its rules and files beyond the configuration files."""

    select: list[str] | None = None
    extend_select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    #: read no ``pyproject.toml``
    isolated: bool = False
    #: apply ``exclude`` to files named on the command line too
    force_exclude: bool = False

    def check(self) -> None:
        check_codes([*(self.select or []), *self.extend_select, *self.ignore], "")

    def selection(self, config: LintConfig, location: Path | None) -> Selection:
        return config.selection(location, self.select, self.extend_select, self.ignore)


def _rank(finding: LintFinding, order: dict[str, int]) -> tuple[int, int, int, int, str]:
    return (
        RANK.get(finding.place, 2),
        order.get(finding.path, 0),
        finding.line,
        finding.col,
        finding.code,
    )


def lint_paths(
    paths: Sequence[str | Path],
    select: str | Sequence[str] | None = None,
    ignore: str | Sequence[str] | None = None,
    *,
    extend_select: str | Sequence[str] | None = None,
    isolated: bool = False,
    force_exclude: bool = False,
    stdin: tuple[str, str] | None = None,
) -> LintReport:
    """Lint files and directories (walked, honouring ``.gitignore`` and the ``exclude`` of the
    closest ``[tool.nanscope.lint]``; non-Python files skipped).

    ``stdin`` is ``(source, filename)`` for a source read from standard input: it is linted as
    ``filename`` (which places it, picks its configuration and its per-file ignores). Findings
    come ranked: those in a loss or an update first, those in data, metrics or inference code
    last, each group by file and line.

    Raises :class:`~nanscope.errors.UsageError` for an unknown code and
    :class:`~nanscope.errors.InputError` for a path that does not exist.
    """
    options = Options(
        select=split_codes(select) or None,
        extend_select=split_codes(extend_select),
        ignore=split_codes(ignore),
        isolated=isolated,
        force_exclude=force_exclude,
    )
    options.check()
    finder = ConfigFinder()

    def config_for(path: Path) -> LintConfig:
        return LintConfig() if options.isolated else finder.for_path(path)

    report = LintReport()
    targets: list[_Target] = []
    if stdin is not None:
        source, filename = stdin
        location = Path(filename)
        config = config_for(location)
        if not (options.force_exclude and config.excluded(location)):
            targets.append(_Target(filename, None, config, source, named=location))
    for given in paths:
        p = Path(given)
        if p.is_dir():
            root = p.resolve()
            for found in iter_python_files(p):
                config = config_for(found)
                if config.excluded(found):
                    continue
                targets.append(_Target(str(Path(given) / found.relative_to(root)), found, config))
        elif p.is_file():
            config = config_for(p)
            if options.force_exclude and config.excluded(p):
                continue
            if p.suffix in PYTHON_SUFFIXES:
                targets.append(_Target(str(given), p, config))
            else:
                report.skipped.append(str(given))
        else:
            raise InputError(f"{given}: no such file or directory")
    # every parsed tree stays alive until the run ends (a file may ask about another's
    # classes): with the cyclic collector on, each collection would walk all of them again
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _lint_targets(targets, options, report)
    finally:
        if gc_was_enabled:
            gc.enable()


def _lint_targets(targets: list[_Target], options: Options, report: LintReport) -> LintReport:
    project = Project()
    for target in targets:
        if target.location is not None:
            try:
                size = target.location.stat().st_size
                if size > MAX_SOURCE_BYTES:
                    target.parsed = _too_large(target.shown, size)
                    continue
                target.source = read_source(target.location)
            except OSError as exc:
                raise InputError(f"{target.shown}: cannot read ({exc.strerror or exc})") from exc
        target.parsed = _parse(target.source, target.shown)
        if isinstance(target.parsed, ast.Module):
            project.add(target.shown, target.parsed, target.source)
    order = {t.shown: i for i, t in enumerate(targets)}
    for target in targets:
        report.files.append(target.shown)
        report.sources[target.shown] = target.source
        report.locations[target.shown] = target.location
        selection = options.selection(target.config, target.named or target.location)
        parsed = target.parsed
        if isinstance(parsed, LintFinding):
            if selection.enabled(SYNTAX_ERROR_CODE):
                report.findings.append(parsed)
            continue
        rules = [rule for code, rule in RULES.items() if selection.enabled(code)]
        report.rules[target.shown] = rules
        report.findings.extend(
            lint_source(
                target.source,
                target.shown,
                rules,
                check_syntax=selection.enabled(SYNTAX_ERROR_CODE),
                project=project,
                tree=parsed,
            )
        )
    report.findings.sort(key=lambda f: _rank(f, order))
    return report
