"""The compatibility corpus: healthy scripts, each one pattern people use, behave under
``nanscope run`` exactly as they do bare.

Each script in ``scripts/`` runs twice, at once: as ``python script.py`` and as ``python -m
nanscope run --json d.json -- python script.py`` (forks of one process that imported torch once,
see ``_zygote.py``; ``test_run_command.py`` runs scripts as real processes). Both must end with the
same exit code; the script's own stdout lines come first under ``run``, unchanged (the scripts
print their losses, what they saved and loaded, with enough digits that a changed computation
shows); nanscope is never the one that stops it; no warning appears that the bare run does not
print (a hook fault, torch complaining about a hook); and the verdict is earned: healthy, with the
updates watched (``suspect`` is allowed for the curriculum, whose loss steps up by design). A
failing case here is a bug in nanscope, never a reason to skip the case.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.compat._runs import run_both

pytestmark = pytest.mark.slow  # every corpus script run bare and under nanscope, in subprocesses

SCRIPTS = sorted((Path(__file__).resolve().parent / "scripts").glob("*.py"))

#: the command-line arguments a script is given (the same bare and under run)
ARGS = {"argparse_main": ["--lr", "0.05", "--steps", "7", "--name", "probe"]}
#: the verdicts allowed besides healthy
ALSO = {"curriculum": {"suspect"}}
#: the exit code each script ends with by itself
CODES = {"sys_exit_code": 4}
#: a line of stderr that is a warning (Python's, torch's, nanscope's own)
WARNING = re.compile(r"(Warning:|nanscope: warning|internal error)")
#: cases nanscope fails today, each a bug named here; strict, so the fix turns the case red until
#: its entry goes
KNOWN_BUGS: dict[str, str] = {}


def test_the_corpus_holds_every_pattern() -> None:
    assert len(SCRIPTS) >= 25
    for script in SCRIPTS:
        doc = script.read_text().split('"""')
        assert len(doc) > 2 and doc[1].strip(), f"{script.name}: say which pattern it is"


@pytest.mark.parametrize("script", [
    pytest.param(s, id=s.stem, marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[s.stem])]
                 if s.stem in KNOWN_BUGS else [])
    for s in SCRIPTS
])  # fmt: skip
def test_a_healthy_script_behaves_under_run_as_it_does_bare(script, tmp_path, zygote) -> None:
    name = script.stem
    runs = run_both(zygote, tmp_path, script.name, script.read_text(), ARGS.get(name, []))
    out, err = runs.out, runs.err
    assert runs.codes["bare"] == CODES.get(name, 0), f"bare run failed:\n{err['bare'][-3000:]}"
    assert runs.codes["run"] == runs.codes["bare"], f"under nanscope run:\n{err['run'][-3000:]}"
    assert out["bare"], "the script prints what it computed"
    assert out["run"][: len(out["bare"])] == out["bare"], err["run"][-3000:]
    new = {line for line in err["run"].splitlines() if WARNING.search(line)} - {
        line for line in err["bare"].splitlines() if WARNING.search(line)
    }
    assert not new, f"warnings only under run: {sorted(new)}"
    diagnosis = runs.diagnosis()
    assert diagnosis["verdict"] in {"healthy", *ALSO.get(name, set())}, diagnosis["evidence"]
    assert diagnosis["summary"]["updates"] > 0
    assert not diagnosis.get("extra", {}).get("torch", {}).get("hook_faults")
