"""Every command against the inputs people really have: exit 2 with one line, or a right answer.

One sweep over run, diagnose, sweep, scan, lint, report, history and demo. Each case is one
``python -m nanscope`` process in its own folder (its own ledger), all started together on a few
threads so the module stays fast. A case either

- is refused: exit 2, exactly one line on stderr, no ``Traceback``, no control or escape
  character echoed from the input, and nothing lost (the script did not run, no file was
  written or changed); or
- gets a correct result: the right exit code, the result on stdout, and any warning as one
  ``nanscope: warning:`` line on stderr.

Cases marked ``memory`` run under an address-space limit (``resource.setrlimit``), so an input
that makes a command balloon (a 25 MB one-line file, a deeply nested expression) fails here.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanscope.cli import main

pytestmark = pytest.mark.slow  # one python -m nanscope process per case

SRC = str(Path(__file__).resolve().parents[2] / "src")
SCRIPTS = Path(__file__).resolve().parents[1] / "experiment" / "scripts"
#: the address space a bounded case may use (polars and numpy reserve some up front)
MEMORY_LIMIT = 1536 * 2**20
MB25 = 25 * 2**20

FIT = textwrap.dedent(
    """
    import numpy as np
    import nanscope

    print("script ran")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 3))
    y = X @ np.array([1.0, -2.0, 0.5])
    w = np.zeros(3)
    mon = nanscope.Monitor()
    for step in range(40):
        r = X @ w - y
        g = 2 * X.T @ r / len(y)
        mon.update(float(np.mean(r ** 2)), params={"w": w}, grads={"w": g}, lr=0.1)
        w = w - 0.1 * g
    """
)

#: a fit that stops itself with a signal after update 10 (what Ctrl-C or a scheduler's kill does)
KILLED = FIT.replace("import nanscope\n", "import nanscope\nimport os, signal, sys, time\n") + (
    "    if step == 9:\n"
    "        os.kill(os.getpid(), getattr(signal, sys.argv[1]))\n"
    "        time.sleep(2)\n"
)

#: a warm-up schedule: lr rises from 1e-5 to 0.1 over 10 updates, then decays
WARMUP = (
    FIT.replace(
        "    r = X @ w - y\n",
        (
            "    lr = 0.1 * min(1.0, (step + 1e-4) / 10) * 0.99 ** max(0, step - 10)\n"
            "    r = X @ w - y\n"
        ),
    )
    .replace("lr=0.1)", "lr=lr)")
    .replace("0.1 * g", "lr * g")
)
assert "lr * g" in WARMUP and "getattr(signal" in KILLED

BOOM = "def inner():\n    raise ValueError('a bug in the script')\n\ninner()\n"
ESCAPES = b"\x1b[31mRED\x1b[0m\x1b]0;title\x07\x07\x08"


def _savetxt_csv() -> bytes:
    """What np.savetxt writes for a float table with one NaN and one inf: lowercase words."""
    rng = np.random.default_rng(1)
    table = rng.normal(size=(40, 3))
    table[5, 1] = np.nan
    table[9, 2] = np.inf
    import io

    buffer = io.StringIO()
    np.savetxt(buffer, table, delimiter=",", header="a,b,c", comments="")
    return buffer.getvalue().encode()


def _binary_csv() -> bytes:
    """A binary file renamed .csv, with escape codes and no NUL byte (so no cheap 'binary' tell)."""
    rng = np.random.default_rng(2)
    noise = bytes(int(v) for v in rng.integers(1, 256, size=6000))
    return ESCAPES + noise + ESCAPES


def _log_with_bad_byte_row() -> bytes:
    lines = [f"step {i} loss {2.0 / i:.4f}".encode() for i in range(1, 30)]
    lines[12] = b"step 13 loss \xff\xfe0.15"
    return b"\n".join(lines) + b"\n"


@dataclass
class Case:
    id: str
    argv: list[str]
    #: "refused": exit 2 and one line; anything else: the expected exit code
    expect: str | int | tuple[int, ...] = "refused"
    files: dict[str, bytes | str | Callable[[], bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    #: a word the one error line must hold (lower case)
    needle: str | None = None
    memory: bool = False
    #: extra checks on (result, folder)
    check: Callable[[Result, Path], None] | None = None
    #: files that must not exist after the case (nothing written where it was refused)
    absent: tuple[str, ...] = ()
    #: files whose bytes must be unchanged afterwards (nothing lost)
    unchanged: tuple[str, ...] = ()
    #: stdout is a pipe whose reader is gone (``nanscope --help | head -1``)
    head: bool = False
    #: (subfolder, argv) commands run first, in the case's folder (e.g. runs that fill a ledger)
    before: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: commands run after, whose stdout the check reads (``Result.after``)
    after: tuple[tuple[str, ...], ...] = ()


@dataclass
class Result:
    code: int
    out: str
    err: str
    folder: Path
    after: list[str] = field(default_factory=list)


def _limit_memory() -> None:  # pragma: no cover - runs in the child
    _as_from_a_terminal()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _as_from_a_terminal() -> None:  # pragma: no cover - runs in the child
    """Ctrl-C delivered as from a terminal: a suite started in the background (``cmd &``) hands
    its children SIGINT ignored, and their Python would never see one."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run(case: Case, folder: Path) -> Result:
    folder.mkdir(parents=True)
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content() if callable(content) else content
        if isinstance(data, str):
            path.write_text(data)
        else:
            path.write_bytes(data)
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "OMP_NUM_THREADS": "1",
        "NO_COLOR": "1",
        "NANSCOPE_LEDGER": str(folder / "ledger.db"),
        **case.env,
    }
    env.pop("NANSCOPE_DEBUG", None)
    if "NANSCOPE_POLICY" not in case.env:
        env.pop("NANSCOPE_POLICY", None)
    for sub, argv in case.before:
        _nanscope(list(argv), folder / sub, env)
    if case.head:
        # the reader is gone before the first write (`nanscope --help | head -0`)
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = _nanscope(case.argv, folder, env, stdout=write_end)
        finally:
            os.close(write_end)
        return Result(done.returncode, "", done.stderr, folder)
    done = _nanscope(case.argv, folder, env, memory=case.memory)
    after = [_nanscope(list(argv), folder, env).stdout for argv in case.after]
    return Result(done.returncode, done.stdout, done.stderr, folder, after)


