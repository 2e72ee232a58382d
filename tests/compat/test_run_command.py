"""``nanscope run`` as a user runs it: a script that ends with its own exception (``crashed``),
``--json -`` as pure JSON, and, in real processes, the interpreter the command names and a script
of the corpus through the import hook (``-- python train.py`` before torch is imported)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from tests.compat._runs import run_both

import nanscope
from nanscope.ledger import Ledger

pytestmark = pytest.mark.slow  # nanscope run in subprocesses

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "NANSCOPE_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1",
           "NANSCOPE_LEDGER": str(tmp_path / "ledger.db"), "PYTHONPATH": str(ROOT / "src")}
    env.pop("PYTHONWARNINGS", None)
    return env


def _start(tmp_path: Path, *command: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(list(command), cwd=cwd or tmp_path, env=_env(tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _wait(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def _nanscope(tmp_path: Path, *args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    return _wait(_start(tmp_path, sys.executable, "-m", "nanscope", *args, cwd=cwd))


CRASHES = """
import math
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        if x.shape[1] != 4:
            raise ValueError(f"expected 4 features, got {{x.shape[1]}}")  # line 14
        return self.fc(x)


torch.manual_seed(0)
X, y = torch.randn(64, 4), torch.randn(64, 1)
X[{nan_row}, 0] = float("nan")
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for i in range(0, 64, 8):
    xb = X[i:i + 8] if i < 40 else X[i:i + 8, :3]  # the pipeline hands a bad batch at update 6
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(xb), y[i:i + 8])
    loss.backward()
    opt.step()
    if {own_check} and not math.isfinite(loss.item()):
        raise RuntimeError("the loss is nan")
    print("update", i // 8 + 1)
"""


def test_a_script_that_ends_with_its_own_exception_is_crashed(tmp_path, zygote) -> None:
    runs = run_both(zygote, tmp_path, "train.py", CRASHES.format(nan_row=63, own_check=False))
    assert runs.codes["run"] == runs.codes["bare"] == 1  # the script's exit code, as python's
    assert runs.out["run"][:5] == runs.out["bare"] == [f"update {i}" for i in range(1, 6)]
    assert "ValueError: expected 4 features, got 3" in runs.err["run"]  # its own traceback
    assert "always_call" not in runs.err["run"]  # (torch's word for a hook that failed there)
    d = runs.diagnosis()
    assert (d["verdict"], d["cause"], d["step"]) == ("crashed", "unknown", 5)
    crash = d["evidence"][0]["data"]
    assert (crash["type"], crash["message"]) == ("ValueError", "expected 4 features, got 3")
    assert (Path(crash["file"]).name, crash["line"], crash["step"]) == ("train.py", 14, 5)
    assert "train.py:14" in d["evidence"][0]["text"]
    assert d["summary"]["updates"] == 5 and d["summary"]["nonfinite_updates"] == 0
    assert "crashed with ValueError at train.py:14 after update 5" in "\n".join(runs.out["run"])
    row = Ledger(tmp_path / "ledger.db").runs()[0]
    assert (row["outcome"], row["verdict"], row["failed_at"]) == ("crashed", "crashed", 5)
    later = nanscope.diagnose(d["run"]["trace"])  # the trace keeps the event: the same verdict
    assert (later.verdict, later.step, later.evidence[0].data["line"]) == ("crashed", 5, 14)


def test_a_failure_found_before_the_scripts_exception_stands(tmp_path, zygote) -> None:
    """Under the warn policy the NaN batch is found and the run goes on; then the script's own
    check raises: the diagnosis is the failure, the crash noted beside it."""
    runs = run_both(zygote, tmp_path, "train.py", CRASHES.format(nan_row=20, own_check=True),
                    options=("--policy", "warn"))  # fmt: skip
    assert runs.codes["run"] == runs.codes["bare"] == 1, runs.err["run"]
    d = runs.diagnosis()
    assert (d["verdict"], d["cause"], d["step"]) == ("nonfinite", "nonfinite_input", 3)
    noted = [e for e in d["evidence"] if e["data"].get("type") == "RuntimeError"]
    assert noted and "the loss is nan" in noted[0]["text"] and noted[0]["data"]["line"] == 30
    assert Ledger(tmp_path / "ledger.db").runs()[0]["outcome"] == "nonfinite_input"


PRINTS = """
import os
import subprocess
import sys

import torch

print("from print")
sys.stdout.flush()
os.write(1, b"from file descriptor 1\\n")
subprocess.run([sys.executable, "-c", "print('from a child process')"], check=True)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.ones(4, 2)).pow(2).mean().backward()
    opt.step()
