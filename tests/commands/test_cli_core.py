"""The command line: diagnose, run, demo, exit codes and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nanscope.cli import main

DIVERGING = textwrap.dedent(
    """
    import sys
    import numpy as np
    import nanscope

    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 3)) * np.array([1.0, 1000.0, 1.0])
    y = X @ np.array([1.0, 0.01, -1.0])
    w = np.zeros(3)
    mon = nanscope.Monitor()
    print("argv", sys.argv[1:])
    for step in range(200):
        r = X @ w - y
        g = 2 * X.T @ r / len(y)
        mon.update(np.mean(r ** 2), params={"w": w}, grads={"w": g}, lr=0.5, inputs=X, targets=y)
        w = w - 0.5 * g
    """
)


def _nanscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nanscope.cli", *args], capture_output=True, text=True, cwd=cwd,
        timeout=120,
    )  # fmt: skip


@pytest.mark.slow
def test_run_stops_a_diverging_script_with_exit_3_and_json(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DIVERGING)
    out = tmp_path / "d.json"
    proc = _nanscope("run", "--json", str(out), "--", "python", str(script), "--x", "1",
                     cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "argv ['--x', '1']" in proc.stdout
    data = json.loads(out.read_text())
    assert data["schema"] == "nanscope.diagnosis/1"
    assert data["cause"] == "step_size_too_large" and data["verdict"] == "diverging"
    assert data["contributing"], "the unscaled column should be named"
    assert "step_size_too_large" in proc.stdout  # the report is a result: stdout
    # the trace it left is diagnosable after the fact, with the same cause
    trace = Path(data["run"]["trace"])
    proc2 = _nanscope("diagnose", str(trace), "--json", "-", cwd=tmp_path)
    assert proc2.returncode == 1
    assert json.loads(proc2.stdout)["cause"] == "step_size_too_large"


@pytest.mark.slow
def test_run_passes_the_scripts_exit_code_and_output(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("import sys\nprint('hello from the script')\nsys.exit(5)\n")
    proc = _nanscope("run", "--", str(script), cwd=tmp_path)
    assert proc.returncode == 5
    assert "hello from the script" in proc.stdout


@pytest.mark.slow
def test_run_names_the_error_a_script_stopped_with_before_any_update(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import json\n\n\ndef load():\n    return json.loads('{')\n\n\nload()\n")
    out = tmp_path / "d.json"
    proc = _nanscope("run", "--json", str(out), "--", str(script), cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr  # the script's own traceback is shown
    assert "crashed with JSONDecodeError at train.py:5 before any update" in proc.stdout
    data = json.loads(out.read_text())
    assert (data["verdict"], data["summary"]["updates"]) == ("crashed", 0)
    assert (data["evidence"][0]["data"]["type"], data["evidence"][0]["data"]["line"]) == (
        "JSONDecodeError", 5)
    assert "Fix the error" in data["actions"][0]


@pytest.mark.slow
def test_run_module_form(tmp_path):
    pkg = tmp_path / "trainpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(DIVERGING)
    proc = _nanscope("run", "--", "python", "-m", "trainpkg", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr


@pytest.mark.slow
def test_run_warn_policy_lets_the_script_finish(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DIVERGING + "\nprint('finished')\n")
    proc = _nanscope("run", "--policy", "warn", "--", "python", str(script), cwd=tmp_path)
    assert proc.returncode == 0
    assert "finished" in proc.stdout


@pytest.mark.parametrize(
    ("content", "needle"),
    [(None, "no such file"), (b"", "empty"), (b"\x00\x89PNG\x00\x00", "binary")],
)
def test_diagnose_bad_files_exit_2_with_one_line(tmp_path, capsys, content, needle):
    path = tmp_path / "log.jsonl"
    if content is not None:
        path.write_bytes(content)
    code = main(["diagnose", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and needle in err.lower()


def test_diagnose_csv_with_step_loss_header(tmp_path, capsys):
    # a user's own per-update CSV log of a real fit at a too-large step size
    rng = np.random.default_rng(4)
    X = rng.normal(size=(200, 4))
    y = X @ np.array([0.5, -1.0, 2.0, 0.0])
    w = np.zeros(4)
    rows = ["step,loss,grad_norm,lr"]
    with np.errstate(all="ignore"):
        for step in range(1, 2000):
            r = X @ w - y
            g = 2 * X.T @ r / len(y)
            rows.append(f"{step},{np.mean(r**2)},{np.linalg.norm(g)},1.9")
            if not np.isfinite(np.mean(r**2)):
                break
            w = w - 1.9 * g
    path = tmp_path / "metrics.csv"
    path.write_text("\n".join(rows) + "\n")
    code = main(["diagnose", str(path), "--json", "-"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["verdict"] == "nonfinite"
    assert data["first_nonfinite"]["step"] == len(rows) - 1
    assert data["cause"] == "step_size_too_large"


def test_unknown_command_and_usage(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert main([]) == 2


def test_run_without_a_script_is_a_usage_error(capsys):
    assert main(["run", "--", "python", "missing_script.py"]) == 2
    assert "no such script" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_tells_the_story_and_remembers(tmp_path, monkeypatch):
    monkeypatch.setenv("NANSCOPE_LEDGER", str(tmp_path / "ledger.db"))
    proc = _nanscope("demo", "--no-color", "--run-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # the story is the result: stdout (`nanscope demo > story.txt` keeps it)
    assert "diverging: step_size_too_large" in proc.stdout
    assert "Cut the learning rate tenfold" in proc.stdout
    assert "use 0.1" in proc.stdout  # the tenfold cut decided it
    assert "healthy" in proc.stdout
    again = _nanscope("demo", "--no-color", "--run-dir", str(tmp_path / "runs2"), cwd=tmp_path)
    assert "nanscope remembers" in again.stdout and "lr 0.1 worked" in again.stdout


@pytest.mark.slow
def test_run_links_the_data_scan_to_the_bad_rows(tmp_path):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 3))
    y = X @ np.array([1.0, -1.0, 0.5])
    lines = ["a,b,c,y"] + [",".join(f"{v:.5f}" for v in (*x, t)) for x, t in zip(X, y)]
    lines[1 + 211] = "0.1,,0.3,0.5"  # an empty cell: NaN after parsing
    data = tmp_path / "ads.csv"
    data.write_text("\n".join(lines) + "\n")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(
        f"""
        import numpy as np, nanscope
        table = np.genfromtxt({str(data)!r}, delimiter=",", skip_header=1)
        X, y = table[:, :3], table[:, 3]
        rng = np.random.default_rng(0)
        order = rng.permutation(len(y))
        w = np.zeros(3)
        mon = nanscope.Monitor()
        for start in range(0, len(y), 20):
            idx = order[start:start + 20]
            r = X[idx] @ w - y[idx]
            g = 2 * X[idx].T @ r / len(idx)
            mon.update(np.mean(r ** 2), params={{"w": w}}, grads={{"w": g}}, lr=0.1,
                       inputs=X[idx], targets=y[idx], index=idx)
            w = w - 0.1 * g
        """
    ))  # fmt: skip
    out = tmp_path / "d.json"
    proc = _nanscope("run", "--data", str(data), "--json", str(out), "--", str(script),
                     cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    diagnosis = json.loads(out.read_text())
    assert diagnosis["cause"] == "nonfinite_input"
    assert diagnosis["rows"][0]["dataset_row"] == 211
    scan = diagnosis["scan"]
    assert scan["rows"] == [211]
    assert any(211 in (f.get("rows") or []) for f in scan["findings"])


def test_record_event_writes_through_the_trace_and_the_verdict_reads_it(tmp_path):
    from nanscope.diagnose import diagnose
    from nanscope.trace import read_trace

    rng = np.random.default_rng(2)
    X = rng.normal(size=(50, 3))
    y = X @ np.array([1.0, 2.0, -1.0])
    w = np.zeros(3)
    import nanscope

    mon = nanscope.Monitor(run_dir=tmp_path / "run")
    for _ in range(10):
        r = X @ w - y
        g = 2 * X.T @ r / len(y)
        mon.update(float(np.mean(r**2)), params={"w": w}, grads={"w": g}, lr=0.1)
        w = w - 0.1 * g
    mon.record_event("interrupted", signal="SIGINT", step=10)
    assert mon.events == [{"event": "interrupted", "signal": "SIGINT", "step": 10}]
    assert mon.close().verdict == "interrupted"  # never healthy
    lines = (tmp_path / "run" / "trace.jsonl").read_text().splitlines()
    assert json.loads(lines[-1]) == {"event": "interrupted", "signal": "SIGINT", "step": 10}
    again = read_trace(tmp_path / "run" / "trace.jsonl")
    assert len(again) == 10 and again.meta["events"][0]["signal"] == "SIGINT"
    assert diagnose(again).verdict == "interrupted"