def _nanscope(
    argv: list[str], cwd: Path, env: dict[str, str], *, memory: bool = False, stdout: Any = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nanscope", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE if stdout is None else stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory if memory else _as_from_a_terminal,
    )


# --- checks on correct results ---------------------------------------------------------------


def _json(folder: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / name).read_text())
    return data


def _savetxt_nans_found(r: Result, folder: Path) -> None:
    assert "S001" in r.out and "S001" not in r.err, "the report is on stdout"
    report = _json(folder, "scan.json")
    columns = report["columns"]
    assert columns["b"]["n_nan"] == 1 and columns["c"]["n_posinf"] == 1
    codes = {(f["code"], f.get("column")) for f in report["findings"]}
    assert ("S001", "b") in codes and ("S002", "c") in codes
    assert "S011" not in {c for c, _ in codes}, "a column of floats is not text"


def _bad_row_skipped(r: Result, folder: Path) -> None:
    report = _json(folder, "scan.json")
    assert report["n_rows"] == 5, "every other row is still scanned"
    columns = report["columns"]
    assert columns["a"]["n_null"] == 1 and columns["b"]["n_null"] == 0
    assert report["notes"] and "not utf-8" in report["notes"][0].lower()
    warning = [line for line in r.err.splitlines() if "warning" in line]
    assert len(warning) == 1 and warning[0].startswith("nanscope: warning:")
    assert "1 row" in warning[0]


def _one_l000(needle: str) -> Callable[[Result, Path], None]:
    def check(r: Result, folder: Path) -> None:
        findings = [line for line in r.out.splitlines() if ": L" in line]
        assert len(findings) == 1 and "L000" in findings[0] and needle in findings[0], r.out

    return check


def _unobserved_json(r: Result, folder: Path) -> None:
    data = _json(folder, "d.json")
    assert data["verdict"] == "unobserved" and data["verdict"] != "healthy"
    assert data["evidence"] and data["evidence"][0]["text"]


def _program_passthrough(r: Result, folder: Path) -> None:
    _unobserved_json(r, folder)
    assert "not a Python program" in r.err


def _python_c(r: Result, folder: Path) -> None:
    assert r.out.strip() == "42"
    _unobserved_json(r, folder)


def _module_in_ledger(r: Result, folder: Path) -> None:
    runs = json.loads(r.after[0])["runs"]
    assert [run["script"] for run in runs] == ["trainpkg"]
    assert runs[0]["module"] == "trainpkg"


