"""What a ruff user expects of ``nanscope lint``: noqa comments, ``[tool.nanscope.lint]``,
``--exit-zero``, output formats, standard input, statistics, safe fixes, a pre-commit hook and
short lines."""

from __future__ import annotations

import ast
import io
import json
import shutil
import sys
from pathlib import Path

import pytest

from nanscope.cli import main as nanscope_main
from nanscope.commands.lint import main
from nanscope.lint import lint_paths, lint_source
from nanscope.lint.fixes import fix_source

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"

#: a log of a sigmoid (L001, fixable) and a division by a mask sum (L003, not fixable)
TRAIN = (
    "import torch\n"
    "def step(z, loss, mask):\n"
    "    nll = -torch.log(torch.sigmoid(z)).mean()\n"
    "    masked = (loss * mask).sum() / mask.sum()\n"
    "    return nll + masked\n"
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(TRAIN)
    return tmp_path


def codes(text: str, path: str = "t.py") -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in lint_source(text, path)]


# ------------------------------------------------------------------ noqa


def test_noqa_forms_of_ruff_and_nanscope() -> None:
    src = (
        "import torch\n"
        "p = torch.sigmoid(z)\n"
        "a = torch.log(p)  # noqa\n"
        "b = torch.log(p)  # noqa: L001\n"
        "c = torch.log(p)  # noqa: E501\n"
        "d = torch.log(p)  # noqa:E501,L001\n"
        "e = torch.log(p)  # nanscope: noqa: L001\n"
        "f = torch.log(p)\n"
    )
    assert [line for line, _ in codes(src)] == [5, 8]


def test_file_level_noqa_on_a_line_of_its_own() -> None:
    whole = "# nanscope: noqa\n" + TRAIN
    assert codes(whole) == []
    only_l003 = TRAIN.replace("import torch\n", "import torch\n# nanscope: noqa: L003\n")
    assert {c for _, c in codes(only_l003)} == {"L001"}
    # after code it is a line-level comment, not a file-level one
    trailing = TRAIN.replace("mask.sum()\n", "mask.sum()  # nanscope: noqa\n")
    assert {c for _, c in codes(trailing)} == {"L001"}


# ------------------------------------------------------------------ configuration


