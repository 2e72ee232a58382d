"""``nanscope sweep`` on real scripts: one process per factor, the lr patched in the child."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanscope.cli import main
from nanscope.diagnose import Diagnosis
from nanscope.experiment import run_experiment

pytestmark = pytest.mark.slow  # sweeps: the script run once per factor, in subprocesses

SCRIPTS = Path(__file__).parent / "scripts"


def _sweep(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "sweep.json"
    code = main(["sweep", "--no-progress", "--json", str(out), *args])
    return code, (json.loads(out.read_text()) if out.exists() else {})


def test_torch_script_sweep_names_the_factor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    lrs = tmp_path / "lrs.txt"
    monkeypatch.setenv("NANSCOPE_TEST_LR_OUT", str(lrs))
    script = str(SCRIPTS / "torch_linear.py")
    code, data = _sweep(tmp_path, "--factors", "1,0.1", "--updates", "30", "--",
                        "python", script, "0.1")  # fmt: skip
    assert code == 0
    by_factor = {r["factor"]: r for r in data["results"]}
    assert by_factor[1.0]["outcome"] == "diverged"
    assert by_factor[1.0]["at_update"] is not None
    assert by_factor[0.1]["outcome"] == "descended"
    assert by_factor[0.1]["updates"] == 30 and len(by_factor[0.1]["losses"]) == 30
    assert by_factor[0.1]["optimizers"] == ["SGD"]
    assert data["recommended_factor"] == 0.1
    assert data["base_lr"] == pytest.approx(0.1)
    assert data["recommended_lr"] == pytest.approx(0.01)
    # both the default lr and the bias group's own lr were scaled for the step, in each child
    seen = sorted(tuple(map(float, line.split())) for line in lrs.read_text().splitlines())
    assert seen == [pytest.approx((0.1, 0.01, 0.005)), pytest.approx((1.0, 0.1, 0.05))]
    # the same seed: the first loss is identical at every factor
    assert by_factor[1.0]["losses"][0] == by_factor[0.1]["losses"][0]
    printed = capsys.readouterr().out
    assert "use 0.01" in printed


@pytest.mark.parametrize("schedule", ["loop", "lambdalr"])
def test_a_script_that_sets_its_own_lr_every_step_is_swept(
    tmp_path: Path, schedule: str
) -> None:
    """A loop that writes ``param_group["lr"] = get_lr(it)`` before each step (GPT trainers)
    gets the factor on every step; a torch scheduler's lr is cut once, not twice."""
    pytest.importorskip("torch")
    script = str(SCRIPTS / "torch_schedule_loop.py")
    args = ["python", script, "0.1"] + (["lambdalr"] if schedule == "lambdalr" else [])
    code, data = _sweep(tmp_path, "--factors", "1,0.1,0.01", "--updates", "60", "--", *args)
    assert code == 0
    by_factor = {r["factor"]: r for r in data["results"]}
    assert by_factor[1.0]["outcome"] == "diverged"
    # cut once: a tenth descends; cut twice (a hundredth of the schedule) would also descend
    # but more slowly, so the curves of 0.1 and 0.01 must differ
    assert by_factor[0.1]["outcome"] == "descended"
    assert by_factor[0.1]["losses"][30] != by_factor[0.01]["losses"][30]
    assert data["recommended_factor"] == 0.1


def test_numpy_script_takes_the_factor_and_all_target_forms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = SCRIPTS / "numpy_fit.py"
    code, data = _sweep(tmp_path, "--factors", "1,0.1,0.01", "--updates", "40", "--jobs", "2",
                        "--", sys.executable, str(script))  # fmt: skip
    assert code == 0
    outcomes = [r["outcome"] for r in data["results"]]
    assert outcomes == ["diverged", "descended", "descended"]
    assert data["recommended_factor"] == 0.1
    assert data["base_lr"] == pytest.approx(1.0)
    assert data["recommended_lr"] == pytest.approx(0.1)
    # `-- train.py` and `-- python -m module` run the same fit
    monkeypatch.chdir(SCRIPTS)
    code, plain = _sweep(tmp_path, "--factors", "0.1", "--updates", "10", "--", "numpy_fit.py")
    assert code == 0 and plain["results"][0]["outcome"] == "descended"
    code, module = _sweep(tmp_path, "--factors", "0.1", "--updates", "10",
                          "--", "python", "-m", "numpy_fit")  # fmt: skip
    assert code == 0
    assert module["results"][0]["losses"] == plain["results"][0]["losses"]


def test_a_script_that_ends_before_n_updates(tmp_path: Path) -> None:
    code, data = _sweep(tmp_path, "--factors", "0.1", "--updates", "50",
                        "--", "python", str(SCRIPTS / "numpy_fit.py"), "8")  # fmt: skip
    r = data["results"][0]
    assert r["updates"] == 8 and r["complete"] is False
    assert r["outcome"] == "descended" and "ended by itself after 8 updates" in r["note"]
    assert code == 0


