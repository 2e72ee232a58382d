"""Every command in ``nanscope.commands.<name>``, one writer for its results, one table of the
options that take a value (the parser's own)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from nanscope.cli import COMMANDS, main
from nanscope.commands import run, sweep
from nanscope.commands.base import write_output
from nanscope.errors import UsageError


def test_every_command_is_main_of_its_own_module_under_commands() -> None:
    for name in COMMANDS:
        module = importlib.import_module(f"nanscope.commands.{name}")
        assert callable(module.main), name


def test_run_splits_its_options_from_the_script_as_its_parser_reads_them() -> None:
    valued = run.parser().valued_options()
    assert {"--json", "--html", "--policy", "--data", "--run-dir"} <= valued
    assert not valued & {"-q", "--quiet", "--experiment", "--no-color"}
    argv = ["--policy", "warn", "-q", "train.py", "--json", "x"]
    assert run.split_options(argv, valued) == (["--policy", "warn", "-q"],
                                               ["train.py", "--json", "x"])  # fmt: skip
    assert run.split_options(["--json", "d.json", "--", "python", "t.py"], valued) == (
        ["--json", "d.json"], ["python", "t.py"],
    )  # fmt: skip
    assert {"--factors", "--updates", "--jobs", "--seed", "--timeout", "--json"} <= (
        sweep.parser().valued_options()
    )


def test_a_result_goes_to_stdout_or_to_a_file_in_a_folder_made_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_output('{"a": 1}\n', "-")
    assert capsys.readouterr().out == '{"a": 1}\n'
    target = tmp_path / "new" / "folder" / "out.json"
    write_output('{"a": 1}\n', str(target))
    assert json.loads(target.read_text(encoding="utf-8")) == {"a": 1}
    with pytest.raises(UsageError, match=r"^cannot write --json .*: Is a directory"):
        write_output("{}", str(tmp_path))


def test_history_json_goes_into_a_folder_that_does_not_exist_yet(tmp_path: Path) -> None:
    out = tmp_path / "reports" / "history.json"
    code = main(["history", "--ledger", str(tmp_path / "none.db"), "--json", str(out)])
    assert code == 0
    assert json.loads(out.read_text(encoding="utf-8")) == {
        "ledger": str(tmp_path / "none.db"), "runs": [],
    }  # fmt: skip
