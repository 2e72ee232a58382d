"""Runs the compatibility scripts, bare and under ``nanscope run``, as forks of one process that
imported torch once.

Each script is one process as ``python script.py`` and ``python -m nanscope run -- python
script.py`` would be, but importing torch (with the compiler, which the first optimizer step
imports) costs a few seconds of CPU per process: thirty scripts run twice would cost minutes. This
process imports them once, then reads one request per line on stdin (a JSON list of jobs) and
forks one child per job, all at once; each child takes its job's folder, environment, argv and
output files, runs the script as ``python`` would (``__main__``, its folder first on ``sys.path``,
``SystemExit`` as the exit code, an uncaught exception printed and exit 1, ``atexit`` handlers at
the end), or ``nanscope.cli.main(["run", ...])`` as ``python -m nanscope`` would, and exits with
that code. The answer is one JSON line: the exit codes in the jobs' order (``None``: killed after
the job's timeout).

nanscope is imported here but nothing of it is switched on: a bare child runs with torch as torch
ships it (checked below), and a ``run`` child arms nanscope with torch already imported.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import signal
import sys
import time
import traceback

import torch._dynamo
import torch.utils.checkpoint
import torch.utils.data

import nanscope.cli
import nanscope.commands.run
import nanscope.diagnose.engine
import nanscope.report.terminal
import nanscope.torch.autowatch
import nanscope.torch.watch
import torch

_PRISTINE = (torch.Tensor.backward, torch.nn.Module.__reduce_ex__, torch.jit.script)


def _child(job: dict) -> int:
    os.setsid()  # its own process group: a timeout ends its DataLoader workers with it
    os.chdir(job["cwd"])
    os.environ.update(job["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):  # fmt: skip
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    argv = job["argv"]
    try:
        if job["mode"] == "bare":
            script = os.path.abspath(argv[0])
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
            code = 0
        else:
            sys.argv = ["nanscope", *argv]
            sys.path[0] = os.getcwd()
            code = nanscope.cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()
    return code


def _wait(pids: list[int], timeout: float) -> list[int | None]:
    codes: dict[int, int | None] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in pids:
                if pid not in codes:
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[pid] = None
        time.sleep(0.02)
    return [codes[pid] for pid in pids]


def main() -> None:
    assert (torch.Tensor.backward, torch.nn.Module.__reduce_ex__, torch.jit.script) == _PRISTINE
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        jobs = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pids = []
        for job in jobs:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _child(job)
                finally:
                    os._exit(code)
            pids.append(pid)
        timeout = max(float(job.get("timeout", 120)) for job in jobs)
        print(json.dumps(_wait(pids, timeout)), flush=True)


if __name__ == "__main__":
    main()