def test_no_factor_descends_exits_1(tmp_path: Path) -> None:
    code, data = _sweep(tmp_path, "--factors", "1,0.1", "--updates", "20",
                        "--", "python", str(SCRIPTS / "numpy_fit.py"), "300", "-1")  # fmt: skip
    assert code == 1
    assert data["recommended_factor"] is None and data["every_factor_ascends"] is True


@pytest.mark.parametrize(
    "args",
    [
        ["--factors", "1,abc"],
        ["--factors", "0"],
        ["--factors", "1,-0.1"],
        ["--factors", "nan"],
        ["--factors", ""],
        ["--updates", "0"],
        ["--updates", "-3"],
        ["--updates", "ten"],
        ["--jobs", "0"],
    ],
)
def test_bad_options_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sweep", *args, "--", "python", str(SCRIPTS / "numpy_fit.py")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("nanscope sweep: error:") and "Traceback" not in err


def test_missing_or_absent_script_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep"]) == 2
    assert "no script given" in capsys.readouterr().err
    assert main(["sweep", "--", "python", "no/such/train.py"]) == 2
    assert "script not found" in capsys.readouterr().err


def test_script_without_optimizer_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sweep", "--no-progress", "--factors", "1,0.1", "--",
                 "python", str(SCRIPTS / "no_optimizer.py")])  # fmt: skip
    assert code == 2
    assert "no optimizer step seen: is this a training script?" in capsys.readouterr().err


def test_script_that_crashes_first_and_one_that_ignores_the_factor_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["sweep", "--no-progress", "--factors", "1", "--",
                 "python", str(SCRIPTS / "crash.py")])  # fmt: skip
    assert code == 2
    assert "the data file is missing" in capsys.readouterr().err
    code = main(["sweep", "--no-progress", "--factors", "1,0.1", "--updates", "5", "--",
                 "python", str(SCRIPTS / "no_factor.py")])  # fmt: skip
    assert code == 2
    assert "lr_factor()" in capsys.readouterr().err


def test_run_experiment_after_a_step_size_diagnosis() -> None:
    diagnosis = Diagnosis(verdict="diverging", cause="step_size_too_large", confidence=0.9, step=6)
    argv = ["python", str(SCRIPTS / "numpy_fit.py")]
    experiment = run_experiment(diagnosis, argv, updates=30, progress=False)
    assert experiment is not None
    assert experiment["factors"] == [1.0, 0.1, 0.01]
    assert experiment["recommended_factor"] == 0.1
    assert experiment["recommended_lr"] == pytest.approx(0.1)
    assert experiment["sign_error_confirmed"] is False
    assert experiment["text"].startswith("lr 1.0 diverged at update ")
    assert experiment["text"].endswith("; 0.1 descended; 0.01 descended; use 0.1")
    json.dumps(experiment, allow_nan=False)
    # causes a learning-rate sweep does not decide: no experiment at all
    healthy = Diagnosis(verdict="healthy", cause="healthy", confidence=1.0)
    assert run_experiment(healthy, argv) is None
    assert run_experiment({"cause": "nonfinite_input", "step": 1}, argv) is None


def test_run_experiment_confirms_a_sign_error_and_survives_a_broken_script() -> None:
    argv = ["python", str(SCRIPTS / "numpy_fit.py"), "300", "-1"]
    experiment = run_experiment({"cause": "update_sign_error", "step": 5}, argv, updates=20,
                                factors=(1.0, 0.1), progress=False)  # fmt: skip
    assert experiment is not None and experiment["sign_error_confirmed"] is True
    assert experiment["recommended_factor"] is None
    assert "sign error is confirmed" in experiment["text"]
    argv = ["python", str(SCRIPTS / "no_optimizer.py")]
    broken = run_experiment({"cause": "step_size_too_large", "step": 5}, argv, progress=False)
    assert broken is not None and "no optimizer step seen" in broken["error"]
    assert broken["recommended_factor"] is None and broken["text"].startswith("the lr sweep")


def test_after_run_experiment_the_advice_is_the_sweeps_result(tmp_path: Path) -> None:
    """The tenfold cut already ran: the advice names the lr that descended, never "cut the lr
    tenfold and rerun" (nor `nanscope sweep`) again."""
    out = tmp_path / "d.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nanscope", "run", "--experiment", "--json", str(out), "--",
         "python", str(SCRIPTS / "numpy_fit.py"), "60"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["cause"] == "step_size_too_large" and d["experiment"]["recommended_lr"] == 0.1
    assert d["actions"][0].startswith("Use lr 0.1 and rerun: the tenfold cut already ran")
    assert not any("nanscope sweep" in a or "Cut the learning rate" in a for a in d["actions"])
    assert "1. Use lr 0.1 and rerun" in proc.stdout
