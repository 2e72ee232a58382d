"""Every scan check has a fixture file ``fixtures/S###.csv`` (written by ``fixtures/make.py``) that
its check flags and no other check does."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from nanscope.data import scan
from nanscope.data.checks import CHECKS

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


def _load_maker() -> ModuleType:
    name = "_nanscope_scan_fixtures_make"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES_DIR / "make.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


make = _load_maker()


def test_every_check_has_one_fixture() -> None:
    assert list(make.FIXTURES) == [check.CODE for check in CHECKS]
    assert sorted(p.stem for p in FIXTURES_DIR.glob("S*.csv")) == list(make.FIXTURES)


@pytest.mark.parametrize("code", list(make.FIXTURES))
def test_committed_fixture_is_what_make_writes(code: str) -> None:
    fx = make.FIXTURES[code]
    assert fx.path().read_text() == make.csv_text(fx), "rerun: python tests/data/fixtures/make.py"


@pytest.mark.parametrize("code", list(make.FIXTURES))
def test_fixture_is_flagged_by_its_check_only(code: str) -> None:
    fx = make.FIXTURES[code]
    report = scan(fx.path(), target="y", **fx.options)
    assert {f.code for f in report.findings} == {code}, report.findings
    if fx.rows:
        assert [f.rows for f in report.findings] == [fx.rows]
    assert report.exit_code == (0 if all(f.severity == "info" for f in report.findings) else 1)


def test_the_healthy_base_is_clean(tmp_path: Path) -> None:
    fx = make.Fixture("S000", lambda cols: None)
    path = tmp_path / "healthy.csv"
    path.write_text(make.csv_text(fx))
    assert scan(path, target="y").findings == []
