"""The flow of DESIGN.md, pinned: no module imports upward against it.

capture -> trace -> detectors -> probes -> rules -> diagnosis -> report, with the CLI on top. The
test reads every module of ``src/nanscope`` as an AST (nothing is imported) and collects what it
imports: ``import`` statements at any depth (a lazy import inside a function is still a
dependency), ``importlib.import_module("...")`` calls with a literal name, but not the imports of
an ``if TYPE_CHECKING:`` block (types only). Then each layer's forbidden imports are checked.

A violation that cannot be fixed at once is listed in :data:`KNOWN_VIOLATIONS` with the reason
(the list is empty now); a fixed one must come off it (:func:`test_no_stale_allowance`). Writes
of another module's private state are pinned by ``test_private_state.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from ._source import MODULES, SRC, imports_of, tree_of


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_cli(module: str) -> bool:
    """The command line: the top of the flow, which may import anything."""
    return (
        module in ("nanscope.cli", "nanscope.__main__", "nanscope.rulebook")
        or _under(module, "nanscope.commands")
        or module.endswith(".cli")
    )


_CLI = ("nanscope.cli", "nanscope.__main__", "nanscope.commands")
_FRAMEWORKS = ("torch", "matplotlib", "lightning", "transformers", "keras", "tensorflow", "jax")

#: (who, forbidden imports, why). ``who`` is a module prefix; a forbidden entry is a prefix too,
#: or ``"*.cli"`` for every command-line module.
LAYERS: list[tuple[str, tuple[str, ...], str]] = [
    (
        "nanscope.diagnose",
        ("nanscope.logs", "nanscope.loading", "nanscope.report", "nanscope.torch",
         "nanscope.probes", "nanscope.monitor", "nanscope.lint", "nanscope.data",
         "nanscope.experiment", "nanscope.integrations", "nanscope.ledger", *_CLI, "*.cli",
         *_FRAMEWORKS),
        "the engine, the rules and the diagnosis know no log format, no page, no framework, no CLI",
    ),
    (
        "nanscope.trace",
        ("nanscope.diagnose", "nanscope.detectors", "nanscope.monitor", "nanscope.logs",
         "nanscope.loading", "nanscope.report", "nanscope.torch", "nanscope.probes", *_CLI,
         *_FRAMEWORKS),
        "the trace is the bottom layer: records and their file, nothing else",
    ),
    (
        "nanscope.formatting",
        ("nanscope",),
        "formatting is pure and imports nothing of nanscope",
    ),
    (
        "nanscope.detectors",
        ("nanscope.diagnose", "nanscope.probes", "nanscope.report", "nanscope.logs",
         "nanscope.loading", "nanscope.monitor", "nanscope.torch", *_CLI, *_FRAMEWORKS),
        "detectors decide when to stop from the records alone",
    ),
    (
        "nanscope.capture",
        ("nanscope.diagnose", "nanscope.report", "nanscope.logs", "nanscope.loading",
         "nanscope.monitor", *_CLI),
        "capture turns arrays into records and knows no rule",
    ),
    (
        "nanscope.monitor",
        ("nanscope.diagnose.rules", "nanscope.diagnose.context", "nanscope.report",
         "nanscope.logs", "nanscope.loading", "nanscope.lint", *_CLI, *_FRAMEWORKS),
        "the Monitor runs the engine, never a rule directly, and is framework-free",
    ),
    (
        "nanscope.torch",
        ("nanscope.diagnose.rules", "nanscope.diagnose.engine", "nanscope.diagnose.context",
         "nanscope.report", "nanscope.logs", "nanscope.loading", "nanscope.lint", *_CLI, "*.cli"),
        "the adapter captures; rules know nothing about torch and torch knows no rule",
    ),
    (
        "nanscope.integrations",
        ("nanscope.diagnose.rules", "nanscope.diagnose.engine", "nanscope.diagnose.context",
         "nanscope.report", "nanscope.logs", "nanscope.loading", "nanscope.lint", *_CLI, "*.cli"),
        "the framework adapters are thin: they feed the Monitor",
    ),
    (
        "nanscope.probes",
        ("nanscope.diagnose.rules", "nanscope.diagnose.engine", "nanscope.report",
         "nanscope.logs", "nanscope.loading", *_CLI, "*.cli"),
        "probes gather evidence for the rules and run no rule",
    ),
    (
        "nanscope.logs",
        ("nanscope.diagnose", "nanscope.report", "nanscope.monitor", "nanscope.loading",
         "nanscope.probes", "nanscope.torch", *_CLI, "*.cli"),
        "log readers are capture: they make records and know no rule",
    ),
    (
        "nanscope.report",
        ("nanscope.diagnose.engine", "nanscope.diagnose.rules", "nanscope.diagnose.context",
         "nanscope.logs", "nanscope.lint", "nanscope.data", "nanscope.probes", "nanscope.torch",
         "nanscope.monitor", "torch", *_CLI),
        "the report renders what the diagnosis holds and runs nothing",
    ),
    (
        "nanscope",
        (*_CLI, "*.cli"),
        "the library knows no CLI",
    ),
]

#: (importer, imported, reason) pairs that break a layer today, in files not fixed yet
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()  # none left; private writes: test_private_state.py


def _forbidden(module: str, imported: str, forbidden: tuple[str, ...]) -> bool:
    for entry in forbidden:
        if entry == "*.cli":
            if imported in MODULES and _is_cli(imported):
                return True
        elif _under(imported, entry):
            return True
    return False


def violations() -> set[tuple[str, str, str]]:
    found = set()
    for module in MODULES:
        if _is_cli(module):
            continue
        for who, forbidden, why in LAYERS:
            if not _under(module, who):
                continue
            for imported in imports_of(module):
                if _forbidden(module, imported, forbidden):
                    found.add((module, imported, why))
    return found


def test_the_walker_sees_lazy_imports_and_skips_type_only_ones() -> None:
    # engine.py: diagnose() may import lazily; errors.py imports Diagnosis for types only
    assert "nanscope.diagnose.rules" in imports_of("nanscope.diagnose.engine")
    assert "nanscope.diagnose.diagnosis" not in imports_of("nanscope.errors")
    # a lazy import inside a function counts (the loader reads logs only when asked)
    assert "nanscope.logs" in imports_of("nanscope.loading")
    # and the check itself flags an upward import
    assert _forbidden("nanscope.diagnose.engine", "nanscope.logs", LAYERS[0][1])
    assert _forbidden("nanscope.monitor", "nanscope.commands.run", LAYERS[-1][1])
    assert not _forbidden("nanscope.report.html", "nanscope.diagnose.diagnosis", LAYERS[-2][1])


def test_no_module_imports_against_the_flow() -> None:
    found = violations()
    unexpected = sorted((m, i, why) for m, i, why in found if (m, i) not in KNOWN_VIOLATIONS)
    assert not unexpected, "\n".join(f"{m} imports {i}: {why}" for m, i, why in unexpected)


def test_one_loader_for_paths() -> None:
    # only nanscope.loading turns a path into a trace through the log readers
    readers = {
        m for m in MODULES if "nanscope.logs" in imports_of(m) and not _under(m, "nanscope.logs")
    }
    assert readers == {"nanscope.loading"}, readers


def test_the_page_runs_nothing() -> None:
    html = imports_of("nanscope.report.html")
    assert not {i for i in html if _under(i, "nanscope.lint") or _under(i, "nanscope.loading")}
    assert "nanscope.diagnose" not in html and "nanscope.diagnose.engine" not in html


def test_no_framework_at_module_level_outside_the_adapters() -> None:
    """The core needs only numpy: torch and matplotlib are imported where used, never on import."""
    allowed = ("nanscope.torch", "nanscope.probes", "nanscope.integrations")
    bad = []
    for module in MODULES:
        if any(_under(module, a) for a in allowed):
            continue
        tree = tree_of(module)
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bad.extend(f"{module}: {n}" for n in names if n.split(".")[0] in _FRAMEWORKS)
    assert not bad, bad


@pytest.mark.parametrize(
    ("statement", "absent"),
    [
        ("import nanscope", ("torch", "matplotlib", "nanscope.logs", "nanscope.report",
                             "nanscope.lint", "nanscope.diagnose.rules")),
        ("import nanscope.diagnose.diagnosis", ("nanscope.report", "nanscope.logs",
                                                "nanscope.diagnose.engine")),
        ("import nanscope.report.html", ("nanscope.logs", "nanscope.lint", "matplotlib",
                                         "nanscope.diagnose.engine")),
    ],
)  # fmt: skip
def test_importing_a_layer_loads_nothing_above_it(statement: str, absent: tuple[str, ...]) -> None:
    code = (
        f"{statement}\nimport sys\n"
        f"print(sorted(m for m in sys.modules if m.startswith({absent!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"{statement} loaded {done.stdout.strip()}"


def test_no_stale_allowance() -> None:
    # a fixed violation comes off the list, so it cannot come back unnoticed
    gone = KNOWN_VIOLATIONS - {(m, i) for m, i, _ in violations()}
    assert not gone, f"fixed, remove from KNOWN_VIOLATIONS: {sorted(gone)}"
