"""``nanscope run -- /other/venv/bin/python train.py``: the interpreter the user names is the one
that runs.

``-- train.py``, ``-- python train.py`` and ``-- python3 train.py`` run the script in nanscope's
own process, as always. A command that names another Python, by its path or by a version other
than this one (``python3.12``), whose environment is not this one (another ``sys.prefix``), runs
``nanscope run`` again *in that interpreter*, with this nanscope importable there (and nothing else
of this environment: a folder holding only a link to the package goes first on ``PYTHONPATH``).
Its exit code passes through. Where that cannot work (Python older than 3.10, nanscope's own
dependencies missing there), it stops before the script starts with one line saying what to
install where.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from nanscope.commands.base import clean
from nanscope.errors import UsageError

__all__ = ["REQUIRES", "other_python", "run_in"]

#: what nanscope itself imports (``pyproject.toml``'s dependencies)
REQUIRES = ("numpy", "orjson", "rich")
#: the oldest Python nanscope runs on
OLDEST = (3, 10)

_PROBE = (
    "import json, sys\n"
    "missing = []\n"
    "for name in {names!r}:\n"
    "    try:\n"
    "        __import__(name)\n"
    "    except Exception:\n"
    "        missing.append(name)\n"
    "print(json.dumps({{'prefix': sys.prefix, 'version': list(sys.version_info[:3]),\n"
    "                  'missing': missing}}))\n"
)


def _names_python(first: str) -> bool:
    name = Path(first).name.lower()
    return re.fullmatch(r"python(\d+(\.\d+)?)?(\.exe)?", name) is not None


def other_python(command: list[str]) -> str | None:
    """The interpreter ``command`` names when it is not this environment's, else None.

    A path (``/other/venv/bin/python``, ``./py/python3``) or a name with another version than
    this one (``python3.12``) counts; ``python``, ``python3`` and this version's name are this
    interpreter (what ``nanscope run -- python train.py`` always meant). Raises
    :class:`UsageError` for a named interpreter that does not exist or does not run."""
    if not command or not _names_python(command[0]):
        return None
    first = command[0]
    if os.sep not in first and (os.altsep is None or os.altsep not in first):
        ours = {"python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"}
        if Path(first).stem.lower() in ours:
            return None
        found = shutil.which(first)
        if found is None:
            raise UsageError(f"{clean(first)}: no such interpreter on PATH")
        first = found
    elif not Path(first).is_file():
        raise UsageError(f"{clean(first)}: no such interpreter")
    if os.path.abspath(first) == os.path.abspath(sys.executable):
        return None
    info = _probe(first)
    if os.path.realpath(str(info["prefix"])) == os.path.realpath(sys.prefix):
        return None  # another name for this environment's interpreter
    _check(first, info)
    return first


def _probe(python: str) -> dict[str, Any]:
    """The other interpreter's ``sys.prefix``, version, and which of :data:`REQUIRES` it lacks."""
    code = _PROBE.format(names=REQUIRES)
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"{clean(python)}: cannot be run ({clean(exc, 120)})") from None
    try:
        info: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        said = clean((proc.stderr.strip().splitlines() or ["no answer"])[-1], 160)
        raise UsageError(f"{clean(python)}: is not a Python nanscope can use ({said})") from None
    return info


def _check(python: str, info: dict[str, Any]) -> None:
    version = tuple(info.get("version") or ())
    shown = ".".join(str(v) for v in version) or "?"
    if version < OLDEST:
        raise UsageError(
            f"{clean(python)} is Python {shown}; nanscope needs Python "
            f"{OLDEST[0]}.{OLDEST[1]} or newer: run the script with a newer Python"
        )
    missing = [str(m) for m in info.get("missing") or []]
    if missing:
        raise UsageError(
            f"{clean(python)} lacks {', '.join(missing)}, which nanscope needs to watch the "
            f"script there: install them in that environment ({clean(python)} -m pip install "
            f"{' '.join(missing)}), or install nanscope there"
        )


def _environment(path_entry: str) -> dict[str, str]:
    env = dict(os.environ)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = path_entry + (os.pathsep + rest if rest else "")
    return env


@contextlib.contextmanager
def _importable() -> Any:
    """A folder that holds this nanscope package alone (a link to it), for ``PYTHONPATH``."""
    package = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="nanscope-path-") as folder:
        try:
            os.symlink(package, Path(folder) / package.name, target_is_directory=True)
            yield folder
        except OSError:  # no links here (Windows without the privilege): the package's folder
            yield str(package.parent)


def run_in(python: str, options: list[str], command: list[str]) -> int:
    """``nanscope run OPTIONS -- COMMAND`` in ``python``; returns its exit code. SIGTERM is passed
    on to it (Ctrl-C reaches it by itself: it is in the same process group)."""
    with _importable() as folder:
        argv = [python, "-m", "nanscope", "run", *options, "--", python, *command[1:]]
        try:
            proc = subprocess.Popen(argv, env=_environment(folder))
        except OSError as exc:
            raise UsageError(f"{clean(python)}: cannot be run ({exc.strerror or exc})") from None

        def forward(signum: int, frame: Any) -> None:
            with contextlib.suppress(OSError):
                proc.send_signal(signum)

        saved = None
        with contextlib.suppress(ValueError, OSError):  # (not the main thread: no handler)
            saved = signal.signal(signal.SIGTERM, forward)
        try:
            while True:
                try:
                    code = proc.wait()
                    break
                except KeyboardInterrupt:
                    continue  # the child got the same Ctrl-C: it reports, then exits
        finally:
            if saved is not None:
                with contextlib.suppress(ValueError, OSError):
                    signal.signal(signal.SIGTERM, saved)
    return 128 - code if code < 0 else code