print("done")
"""


def test_json_to_stdout_is_pure_json_the_scripts_output_on_stderr(tmp_path, zygote) -> None:
    (tmp_path / "run").mkdir()
    code = zygote.run([{
        "mode": "run", "cwd": str(tmp_path / "run"), "timeout": 150,
        "argv": ["run", "--json", "-", "--", "python", "-c", PRINTS],
        "stdout": str(tmp_path / "out.txt"), "stderr": str(tmp_path / "err.txt"),
        "env": {"NANSCOPE_DIR": str(tmp_path / "runs"), "NANSCOPE_NO_LEDGER": "1"},
    }])[0]  # fmt: skip
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert code == 0, err
    assert json.loads(out)["verdict"] == "healthy"  # the whole of stdout is the diagnosis
    for line in ("from print", "from file descriptor 1", "from a child process", "done"):
        assert line in err
    code, out, _ = _nanscope(tmp_path, "run", "--help")
    assert "stdout goes to stderr" in " ".join(out.split())


def _second_venv(tmp_path: Path, *, ours: bool) -> Path:
    """A virtual environment made here (no pip: fast), with a module only it has; ``ours``: our
    environment's packages visible in it (a .pth line), as numpy and torch would be installed."""
    folder = tmp_path / "other-venv"
    try:
        venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(folder)
    except Exception as exc:  # no venv module, or no way to make one here
        pytest.skip(f"a virtual environment cannot be created here ({exc})")
    python = folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)  # fmt: skip
    packages = Path(site.stdout.strip())
    (packages / "only_in_the_second_venv.py").write_text("WHERE = 'second venv'\n")
    if ours:
        import numpy

        (packages / "ours.pth").write_text(str(Path(numpy.__file__).parents[1]) + "\n")
    return python


WHO = """
import sys
import only_in_the_second_venv
import nanscope

print("running in", only_in_the_second_venv.WHERE, sys.prefix)
monitor = nanscope.Monitor()
for step in range(4):
    monitor.update(1.0 / (step + 1), params={"w": [0.5 - 0.1 * step]}, grads={"w": [0.1]})
sys.exit(7)
"""


def test_the_interpreter_the_command_names_is_the_one_that_runs(tmp_path) -> None:
    python = _second_venv(tmp_path, ours=True)
    (tmp_path / "who.py").write_text(WHO)
    code, out, err = _nanscope(tmp_path, "run", "--json", "d.json", "--", str(python), "who.py")
    assert code == 7, err  # the script's own exit code: it ran there, nanscope watching it
    assert f"running in second venv {python.parents[1]}" in out
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["verdict"] == "healthy" and d["summary"]["updates"] == 4
    assert Ledger(tmp_path / "ledger.db").runs()[0]["verdict"] == "healthy"


def test_an_interpreter_that_cannot_run_nanscope_is_refused_before_the_script(tmp_path) -> None:
    python = _second_venv(tmp_path, ours=False)
    (tmp_path / "who.py").write_text("open('ran', 'w')\n")
    code, out, err = _nanscope(tmp_path, "run", "--", str(python), "who.py")
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"nanscope run: error: {python} lacks numpy")
    assert f"{python} -m pip install numpy" in err
    assert not (tmp_path / "ran").exists()
    code, _, err = _nanscope(tmp_path, "run", "--", str(tmp_path / "no" / "python"), "who.py")
    assert code == 2 and "no such interpreter" in err


def test_a_corpus_script_in_real_processes_through_the_import_hook(tmp_path) -> None:
    """The shape of pytorch/examples' word_language_model: hand-made updates, clip, the whole
    model saved each epoch and loaded back with weights_only."""
    name = "manual_update_save"
    runs = {}
    for mode in ("bare", "run"):
        folder = tmp_path / mode
        folder.mkdir()
        shutil.copy(SCRIPTS / f"{name}.py", folder)
        command = [sys.executable, f"{name}.py"]
        if mode == "run":
            command = [sys.executable, "-m", "nanscope", "run", "--json", "d.json", "--",
                       "python", f"{name}.py"]  # fmt: skip
        runs[mode] = _start(tmp_path, *command, cwd=folder)
    (bare_code, bare_out, _), (code, out, err) = _wait(runs["bare"]), _wait(runs["run"])
    assert code == bare_code == 0, err
    assert out.splitlines()[: len(bare_out.splitlines())] == bare_out.splitlines()
    assert (tmp_path / "run" / "model.pt").read_bytes()  # saved under run as bare
    d = json.loads((tmp_path / "run" / "d.json").read_text())
    assert d["verdict"] == "healthy" and "warning" not in err
