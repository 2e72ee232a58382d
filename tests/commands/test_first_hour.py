"""A new user's first hour: install without an extra, run, read at 80 columns, recover.

Each test runs ``python -m nanscope`` as a user would, in a folder of its own (the suite's ledger
and run folder, see ``tests/conftest.py``), on real fits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # python -m nanscope processes on real fits

SCRIPTS = Path(__file__).resolve().parents[1] / "experiment" / "scripts"

#: a least-squares fit at a step too long for its features: stopped as step_size_too_large
DIVERGING = textwrap.dedent(
    """
    import numpy as np
    import nanscope

    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 3)) * np.array([1.0, 1.0, 40.0])
    y = X @ np.array([1.0, -2.0, 0.05])
    w = np.zeros(3)
    mon = nanscope.Monitor()
    for step in range(200):
        b = rng.integers(0, len(X), 32)
        r = X[b] @ w - y[b]
        g = 2 * X[b].T @ r / len(b)
        mon.update(float(np.mean(r ** 2)), params={"w": w}, grads={"w": g}, lr=0.01,
                   inputs=X[b], targets=y[b], index=b)
        w = w - 0.01 * g
    """
)

#: three fits side by side, each with its Monitor: one healthy, one diverging, one meeting a NaN
SIDE_BY_SIDE = textwrap.dedent(
    """
    import warnings
    import numpy as np
    import nanscope

    rng = np.random.default_rng(0)
    X = rng.normal(size=(128, 3))
    y = X @ np.array([1.0, -2.0, 0.5])
    X_nan = X.copy()
    X_nan[70, 1] = np.nan
    fits = [("healthy", X, 0.05), ("diverging", X * 30, 0.05), ("nan row", X_nan, 0.05)]
    runs = [(name, data, lr, np.zeros(3), nanscope.Monitor(name=name, policy="warn"))
            for name, data, lr in fits]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(12):
            b = np.arange(step * 10, step * 10 + 10)
            for k, (name, data, lr, w, mon) in enumerate(runs):
                r = data[b] @ w - y[b]
                g = 2 * data[b].T @ r / len(b)
                mon.update(float(np.mean(r ** 2)), params={"w": w}, grads={"w": g}, lr=lr,
                           inputs=data[b], targets=y[b], index=b)
                runs[k] = (name, data, lr, w - lr * g, mon)
    """
)


def _nanscope(*args: str, cwd: Path, env: dict[str, str] | None = None,
              prelude: str = "") -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``python -m nanscope ARGS``; ``prelude`` runs first in the same process (to hide a
    package, as a user who did not install an extra has it)."""
    code = prelude + "\nimport sys\nfrom nanscope.cli import entry\nentry()"
    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    full.pop("NANSCOPE_DEBUG", None)
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


# --- without the extras ----------------------------------------------------------------------

#: a user who ran `pip install nanscope`: none of the extras' packages can be imported
WITHOUT_EXTRAS = """
import sys
from importlib.abc import MetaPathFinder

class _NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "polars", "pyarrow", "matplotlib", "tensorboard",
                                  "lightning", "transformers", "keras", "accelerate"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, _NotInstalled())
"""


