"""``nanscope lint`` from the command line: output format, exit codes, JSON, select/ignore, noqa."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nanscope.cli import main as nanscope_main
from nanscope.commands.lint import main
from nanscope.lint import LintFinding, lint_near, lint_paths, lint_source

BAD = (
    "import torch\n"
    "def f(z, w, g, lr):\n"
    "    p = torch.sigmoid(z)\n"
    "    w += lr * g\n"
    "    return torch.log(p)\n"
)


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(BAD)
    return path


def test_clean_file_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.py"
    path.write_text("import torch\nx = torch.log(torch.ones(3))\n")
    assert main([str(path)]) == 0
    assert capsys.readouterr().out.startswith("All checks passed")


def test_findings_exit_one_in_ruff_format(
    bad_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(bad_file)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{bad_file}:4:5: L005 update adds lr * gradient to the weights: " + (
        "gradient ascent"
    )
    assert out[1].startswith("    fix: subtract the step: w -= lr * g")
    assert out[2].startswith(f"{bad_file}:5:12: L001 log of a sigmoid output")
    assert out[3].startswith("    fix: ") and "logsigmoid" in out[3]
    assert out[4].startswith("Found 2 problems in 1 file")


def test_dispatcher_routes_to_lint(bad_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert nanscope_main(["lint", str(bad_file)]) == 1
    assert "L001" in capsys.readouterr().out


def test_json_to_stdout(bad_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(bad_file), "--json", "-"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [d["code"] for d in data] == ["L005", "L001"]
    first = data[0]
    assert {"code", "path", "line", "col", "message", "fix"} <= set(first)
    assert first["line"] == 4 and first["col"] == 5 and first["path"] == str(bad_file)
    assert "w -= lr * g" in first["fix"]


def test_json_to_file_also_prints(
    bad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lint.json"
    assert main([str(bad_file), "--json", str(out)]) == 1
    assert len(json.loads(out.read_text())) == 2
    assert "Found 2 problems" in capsys.readouterr().out


def test_select_and_ignore_with_prefixes(
    bad_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(bad_file), "--select", "L001"]) == 1
    out = capsys.readouterr().out
    assert "L001" in out and "L005" not in out
    assert main([str(bad_file), "--ignore", "L001,L005"]) == 0
    capsys.readouterr()
    assert main([str(bad_file), "--select", "L00", "--ignore", "L005"]) == 1
    out = capsys.readouterr().out
    assert "L001" in out and "L005" not in out


@pytest.mark.parametrize("argv", [["--select", "X9"], ["--ignore", "L999"], ["--bogus"], []])
def test_usage_errors_exit_two(
    bad_file: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["lint", str(bad_file), *argv] if argv else ["lint"]
    assert nanscope_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("nanscope lint: error:") and "Traceback" not in err


def test_missing_path_exits_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert nanscope_main(["lint", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "L001" in capsys.readouterr().out


def test_noqa_blanket_and_per_code() -> None:
    src = (
        "import torch\n"
        "p = torch.sigmoid(z)\n"
        "a = torch.log(p)  # nanscope: noqa\n"
        "b = torch.log(p)  # nanscope: noqa: L001\n"
        "c = torch.log(p)  # nanscope: noqa: L003\n"
        "d = torch.log(p)  # NANSCOPE: NOQA: L002, L001\n"
    )
    assert [f.line for f in lint_source(src)] == [5]


def test_syntax_error_is_a_finding_and_others_still_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "bad.py").write_text(BAD)
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "broken.py:1:7: L000 file does not parse (SyntaxError" in out
    assert "bad.py:5:12: L001" in out
    assert "Found 3 problems in 2 files" in out
    assert main([str(tmp_path), "--ignore", "L000"]) == 1
    assert "L000" not in capsys.readouterr().out


def test_directory_walk_respects_gitignore_and_skips_non_python(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(
        "build/\n*_generated.py\n/top_only.py\n!keep_generated.py\n"
    )
    for rel in [
        "src/train.py",
        "build/out.py",
        "src/x_generated.py",
        "keep_generated.py",
        "top_only.py",
        "src/top_only.py",
        "src/nested/deep.py",
        ".venv/lib.py",
        "notes.txt",
        "data.csv",
        "src/nested/ignored_dir/a.py",
    ]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(BAD if rel.endswith(".py") else "torch.log(p)\n")
    (tmp_path / "src" / "nested" / ".gitignore").write_text("ignored_dir/\n")
    report = lint_paths([tmp_path])
    shown = sorted(Path(f).relative_to(tmp_path).as_posix() for f in report.files)
    assert shown == ["keep_generated.py", "src/nested/deep.py", "src/top_only.py", "src/train.py"]
    assert {Path(f.path).name for f in report.findings} == {
        "keep_generated.py",
        "deep.py",
        "top_only.py",
        "train.py",
    }


def test_explicit_non_python_file_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("torch.log(torch.sigmoid(z))\n")
    assert main([str(notes)]) == 0
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "No Python files found" in captured.out


def test_lint_near_returns_nearby_findings_nearest_first(tmp_path: Path) -> None:
    lines = ["import torch", "p = torch.sigmoid(z)", "a = torch.log(p)"]
    lines += ["x = 1"] * 60
    lines += ["b = torch.log(p)"]
    path = tmp_path / "far.py"
    path.write_text("\n".join(lines) + "\n")
    near = lint_near(str(path), 5, radius=10)
    assert [f.line for f in near] == [3]
    assert all(isinstance(f, LintFinding) for f in near)
    assert [f.line for f in lint_near(str(path), 34, radius=31)] == [64, 3]
    assert [f.line for f in lint_near(str(path), 62, radius=30)] == [64]
    assert lint_near(str(tmp_path / "missing.py"), 1) == []


def test_a_file_over_the_size_limit_is_one_finding_and_is_not_read(tmp_path: Path) -> None:
    from nanscope.lint._engine import MAX_SOURCE_BYTES

    big = tmp_path / "generated.py"
    big.write_text("x = [" + "1, " * (MAX_SOURCE_BYTES // 3 + 10) + "]\n")
    ok = tmp_path / "train.py"
    ok.write_text(BAD)
    report = lint_paths([tmp_path])
    on_big = [f for f in report.findings if f.path.endswith("generated.py")]
    assert [f.code for f in on_big] == ["L000"] and "MiB" in on_big[0].message
    # the other file is still linted in full
    assert {f.code for f in report.findings if f.path.endswith("train.py")} >= {"L001"}
    assert lint_source(big.read_text(), "g.py")[0].code == "L000"
    assert lint_source(big.read_text(), "g.py", check_syntax=False) == []


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("x = " + "1 + " * 30000 + "1\n", "nested too deeply"),  # the parser's own limit
        ("x = " + "-" * 2000 + "1\n", "nested more than"),  # parses, but too deep to walk
    ],
)
def test_deep_nesting_is_one_l000_finding(source: str, needle: str) -> None:
    findings = lint_source("import torch\n" + source, "deep.py")
    assert [f.code for f in findings] == ["L000"] and needle in findings[0].message


def test_ordinary_nesting_is_still_linted() -> None:
    # a long but ordinary chain (a few hundred terms) is real code, not a pathology
    source = "import torch\n" + "s = " + " + ".join(["a"] * 300) + "\n" + BAD.split("\n", 1)[1]
    assert "L001" in {f.code for f in lint_source(source, "ok.py")}