def test_pyproject_select_ignore_extend_select_found_upwards(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = str(project / "src" / "train.py")
    (project / "pyproject.toml").write_text('[tool.nanscope.lint]\nselect = ["L003"]\n')
    assert main([target]) == 1
    out = capsys.readouterr().out
    assert "L003" in out and "L001" not in out
    (project / "pyproject.toml").write_text(
        '[tool.nanscope.lint]\nselect = ["L003"]\nextend-select = ["L001"]\nignore = ["L003"]\n'
    )
    main([target])
    out = capsys.readouterr().out
    assert "L001" in out and "L003" not in out
    # the command line's --select replaces the file's select
    main([target, "--select", "L003", "--isolated"])
    out = capsys.readouterr().out
    assert "L003" in out and "L001" not in out


def test_pyproject_exclude_and_per_file_ignores(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "scripts").mkdir()
    (project / "scripts" / "old.py").write_text(TRAIN)
    (project / "src" / "data.py").write_text(TRAIN)
    (project / "pyproject.toml").write_text(
        "[tool.nanscope.lint]\n"
        'exclude = ["scripts"]\n'
        '[tool.nanscope.lint.per-file-ignores]\n"src/data.py" = ["L003"]\n'
    )
    report = lint_paths([project])
    found = {(Path(f.path).name, f.code) for f in report.findings}
    assert found == {("train.py", "L001"), ("train.py", "L003"), ("data.py", "L001")}
    assert not any("old.py" in f for f in report.files)
    # a file named on the command line is linted unless --force-exclude (the pre-commit hook)
    old = str(project / "scripts" / "old.py")
    assert main([old]) == 1
    assert main([old, "--force-exclude"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('bogus = ["L001"]', "unknown option 'bogus'"),
        ('select = ["X9"]', "unknown rule code 'X9'"),
        ('select = "L001"', "must be a list"),
        ("select = [", "not valid TOML"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_two(
    project: Path, table: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pyproject.toml").write_text(f"[tool.nanscope.lint]\n{table}\n")
    assert nanscope_main(["lint", str(project / "src")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nanscope lint: error:") and needle in err and err.count("\n") == 1


# ------------------------------------------------------------------ exit codes and formats


def test_exit_zero(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(project), "--exit-zero"]) == 0
    assert "Found 2 problems" in capsys.readouterr().out


def test_text_lines_are_short_and_carry_the_fix_below(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([str(project / "src" / "train.py")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(
        "L001 [*] log of a sigmoid output is -inf once the sigmoid saturates to 0 or 1"
    )
    assert lines[1].startswith("    fix: ")
    assert lines[-1] == "[*] 1 fixable with the --fix option"


def test_every_fixture_finding_fits_in_120_columns() -> None:
    report = lint_paths([FIXTURES])
    assert report.findings
    for finding in report.findings:
        # a path as long as a package's module: src/<package>/<module>.py
        shown = finding.format().replace(finding.path, "src/detection/heads.py")
        assert len(shown) < 120, shown
        assert len(f"    fix: {finding.fix}") < 120, finding.fix


def test_json_github_sarif_grouped_concise(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = str(project / "src" / "train.py")
    main([target, "--output-format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert [d["code"] for d in data] == ["L001", "L003"]
    assert data[0]["fixable"] is True and data[0]["place"] and "edits" not in data[0]

    main([target, "--output-format", "github"])
    github = capsys.readouterr().out.splitlines()
    assert github[0].startswith(f"::error title=nanscope (L001),file={target},line=3,col=12,")
    assert "endLine=3" in github[0] and "::" in github[0][8:]

    main([target, "--output-format", "sarif"])
    sarif = json.loads(capsys.readouterr().out)
    run = sarif["runs"][0]
    assert sarif["version"] == "2.1.0" and run["tool"]["driver"]["name"] == "nanscope"
    result = run["results"][0]
    assert result["ruleId"] == "L001"
    assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == "L001"
    region = result["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (3, 12)

    main([target, "--output-format", "grouped"])
    grouped = capsys.readouterr().out.splitlines()
    assert grouped[0] == f"{target}:"
    assert grouped[1].startswith("  3:12 L001 [*] ") and grouped[2].startswith("      fix: ")

    main([target, "--output-format", "concise"])
    concise = capsys.readouterr().out.splitlines()
    assert concise[0].startswith(f"{target}:3:12: L001 [*]") and not concise[1].startswith(" ")


def test_statistics(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "src" / "more.py").write_text(TRAIN)
    assert main([str(project), "--statistics"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["2\tL001\t[*] log-of-probability", "2\tL003\t[ ] division-without-epsilon"]


# ------------------------------------------------------------------ standard input


def test_stdin_with_filename_and_its_configuration(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(TRAIN))
    assert main(["-"]) == 1
    assert "-:3:12: L001" in capsys.readouterr().out
    (project / "pyproject.toml").write_text(
        '[tool.nanscope.lint.per-file-ignores]\n"src/*.py" = ["L001"]\n'
    )
    name = str(project / "src" / "editor_buffer.py")
    monkeypatch.setattr(sys, "stdin", io.StringIO(TRAIN))
    assert main(["-", "--stdin-filename", name]) == 1
    out = capsys.readouterr().out
    assert f"{name}:4:" in out and "L001" not in out


def test_stdin_filename_without_dash_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert nanscope_main(["lint", "x.py", "--stdin-filename", "y.py"]) == 2
    assert "add '-'" in capsys.readouterr().err


# ------------------------------------------------------------------ fixes


def test_fix_writes_valid_python_and_leaves_what_needs_a_person(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = project / "src" / "train.py"
    assert main([str(target), "--fix"]) == 1
    fixed = target.read_text()
    ast.parse(fixed)
    assert "torch.nn.functional.logsigmoid(z)" in fixed
    out = capsys.readouterr().out
    assert "L001" not in out and "L003" in out and "1 fixed" in out


def test_diff_changes_nothing_and_exits_one(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = project / "src" / "train.py"
    assert main([str(target), "--diff"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"--- {target}\n+++ {target}\n")
    assert "-    nll = -torch.log(torch.sigmoid(z)).mean()" in out
    assert "+    nll = -torch.nn.functional.logsigmoid(z).mean()" in out
    assert target.read_text() == TRAIN
    clean = project / "src" / "clean.py"
    clean.write_text("x = 1\n")
    assert main([str(clean), "--diff"]) == 0


def test_fix_from_stdin_prints_the_fixed_source(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(TRAIN))
    assert main(["-", "--fix"]) == 1
    captured = capsys.readouterr()
    assert "logsigmoid" in captured.out and "L003" in captured.err


def test_fixes_on_every_fixture_parse_and_remove_only_their_findings(tmp_path: Path) -> None:
    total = 0
    for path in sorted(FIXTURES.glob("L*.py")):
        source = path.read_text()
        before = lint_source(source, path.name)
        fixable = [f for f in before if f.fixable]
        fixed, count, after = fix_source(
            source, lambda text, name=path.name: lint_source(text, name)
        )
        ast.parse(fixed)
        assert count == len(fixable), path.name
        assert not any(f.fixable for f in after), path.name
        assert len(after) == len(before) - len(fixable), path.name
        total += count
    assert total >= 10


# ------------------------------------------------------------------ pre-commit


def test_pre_commit_hooks_run_this_command(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    by_id = {h["id"]: h for h in hooks}
    assert by_id["nanscope-lint"]["entry"] == "nanscope lint --force-exclude"
    assert by_id["nanscope-lint"]["language"] == "python"
    assert "python" in by_id["nanscope-lint"]["types_or"]
    assert by_id["nanscope-lint-fix"]["entry"].endswith("--fix")
    # the entry's options exist
    for hook in hooks:
        argv = hook["entry"].split()[2:]
        copy = tmp_path / f"{hook['id']}.py"
        shutil.copy(FIXTURES / "L003.py", copy)
        assert main([*argv, str(copy), "--exit-zero"]) == 0


def test_the_package_fixture_is_linted_across_files(tmp_path: Path) -> None:
    package = tmp_path / "gan"
    shutil.copytree(FIXTURES / "L002_package", package)
    report = lint_paths([package])
    assert [(Path(f.path).name, f.line, f.code) for f in report.findings] == [
        ("train.py", 16, "L002")
    ]
    # alone, train.py cannot know what the model returns
    assert lint_paths([package / "train.py"]).findings == []


# ------------------------------------------------------------------ ranking


def test_hazards_in_a_loss_rank_before_those_in_metrics(tmp_path: Path) -> None:
    (tmp_path / "a_metrics.py").write_text(
        "import torch\n"
        "def evaluate(correct, total):\n"
        "    return correct / total.sum()\n"
    )
    (tmp_path / "b_loss.py").write_text(
        "import torch\n"
        "def masked_loss(loss, mask):\n"
        "    return (loss * mask).sum() / mask.sum()\n"
    )
    report = lint_paths([tmp_path])
    assert [(Path(f.path).name, f.place) for f in report.findings] == [
        ("b_loss.py", "loss"),
        ("a_metrics.py", "metrics"),
    ]