def test_without_extras_every_command_works_or_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(DIVERGING)
    (tmp_path / "data.csv").write_text("a,b,y\n1,2,3\n,4,5\n3,1,2\n")
    (tmp_path / "log.csv").write_text("step,loss\n1,0.9\n2,0.7\n3,0.6\n4,0.5\n")
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(b"\x00" * 16)
    runs = tmp_path / "runs"
    cases: list[tuple[tuple[str, ...], set[int], str | None]] = [
        (("run", "--run-dir", str(runs), "--", "python", "train.py"), {3}, None),
        (("diagnose", "log.csv"), {0}, None),
        (("lint", "train.py"), {0, 1}, None),
        (("history",), {0}, None),
        (("runs", "--run-dir", str(runs)), {0}, None),
        (("sweep", "--no-progress", "--updates", "8", "--", "python",
          str(SCRIPTS / "numpy_fit.py")), {0, 1}, None),
        (("demo", "--run-dir", str(tmp_path / "demo")), {0}, None),
        (("scan", "data.csv"), {2}, "nanscope[data]"),
        (("diagnose", "tb"), {2}, "nanscope[logs]"),
    ]  # fmt: skip
    for argv, codes, extra in cases:
        done = _nanscope(*argv, cwd=tmp_path, prelude=WITHOUT_EXTRAS)
        assert done.returncode in codes, (argv, done.returncode, done.stderr[-2000:])
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr, argv
        assert "PyTorch hooks" not in done.stderr, "no word of hooks that were never installed"
        if extra is not None:
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and f"pip install '{extra}'" in lines[0], (argv, lines)
            assert lines[0].startswith(f"nanscope {argv[0]}: error: "), lines[0]
    report = runs / next(p.name for p in runs.iterdir() if p.is_dir())
    done = _nanscope("report", str(report), "--png", str(tmp_path / "png"), cwd=tmp_path,
                     prelude=WITHOUT_EXTRAS)  # fmt: skip
    assert done.returncode == 2 and "nanscope[plots]" in done.stderr