def _user_traceback(r: Result, folder: Path) -> None:
    lines = r.err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert 'boom.py", line 4' in lines[1], "the first frame is the script's own"
    assert "nanscope" not in "\n".join(lines[:-2]).replace(str(folder), "")
    assert "ValueError: a bug in the script" in r.err


def _interrupted(sig: str) -> Callable[[Result, Path], None]:
    def check(r: Result, folder: Path) -> None:
        data = _json(folder, "d.json")
        assert data["verdict"] == "interrupted"
        assert data["step"] == 10
        trace = Path(data["run"]["trace"]).read_text().splitlines()
        events = [json.loads(line) for line in trace if '"event"' in line]
        assert events == [{"event": "interrupted", "signal": sig, "step": 10}]
        assert sum(1 for line in trace if '"loss"' in line) == 10, "every update kept"
        (run,) = json.loads(r.after[0])["runs"]
        assert run["outcome"] == "interrupted" and run["failed_at"] == 10

    return check


def _report_on_stdout(needle: str) -> Callable[[Result, Path], None]:
    def check(r: Result, folder: Path) -> None:
        assert needle in r.out, r.out[-2000:]
        assert needle not in r.err

    return check


def _warmup_peak(r: Result, folder: Path) -> None:
    assert "healthy" in r.out and "healthy" not in r.err, "the report is on stdout"
    (run,) = json.loads(r.after[0])["runs"]
    assert run["lr"] == pytest.approx(0.1), "the peak of the warm-up, not its first lr"


def _two_train_py(r: Result, folder: Path) -> None:
    assert "a/train.py" in r.out and "b/train.py" in r.out
    runs = json.loads(r.after[0])["runs"]
    assert {Path(run["script"]) for run in runs} == {folder / "a/train.py", folder / "b/train.py"}


# --- the cases -------------------------------------------------------------------------------

BIN = bytes(range(256)) * 8
PKG = {"trainpkg/__init__.py": "", "trainpkg/__main__.py": FIT}

