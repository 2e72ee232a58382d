"""Loader for the fault zoo: every case is one module with ``CAUSE`` and ``fit(monitor)``.

A case module lives under ``tests/zoo/<framework>/`` and defines

* ``CAUSE``: the true cause, one label of the DESIGN vocabulary (``nanscope.CAUSES``);
* ``BAD_ROWS`` (optional): dataset rows the diagnosis must name;
* ``DESCRIPTION``: one line on the mechanism;
* ``fit(monitor)``: a real fit that calls ``monitor.update(...)`` once per update, after the loss
  and gradient are computed and before the step is applied.

Modules are loaded by file path under a private name, so the folder names (``numpy``, ``torch``)
never shadow the real packages. Files whose name starts with ``_`` are helpers, not cases; a file
without a top-level ``def fit(`` is a script for another runner and is never imported here (the
torch cases train at import time).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ZOO = Path(__file__).resolve().parent
FRAMEWORKS = ("numpy", "torch")

__all__ = ["FRAMEWORKS", "MARGIN", "ZOO", "Case", "Outcome", "load_cases", "margin", "run_case"]

#: a decided case clears the engine's thresholds by this much: the top finding's confidence
#: against the best other cause, a suspect verdict against the suspect threshold, and a healthy
#: run's strongest finding against it, so float rounding on another machine cannot flip it
MARGIN = 0.1
#: the engine's threshold for calling a finite run suspect (nanscope.diagnose.engine.SUSPECT)
SUSPECT = 0.6


def margin(d: dict[str, Any]) -> float:
    """How far a diagnosis (its ``to_dict()``) sits from flipping to another answer."""
    others = [a["confidence"] for a in d.get("alternatives") or [] if a["cause"] != d["cause"]]
    if d["cause"] == "healthy":
        return SUSPECT - max(others, default=0.0)
    gap = float(d["confidence"]) - max(others, default=0.0)
    if d["verdict"] == "suspect":
        gap = min(gap, float(d["confidence"]) - SUSPECT)
    return gap


@dataclass(frozen=True)
class Case:
    """One zoo case: where it lives and what it claims."""

    framework: str
    name: str
    path: Path
    module: ModuleType

    @property
    def id(self) -> str:
        return f"{self.framework}/{self.name}"

    @property
    def cause(self) -> str:
        return str(self.module.CAUSE)

    @property
    def bad_rows(self) -> list[int]:
        return [int(r) for r in getattr(self.module, "BAD_ROWS", [])]

    @property
    def description(self) -> str:
        return str(getattr(self.module, "DESCRIPTION", ""))


@dataclass
class Outcome:
    """What running one case under a Monitor gave."""

    diagnosis: Any
    raised: bool
    monitor: Any
    error: BaseException | None = field(default=None, repr=False)


def _load(framework: str, path: Path) -> ModuleType:
    name = f"_nanscope_zoo_{framework}_{path.stem}"
    cached = sys.modules.get(name)
    if cached is not None:
        return cached
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_cases(frameworks: tuple[str, ...] = ("numpy",)) -> list[Case]:
    """Every case module of the given frameworks that defines ``CAUSE`` and ``fit``, by name."""
    cases: list[Case] = []
    for framework in frameworks:
        folder = ZOO / framework
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_"):
                continue
            if "\ndef fit(" not in path.read_text():
                continue  # a plain script (e.g. a torch case with its own runner): not ours to run
            module = _load(framework, path)
            if hasattr(module, "CAUSE") and callable(getattr(module, "fit", None)):
                cases.append(Case(framework, path.stem, path, module))
    return cases


def run_case(case: Case, run_dir: Path | None = None, policy: str = "raise") -> Outcome:
    """Run ``case.fit`` under a fresh Monitor; the diagnosis comes from the stop or from close()."""
    import nanscope

    if run_dir is None:
        monitor = nanscope.Monitor(policy=policy, write=False, name=case.name)
    else:
        monitor = nanscope.Monitor(policy=policy, run_dir=run_dir, name=case.name)
    try:
        case.module.fit(monitor)
    except nanscope.DivergenceError as exc:
        monitor.close()
        return Outcome(exc.diagnosis, True, monitor, exc)
    return Outcome(monitor.close(), False, monitor)