def test_the_python_api_names_the_extra_too(tmp_path: Path) -> None:
    code = WITHOUT_EXTRAS + textwrap.dedent(
        """
        import numpy as np
        import nanscope
        try:
            nanscope.watch
        except nanscope.MissingExtraError as exc:
            print("watch", exc.extra, exc)
        try:
            nanscope.scan(np.zeros((4, 2)))
        except nanscope.MissingExtraError as exc:
            print("scan", exc.extra, exc)
        try:
            from nanscope.integrations.lightning import NanscopeCallback
        except ModuleNotFoundError as exc:
            print("lightning", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("watch torch ") and "needs torch" in lines[0]
    assert "pip install 'nanscope[torch]'" in lines[0]
    assert lines[1].startswith("scan data nanscope.scan needs polars")
    assert "pip install 'nanscope[lightning]'" in lines[2]


# --- 80 columns --------------------------------------------------------------------------------

_SPARK = re.compile(r"^[▁▂▃▄▅▆▇█×✗]+$")


def _words(text: str) -> set[str]:
    """The words of an output, numbers and times alike (digits as 0), curves left out (they
    are drawn to the width)."""
    out = set()
    for word in text.split():
        if not _SPARK.match(word):
            out.add(re.sub(r"\d", "0", word))
    return out


def _fits(narrow: str, wide: str, what: str) -> None:
    long = [line for line in narrow.splitlines() if len(line) > 80]
    assert not long, f"{what}: lines over 80 columns: {long}"
    # a word cut in two leaves pieces that begin or end a word of the whole output
    wide_words = _words(wide)
    pieces = [w for w in _words(narrow) - wide_words
              if any(v.startswith(w) or v.endswith(w) for v in wide_words)]  # fmt: skip
    assert not pieces, f"{what}: words split at 80 columns: {pieces[:10]}"


def test_every_report_fits_80_columns_without_splitting_a_word(tmp_path: Path) -> None:
    pytest.importorskip("polars")
    (tmp_path / "train.py").write_text(DIVERGING)
    rows = ["spend_usd,ctr,position,a_rather_long_column_name,clicked"]
    rows += [f"{100 + 37 * i % 900},{(i % 7) / 100},{i % 8},{(i % 13) / 3},{i % 2}"
             for i in range(300)]  # fmt: skip
    rows[10] = "1000000000,,3,0.5,1"
    (tmp_path / "ads.csv").write_text("\n".join(rows) + "\n")
    commands = [
        ("scan", "ads.csv", "--target", "clicked"),
        ("run", "--", "python", "train.py"),
        ("history",),
        ("sweep", "--no-progress", "--updates", "30", "--", "python",
         str(SCRIPTS / "numpy_fit.py")),
        ("demo", "--run-dir", "demo"),
    ]  # fmt: skip
    own = {"NANSCOPE_LEDGER": str(tmp_path / "ledger.db")}
    for argv in commands:
        narrow = _nanscope(*argv, cwd=tmp_path, env={**own, "COLUMNS": "80"})
        wide = _nanscope(*argv, cwd=tmp_path, env=own)
        assert narrow.stdout.strip() and narrow.returncode == wide.returncode, argv
        _fits(narrow.stdout, wide.stdout, argv[0])
        if argv[0] == "run":  # wrapped with hanging indents: "  1. " continues under its text
            lines = narrow.stdout.splitlines()
            first = next(i for i, ln in enumerate(lines) if ln.startswith("  1. "))
            hang = lines[first + 1]
            assert hang.startswith("     ") and not hang.startswith("      ")


# --- run: several runs, paths, the ledger's line --------------------------------------------


def test_a_script_with_several_runs_names_them_all_worst_first(tmp_path: Path) -> None:
    (tmp_path / "three.py").write_text(SIDE_BY_SIDE)
    out = tmp_path / "d.json"
    done = _nanscope("run", "--json", str(out), "--", "python", "three.py", cwd=tmp_path)
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert [r["name"] for r in runs][-1] == "healthy" and len(runs) == 3
    assert runs[0]["verdict"] == data["verdict"] == "nonfinite"  # the worst is the report's
    assert {r["name"] for r in runs} == {"healthy", "diverging", "nan row"}
    for run in runs:
        saved = json.loads(Path(run["diagnosis"]).read_text())
        assert saved["verdict"] == run["verdict"]
    assert "3 runs in this script, the worst first" in done.stdout
    assert all(re.search(rf"^  {i}\. ", done.stdout, re.M) for i in (1, 2, 3))


def test_the_ledgers_line_is_the_previous_runs_and_q_silences_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(DIVERGING)
    first = _nanscope("run", "--", "python", "train.py", cwd=tmp_path)
    assert first.returncode == 3 and "previous run" not in first.stderr
    again = _nanscope("run", "--", "python", "train.py", cwd=tmp_path)
    line = next(ln for ln in again.stderr.splitlines() if "previous run" in ln)
    assert line.startswith("nanscope: the ledger's previous run of train.py (")
    assert "previous run" not in again.stdout  # apart from this run's result
    quiet = _nanscope("run", "-q", "--", "python", "train.py", cwd=tmp_path)
    assert quiet.returncode == 3 and quiet.stderr == "" and "step_size_too_large" in quiet.stdout


def test_paths_are_checked_first_and_json_is_always_written(tmp_path: Path) -> None:
    (tmp_path / "log.csv").write_text("step,loss\n1,0.9\n2,0.7\n3,nan\n")
    refused = _nanscope("diagnose", "--json", "/proc/x.json", "log.csv", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""  # no report before the error
    assert refused.stderr.count("\n") == 1 and "--json /proc/x.json" in refused.stderr
    out = tmp_path / "d.json"
    missing = _nanscope("run", "--json", str(out), "--", "python", "nope.py", cwd=tmp_path)
    assert missing.returncode == 2 and "nope.py: no such script" in missing.stderr
    data = json.loads(out.read_text())
    assert data["verdict"] == "unobserved" and "nope.py" in data["evidence"][0]["text"]
    (tmp_path / "empty").mkdir()
    folder = _nanscope("run", "--", "python", "empty", cwd=tmp_path)
    assert folder.returncode == 2 and "is a directory with no __main__.py" in folder.stderr
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text("print('app ran')\n")
    app = _nanscope("run", "--", "python", "app", cwd=tmp_path)
    assert app.returncode == 0 and "app ran" in app.stdout


def test_a_syntax_error_reads_as_python_prints_it(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("x = 1\ndef (:\n    pass\n")
    done = _nanscope("run", "--", "python", "bad.py", cwd=tmp_path)
    bare = subprocess.run([sys.executable, "bad.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == bare.returncode == 1
    assert done.stderr.startswith(bare.stderr)  # then nanscope's one line of its own
    assert "nanscope" not in bare.stderr and "Traceback" not in done.stderr


# --- small things ------------------------------------------------------------------------------


def test_diagnose_takes_several_files(tmp_path: Path) -> None:
    (tmp_path / "good.csv").write_text("step,loss\n1,0.9\n2,0.7\n3,0.6\n4,0.5\n")
    (tmp_path / "bad.csv").write_text("step,loss\n1,0.9\n2,0.7\n3,nan\n")
    done = _nanscope("diagnose", "good.csv", "bad.csv", "--json", "all.json", cwd=tmp_path)
    assert done.returncode == 1
    assert "== good.csv" in done.stdout and "== bad.csv" in done.stdout
    items = json.loads((tmp_path / "all.json").read_text())
    assert [(d["file"], d["verdict"]) for d in items] == [("good.csv", "healthy"),
                                                          ("bad.csv", "nonfinite")]
    one_missing = _nanscope("diagnose", "good.csv", "gone.csv", cwd=tmp_path)
    assert one_missing.returncode == 2 and "== good.csv" in one_missing.stdout
    error = "nanscope diagnose: error: gone.csv: no such file or directory"
    assert one_missing.stderr.strip() == error


def test_the_run_folder_ignores_itself_and_runs_can_be_pruned(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(DIVERGING)
    env = {k: v for k, v in os.environ.items() if k != "NANSCOPE_DIR"}  # the default folder
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-m", "nanscope", "run", "-q", "--", "train.py"], cwd=tmp_path,
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 3, done.stderr
    folder = tmp_path / ".nanscope"
    assert (folder / ".gitignore").read_text().splitlines()[-1] == "*"
    runs = sorted((folder / "runs").iterdir())
    assert len(runs) == 3
    (folder / "runs" / "notes").mkdir()  # not a run: never listed, never removed
    old = time.time() - 40 * 86400
    for f in runs[0].iterdir():
        os.utime(f, (old, old))
    root = str(folder / "runs")
    # the newest is the one written last (names from the same second do not sort in time)
    newest = max(runs[1:], key=lambda r: (max(f.stat().st_mtime for f in r.rglob("*")), r.name))
    pruned = _nanscope("runs", "prune", "--older-than", "30d", "--run-dir", root, cwd=tmp_path)
    assert pruned.returncode == 0 and not runs[0].exists() and runs[1].exists()
    kept = _nanscope("runs", "prune", "--keep", "1", "--run-dir", root, cwd=tmp_path)
    assert kept.returncode == 0 and kept.stdout.count("removed ") == 1
    assert sorted(p.name for p in (folder / "runs").iterdir()) == sorted(["notes", newest.name])
    refused = _nanscope("runs", "prune", "--run-dir", root, cwd=tmp_path)
    assert refused.returncode == 2 and "--keep N" in refused.stderr


def test_every_command_has_q_and_bare_nanscope_is_a_usage_error(tmp_path: Path) -> None:
    from nanscope.cli import COMMANDS

    for name in COMMANDS:
        done = _nanscope(name, "--help", cwd=tmp_path)
        assert done.returncode == 0 and "-q, --quiet" in done.stdout, name
        assert "``" not in done.stdout, f"{name} --help shows raw markup"
    bare = _nanscope(cwd=tmp_path)
    assert bare.returncode == 2 and bare.stdout == "" and "usage: nanscope" in bare.stderr


NEVER_STEPS = """\
import torch

torch.manual_seed(0)
X, y = torch.randn(192, 4), torch.randn(192, 1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    for i, start in enumerate(range(0, 192, 64)):   # 3 batches an epoch
        loss = torch.nn.functional.mse_loss(model(X[start:start + 64]), y[start:start + 64])
        (loss / 4).backward()
        if (i + 1) % 4 == 0:                         # never true: i restarts every epoch
            opt.step()
            opt.zero_grad()
print("done")
"""


def test_a_fit_whose_optimizer_never_steps_is_named_not_healthy(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(NEVER_STEPS)
    done = _nanscope("run", "--json", "d.json", "--", "train.py", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "done"  # the script's own exit
    assert "called backward() 9 times but no optimizer ever stepped" in done.stderr
    found = json.loads((tmp_path / "d.json").read_text())
    assert found["verdict"] == "unobserved" and found["cause"] != "healthy"