CASES = [
    # top level
    Case("help-version", ["--help"], 0, check=lambda r, f: _assert("--version" in r.out)),
    # as a shell reports a reader that went away (SIGPIPE): quietly, no BrokenPipeError
    Case("help-head", ["--help"], 141, head=True),
    Case("lint-head", ["lint", "fit.py"], 141, files={"fit.py": FIT}, head=True),
    Case("unknown-command", ["frobnicate\x1b[2J"], needle="unknown command"),
    # run
    Case("run-no-script", ["run", "--", "python", "missing.py"], needle="no such script"),
    Case(
        "run-data-missing",
        ["run", "--data", "nope.csv", "--", "python", "fit.py"],
        files={"fit.py": FIT},
        needle="--data",
    ),
    Case(
        "run-binary-as-python",
        ["run", "--", "python", "model.bin"],
        files={"model.bin": BIN},
        needle="binary",
    ),
    Case(
        "run-missing-module",
        ["run", "--", "python", "-m", "missing_module_xyz"],
        needle="missing_module_xyz",
    ),
    Case(
        "run-package-without-main",
        ["run", "--", "python", "-m", "pkg"],
        files={"pkg/__init__.py": ""},
        needle="__main__",
    ),
    Case(
        "run-run-dir-is-a-file",
        ["run", "--run-dir", "notes.txt", "--", "python", "fit.py"],
        files={"fit.py": FIT, "notes.txt": "keep me"},
        needle="--run-dir",
        unchanged=("notes.txt",),
    ),
    Case(
        "run-json-is-a-dir",
        ["run", "--json", "out", "--", "python", "fit.py"],
        files={"fit.py": FIT, "out/keep": ""},
        needle="directory",
    ),
    Case(
        "run-json-under-a-file",
        ["run", "--json", "notes.txt/d.json", "--", "python", "fit.py"],
        files={"fit.py": FIT, "notes.txt": "keep me"},
        unchanged=("notes.txt",),
    ),
    Case(
        "run-html-is-a-dir",
        ["run", "--html", ".", "fit.py"],
        files={"fit.py": FIT},
        needle="directory",
    ),
    Case(
        "run-policy-env",
        ["run", "--", "python", "fit.py"],
        files={"fit.py": FIT},
        env={"NANSCOPE_POLICY": "bogus"},
        needle="nanscope_policy",
    ),
    Case(
        "run-policy-option",
        ["run", "--policy", "bogus", "--", "python", "fit.py"],
        files={"fit.py": FIT},
        needle="policy",
    ),
    Case(
        "run-bin-false",
        ["run", "--json", "d.json", "--", "/bin/false"],
        1,
        check=_program_passthrough,
    ),
    Case(
        "run-python-c",
        ["run", "--json", "d.json", "--", "python", "-c", "print(42)"],
        0,
        check=_python_c,
    ),
    Case(
        "run-module-ledger",
        ["run", "--", "python", "-m", "trainpkg"],
        0,
        files=PKG,
        check=_module_in_ledger,
        after=(("history", "--json", "-"),),
    ),
    Case(
        "run-user-traceback",
        ["run", "--", "python", "boom.py"],
        1,
        files={"boom.py": BOOM},
        check=_user_traceback,
    ),
    Case(
        "run-sigint",
        ["run", "--json", "d.json", "--", "python", "killed.py", "SIGINT"],
        130,
        files={"killed.py": KILLED},
        check=_interrupted("SIGINT"),
        after=(("history", "--json", "-"),),
    ),
    Case(
        "run-sigterm",
        ["run", "--json", "d.json", "--", "python", "killed.py", "SIGTERM"],
        143,
        files={"killed.py": KILLED},
        check=_interrupted("SIGTERM"),
        after=(("history", "--json", "-"),),
    ),
    Case(
        "run-warmup-peak-lr",
        ["run", "--", "python", "fit.py"],
        0,
        files={"fit.py": WARMUP},
        check=_warmup_peak,
        after=(("history", "--json", "-"),),
    ),
    Case(
        "run-two-train-py",
        ["history"],
        0,
        files={"a/train.py": FIT, "b/train.py": FIT + "# another script\n"},
        check=_two_train_py,
        before=tuple((d, ("run", "--", "python", "train.py")) for d in ("b", "a")),
        after=(("history", "--json", "-"),),
    ),
    # diagnose
    Case("diagnose-missing", ["diagnose", "nope.log"], needle="no such file"),
    Case("diagnose-empty", ["diagnose", "train.log"], files={"train.log": b""}, needle="empty"),
    Case(
        "diagnose-binary",
        ["diagnose", "train.log"],
        files={"train.log": ESCAPES + b"\x00" * 64 + BIN},
    ),
    Case("diagnose-dir", ["diagnose", "somewhere"], files={"somewhere/x.bin": BIN}),
    Case(
        "diagnose-html-dir",
        ["diagnose", "train.log", "--html", "out"],
        files={"train.log": _log_with_bad_byte_row, "out/keep": ""},
        needle="directory",
    ),
    Case(
        "diagnose-json-under-file",
        ["diagnose", "train.log", "--json", "train.log/x.json"],
        files={"train.log": _log_with_bad_byte_row},
        unchanged=("train.log",),
    ),
    Case("diagnose-bad-option", ["diagnose", "--frobnicate"]),
    Case(
        "diagnose-25mb-one-line",
        ["diagnose", "train.log"],
        files={"train.log": lambda: b"loss: 1.0 " * (MB25 // 10)},
        memory=True,
    ),
    Case(
        "diagnose-report-on-stdout",
        ["diagnose", "train.log"],
        0,
        files={"train.log": _log_with_bad_byte_row},
        check=_report_on_stdout("healthy"),
    ),
    # sweep
    Case(
        "sweep-negative-factors",
        ["sweep", "--factors", "-1,0", "--", "python", "fit.py"],
        files={"fit.py": FIT},
        needle="> 0",
    ),
    Case(
        "sweep-word-factor",
        ["sweep", "--factors", "big", "--", "python", "fit.py"],
        files={"fit.py": FIT},
        needle="not a number",
    ),
    Case(
        "sweep-zero-updates",
        ["sweep", "--updates", "0", "--", "python", "fit.py"],
        files={"fit.py": FIT},
        needle="--updates",
    ),
    Case("sweep-no-script", ["sweep"], needle="no script"),
    Case("sweep-binary", ["sweep", "--", "/bin/false"], needle="not a python script"),
    Case("sweep-missing-module", ["sweep", "--", "python", "-m", "nope_xyz"], needle="nope_xyz"),
    Case(
        "sweep-table-on-stdout",
        ["sweep", "--factors", "1,0.1", "--updates", "10", "--no-progress", "--", "numpy_fit.py"],
        0,
        files={"numpy_fit.py": (SCRIPTS / "numpy_fit.py").read_text()},
        check=_report_on_stdout("lr sweep"),
    ),
    Case(
        "sweep-json-dir",
        ["sweep", "--json", "out", "--", "python", "fit.py"],
        files={"fit.py": FIT, "out/keep": ""},
        needle="directory",
    ),
    # scan
    Case("scan-missing", ["scan", "nope.csv"], needle="no such file"),
    Case("scan-empty", ["scan", "data.csv"], files={"data.csv": b""}, needle="empty"),
    Case(
        "scan-binary-renamed",
        ["scan", "data.csv"],
        files={"data.csv": _binary_csv},
        needle="csv text",
    ),
    Case("scan-nul-binary", ["scan", "data.csv"], files={"data.csv": BIN}, needle="binary"),
    Case(
        "scan-25mb-header",
        ["scan", "data.csv"],
        files={"data.csv": lambda: b"a," * (MB25 // 2)},
        needle="first line",
        memory=True,
    ),
    Case("scan-unknown-type", ["scan", "data.xlsx"], files={"data.xlsx": BIN}, needle="unknown"),
    Case(
        "scan-json-dir",
        ["scan", "data.csv", "--json", "out"],
        files={"data.csv": _savetxt_csv, "out/keep": ""},
        needle="directory",
    ),
    Case(
        "scan-savetxt-nan",
        ["scan", "data.csv", "--json", "scan.json"],
        1,
        files={"data.csv": _savetxt_csv},
        check=_savetxt_nans_found,
        memory=True,
    ),
    Case(
        "scan-invalid-utf8-row",
        ["scan", "data.csv", "--json", "scan.json"],
        1,
        files={"data.csv": b"a,b\n1,2\n3,4\n\xff\xfe,5\n6,7\n8,9\n"},
        check=_bad_row_skipped,
    ),
    # lint
    Case("lint-missing", ["lint", "nope.py"], needle="no such file"),
    Case(
        "lint-nul-bytes",
        ["lint", "model.py"],
        1,
        files={"model.py": b"x = 1\n\x00\x00" + BIN[:64]},
        check=_one_l000("null bytes"),
    ),
    Case("lint-unknown-code", ["lint", "--select", "X999", "."], needle="unknown rule code"),
    Case(
        "lint-json-dir",
        ["lint", "fit.py", "--json", "out"],
        files={"fit.py": FIT, "out/keep": ""},
        needle="directory",
    ),
    Case(
        "lint-25mb-one-line",
        ["lint", "big.py"],
        1,
        files={"big.py": lambda: b"x = [" + b"1," * (MB25 // 2) + b"]\n"},
        check=_one_l000("MiB"),
        memory=True,
    ),
    Case(
        "lint-nested-parser",
        ["lint", "deep.py"],
        1,
        files={"deep.py": "import torch\nx = torch.log(" + "1+" * 20000 + "1)\n"},
        check=_one_l000("nested"),
        memory=True,
    ),
    Case(
        "lint-nested-tree",
        ["lint", "deep.py"],
        1,
        files={"deep.py": "x = " + "-" * 2900 + "1\n"},
        check=_one_l000("nested"),
        memory=True,
    ),
    Case(
        "lint-report-on-stdout",
        ["lint", "fit.py"],
        0,
        files={"fit.py": FIT},
        check=_report_on_stdout("All checks passed"),
    ),
    # report
    Case("report-missing", ["report", "nope"], needle="no such"),
    Case("report-binary", ["report", "train.log"], files={"train.log": b"\x00" * 10 + BIN}),
    Case(
        "report-output-dir",
        ["report", "train.log", "-o", "out"],
        files={"train.log": _log_with_bad_byte_row, "out/keep": ""},
        needle="directory",
    ),
    Case(
        "report-png-is-a-file",
        ["report", "train.log", "--png", "notes.txt"],
        files={"train.log": _log_with_bad_byte_row, "notes.txt": "keep"},
        needle="--png",
        unchanged=("notes.txt",),
        absent=("report.html",),
    ),
    # history
    Case("history-limit", ["history", "--limit", "0"], needle="--limit"),
    Case("history-limit-word", ["history", "--limit", "all"], needle="--limit"),
    Case(
        "history-binary-ledger",
        ["history", "--ledger", "ledger.bin"],
        files={"ledger.bin": ESCAPES + BIN},
        unchanged=("ledger.bin",),
    ),
    Case(
        "history-json-dir", ["history", "--json", "out"], files={"out/keep": ""}, needle="directory"
    ),
    Case("history-on-stdout", ["history"], 0, check=_report_on_stdout("no runs")),
    # demo
    Case(
        "demo-run-dir-file",
        ["demo", "--run-dir", "notes.txt"],
        files={"notes.txt": "keep"},
        needle="--run-dir",
        unchanged=("notes.txt",),
    ),
    Case("demo-bad-option", ["demo", "--frobnicate"]),
    Case(
        "demo-story-on-stdout",
        ["demo", "--run-dir", "runs"],
        0,
        check=_report_on_stdout("step_size_too_large"),
    ),
]


def _assert(condition: bool) -> None:
    assert condition


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    root = tmp_path_factory.mktemp("bad_input")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {case.id: pool.submit(_run, case, root / case.id) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_command_on_bad_input(case: Case, results: dict[str, Result]) -> None:
    result = results[case.id]
    where = f"{case.argv}: exit {result.code}\nstdout: {result.out[-1500:]}"
    where += f"\nstderr: {result.err[-1500:]}"
    if case.id != "run-user-traceback":
        assert "Traceback" not in result.err, where
    assert not _CONTROL.search(result.err), f"control characters echoed: {where}"
    if case.expect == "refused":
        assert result.code == 2, where
        lines = result.err.strip().splitlines()
        assert len(lines) == 1, where
        assert lines[0].startswith("nanscope"), where
        if case.needle:
            assert case.needle in lines[0].lower(), where
        assert "script ran" not in result.out, "refused before the script ran"
    else:
        expected = case.expect if isinstance(case.expect, tuple) else (case.expect,)
        assert result.code in expected, where
        for line in result.err.splitlines():
            assert "UserWarning" not in line and "RuntimeWarning" not in line, where
    for name in case.absent:
        assert not (result.folder / name).exists(), where
    for name in case.unchanged:
        original = case.files[name]
        data = original() if callable(original) else original
        expected = data.encode() if isinstance(data, str) else data
        assert (result.folder / name).read_bytes() == expected, f"{name} changed: {where}"
    if case.check is not None:
        case.check(result, result.folder)


def test_debug_shows_the_traceback_behind_the_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": SRC, "NANSCOPE_DEBUG": "1"}
    (tmp_path / "train.log").write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, "-m", "nanscope", "diagnose", "train.log"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("nanscope diagnose: error:")


# --- fuzzing: random bytes and random nesting never break the one-line promise ----------------

_FUZZ = settings(
    max_examples=int(os.environ.get("NANSCOPE_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
_CSV_BYTES = st.one_of(
    st.binary(min_size=1, max_size=600),
    st.lists(
        st.lists(st.sampled_from(["1", "-2.5", "nan", "inf", "", "x", "\xff", '"a,b"', "1e400"]),
                 min_size=1, max_size=4).map(",".join),
        min_size=1, max_size=12,
    ).map(lambda rows: ("a,b,c\n" + "\n".join(rows) + "\n").encode("utf-8", "surrogateescape")),
)  # fmt: skip


def _one_line_or_result(code: int, err: str) -> None:
    assert code in (0, 1, 2)
    assert "Traceback" not in err
    assert not _CONTROL.search(err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


@_FUZZ
@given(data=_CSV_BYTES)
def test_scan_fuzz(data: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "data.csv"
    path.write_bytes(data)
    code = main(["scan", str(path), "--no-progress", "--no-color"])
    _one_line_or_result(code, capsys.readouterr().err)


_NEST = st.recursive(
    st.sampled_from(["x", "1", "torch.log(p)", "a / b"]),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["-", "not ", "~"]), inner).map("".join),
        st.tuples(inner, st.sampled_from([" + ", " * ", " / ", " ** "]), inner).map("".join),
        inner.map(lambda s: f"f({s})"),
        inner.map(lambda s: f"[{s}]"),
    ),
    max_leaves=60,
)


@_FUZZ
@given(expr=_NEST, depth=st.integers(0, 3000), junk=st.binary(max_size=40))
def test_lint_fuzz(
    expr: str, depth: int, junk: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "train.py"
    path.write_bytes(f"import torch\ny = {'-' * depth}({expr})\n".encode() + junk)
    code = main(["lint", str(path)])
    captured = capsys.readouterr()
    _one_line_or_result(code, captured.err)
    assert code in (0, 1)  # a Python file always gets findings or none, never a usage error
