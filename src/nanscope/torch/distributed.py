"""One decision for all ranks under ``torch.distributed`` (DDP, torchrun), and the rank that broke.

A NaN on one rank is the worst case of data-parallel training: that rank stops, the others block in
the next collective and the job hangs until a timeout. Here every rank's Monitor takes the same
decision at the same update:

* :class:`DistributedAgreement` combines the local verdicts of all ranks with **one** small
  collective per check: an ``all_reduce(MAX)`` of ``world_size + 3`` int64 values (the update
  number, its negation, the earliest bad update, and one slot per rank holding that rank's alarm
  kind and what went non-finite there). Every rank reads the same vector, so every rank stops (or
  goes on) together, and all of them know which rank(s) broke first.
* :func:`agree` is a combinator around a Monitor's detectors, the way optax's ``apply_if_finite``
  wraps an inner transform: the :class:`AgreeingDetectors` it returns runs the local detectors,
  then agrees. A rank whose own detectors saw nothing stops with a *peer* alarm naming the rank
  that broke. :func:`attach` wraps an existing Monitor's detectors with it
  (:meth:`nanscope.Monitor.wrap_detectors`).
* At the stop every rank still alive gathers the key fields of the others' diagnoses
  (``all_gather_object``, one call, only then); rank 0 merges them: the cause, evidence and rows
  of the first bad rank, plus ``rank`` and ``ranks`` (``Diagnosis.extra``), and writes
  ``<run root>/diagnosis.json``. Each rank keeps its own ``<run root>/rank{r}/trace.jsonl``.
* A rank that dies (killed, out of memory, ``os._exit``) makes the collectives fail (gloo: at once
  when the peer's sockets close, else at the process group's timeout). The survivors stop, say
  which rank is gone (each rank leaves ``rank{r}/rank.json`` with its pid; a pid that no longer runs
  on this host is a dead rank) and write ``<run root>/failure.json``.

Use it from a script with ``nanscope.watch(model, optimizer)`` (under a process group of more
than one rank it attaches the agreement itself; ``every_agree=N`` thins it), or with ``nanscope
run`` under ``torchrun`` (see ``docs/distributed.md``: :func:`arm` before the script, :func:`finish`
after it).

How often it combines: every observed update by default. On CPU/gloo one ``all_reduce`` of a few
int64 costs tens of microseconds next to the gradient all-reduce DDP already does. On accelerators
the Watcher reads its device-side measures every ``sync_every`` updates and observes them in one
burst; the agreement then runs on a CPU (gloo) side group, so it adds no device synchronisation,
and each update is still decided exactly. ``every=N`` combines only on updates divisible by N
(a local alarm is held until then: the stop is up to N-1 updates late, the first bad update is
still reported exactly).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import sys
import time
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

import torch
from nanscope.detectors import Alarm, Detector
from nanscope.errors import UsageError
from nanscope.monitor import Monitor
from nanscope.schedule import Every

__all__ = [
    "AgreeingDetectors",
    "DistributedAgreement",
    "agree",
    "arm",
    "attach",
    "attach_watcher",
    "dead_ranks",
    "finish",
    "is_distributed",
    "launched_by_torchrun",
    "refuse_under_torchrun",
]

#: alarm kinds, in the order the agreement ranks them (the highest wins on every rank)
KINDS: tuple[str, ...] = ("", "ascending", "diverging", "nonfinite", "rank_failure")
#: what went non-finite on a rank, least to most "original": a NaN batch or loss on one rank
#: becomes NaN gradients on every rank after DDP's all-reduce, so the batch/loss rank is the origin
WHAT: tuple[str, ...] = ("", "weight", "grad", "loss", "input")
_BASE = len(WHAT)
_NONE = -(2**62)

_ATTACHED: weakref.WeakKeyDictionary[Monitor, AgreeingDetectors] = weakref.WeakKeyDictionary()
_STATE: dict[str, Any] = {"root": None, "armed": False, "in_script": False, "reported": False}


# ---------------------------------------------------------------------- environment


def is_distributed() -> bool:
    """True when a ``torch.distributed`` process group is up with more than one rank."""
    return bool(
        dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    )


def launched_by_torchrun() -> bool:
    """True in a worker started by ``torchrun`` (or a launcher that sets the same variables)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    )


def env_rank() -> int:
    """This process's rank from the launcher's environment (0 when there is none)."""
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


def refuse_under_torchrun(command: str) -> None:
    """Raise a :class:`UsageError` when ``command`` (e.g. ``"sweep"``) runs inside torchrun.

    The sweep reruns the script once per factor in child processes; under torchrun every rank would
    start its own sweep and each child would join (or block) the launcher's process group.
    """
    if launched_by_torchrun():
        raise UsageError(
            f"nanscope {command} does not run under torchrun: it reruns the script in child "
            "processes, which would join the launcher's process group. Run the sweep on one "
            "process (nanscope sweep -- python train.py, with the script's world size 1), or "
            "sweep the learning rate by launching torchrun once per factor"
        )


# ---------------------------------------------------------------------- the agreement


class DistributedAgreement:
    """Combine every rank's local verdict with one small ``all_reduce(MAX)`` per check.

    ``agree(local_alarm, kind, step, what=...)`` returns ``(stop, ranks)``: the same on every rank.
    ``ranks`` are the ranks whose alarm ranked highest (kind first: ``nonfinite`` over
    ``diverging`` over ``ascending``; then what went non-finite: input batch, loss, gradient,
    weight), lowest rank first; ``ranks[0]`` is *the* rank that broke. After a stop, ``kind``,
    ``what``, ``first_step`` (the earliest bad update over all ranks) and ``step_range`` (the
    smallest and largest update number the ranks were at) describe it.

    group: the process group (default: the default group when its backend is gloo, else a new gloo
        side group so the check never synchronises an accelerator; made on every rank at once).
    every: combine only on updates divisible by ``every`` (default 1: every update).
    """

    def __init__(self, group: Any = None, *, every: int = 1) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise UsageError(f"every must be a positive integer, got {every!r}")
        if not (dist.is_available() and dist.is_initialized()):
            raise UsageError(
                "DistributedAgreement needs torch.distributed.init_process_group() first"
            )
        if group is None and dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo")
        self.group = group
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.every = every
        #: the updates it combines on: those divisible by ``every``
        self.schedule = Every(every)
        self._vec = torch.zeros(self.world_size + 3, dtype=torch.int64)
        self._held: tuple[str, int, int] | None = None  # kind, step, what level
        self.combines = 0
        self.kind: str | None = None
        self.what: str | None = None
        self.first_step: int | None = None
        self.step_range: tuple[int, int] | None = None
        self.slots: list[int] = []

    def agree(
        self, local_alarm: bool, kind: str | None, step: int, *, what: Sequence[str] = ()
    ) -> tuple[bool, list[int]]:
        """This rank's verdict for update ``step`` in, the job's verdict out (a collective)."""
        level = 0
        for name in what:
            if name in WHAT:
                level = max(level, WHAT.index(name))
        if local_alarm and self._held is None:
            code = KINDS.index(kind) if kind in KINDS else KINDS.index("nonfinite")
            self._held = (KINDS[max(code, 1)], int(step), level)
        if not self.schedule.due(step):
            return False, []
        vec = self._vec
        vec.zero_()
        vec[0] = step
        vec[1] = -step
        vec[2] = _NONE
        if self._held is not None:
            held_kind, held_step, held_level = self._held
            vec[2] = -held_step
            vec[3 + self.rank] = KINDS.index(held_kind) * _BASE + held_level
        dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=self.group)
        self.combines += 1
        values = vec.tolist()
        slots = values[3:]
        top = max(slots)
        self.step_range = (-values[1], values[0])
        if top <= 0:
            return False, []
        self._held = None
        self.slots = slots
        self.kind = KINDS[top // _BASE]
        self.what = WHAT[top % _BASE] or None
        self.first_step = -values[2] if values[2] != _NONE else int(step)
        return True, [r for r, value in enumerate(slots) if value == top]

    def bad_ranks(self) -> list[int]:
        """Every rank that raised any alarm at the last stop (not only the first ones)."""
        return [r for r, value in enumerate(self.slots) if value > 0]


class AgreeingDetectors:
    """A detector that runs the local detectors (``inner``), then agrees with the other ranks.

    Made by :func:`agree`. A collective that fails (a rank died, or the process group timed out)
    turns into a ``rank_failure`` alarm on this rank, after the dead ranks are named.
    """

    def __init__(self, inner: Detector, agreement: DistributedAgreement) -> None:
        self.inner = inner
        self.agreement = agreement
        self.failed: dict[str, Any] | None = None
        self.stops = 0

    def reset(self) -> None:
        """Fresh local detectors (after a rollback); the agreement stays."""
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    def step(self, record: dict[str, Any]) -> Alarm | None:
        alarm = self.inner.step(record)
        if self.failed is not None:
            return None  # the group is gone: nothing left to agree on, the stop already happened
        step = int(record["step"])
        what = _what(alarm, record)
        try:
            stop, ranks = self.agreement.agree(
                alarm is not None, alarm.kind if alarm else None, step, what=what
            )
        except Exception as exc:
            return self._peer_failure(exc, step)
        if not stop:
            return None  # nobody broke (or, with every > 1, a local alarm waits for its check)
        self.stops += 1
        ag = self.agreement
        info = {
            "rank": ranks[0],
            "ranks": ranks,
            "this_rank": ag.rank,
            "world_size": ag.world_size,
            "agreed_kind": ag.kind,
            "agreed_what": ag.what,
            "first_bad_step": ag.first_step,
            "alarmed_ranks": ag.bad_ranks(),
        }
        record.setdefault("extra", {})["ranks"] = {"rank": ranks[0], "ranks": ranks}
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        if alarm is not None:
            text = alarm.text if ag.rank in ranks else f"{alarm.text} (first broken: {who})"
            return Alarm(alarm.kind, alarm.step, text, {**alarm.data, **info})
        kind = ag.kind or "nonfinite"
        text = f"{who} stopped at update {step} ({kind}"
        text += f", non-finite {ag.what})" if ag.what else ")"
        text += f"; rank {ag.rank} stops with it"
        return Alarm(kind, step, text, {"peer": True, **info})

    def _peer_failure(self, exc: BaseException, step: int) -> Alarm:
        gone = dead_ranks(wait=3.0)
        ag = self.agreement
        self.failed = {"step": step, "error": f"{type(exc).__name__}: {exc}"[:500], "dead": gone}
        who = (
            ("rank " if len(gone) == 1 else "ranks ") + ", ".join(map(str, gone))
            if gone
            else "another rank"
        )
        text = (
            f"{who} died or stopped answering: the agreement at update {step} failed "
            f"({type(exc).__name__}); rank {ag.rank} stops here"
        )
        _report_failure(text, step=step, dead=gone, error=self.failed["error"])
        return Alarm(
            "rank_failure",
            step,
            text,
            {"rank": gone[0] if gone else None, "ranks": gone, "dead_ranks": gone,
             "this_rank": ag.rank, "world_size": ag.world_size},
        )  # fmt: skip


def _what(alarm: Alarm | None, record: dict[str, Any]) -> list[str]:
    if alarm is None:
        return []
    what = [str(w) for w in (alarm.data.get("what") or [])]
    if record.get("nf_inputs") or record.get("nf_targets"):
        what.append("input")
    return what


# ---------------------------------------------------------------------- attaching


def agree(
    inner: Detector,
    agreement: DistributedAgreement | None = None,
    *,
    every: int = 1,
    group: Any = None,
) -> AgreeingDetectors:
    """Wrap the detectors ``inner`` so that every rank takes the same decision (a combinator).

    ``agreement`` defaults to a new :class:`DistributedAgreement` (``group``, ``every``); making
    one is a collective when it creates a gloo side group, so call this on every rank at once::

        monitor = Monitor(detectors=agree(DetectorChain()))     # or, on an existing Monitor:
        monitor.wrap_detectors(agree)
    """
    if agreement is None:
        agreement = DistributedAgreement(group, every=every)
    return AgreeingDetectors(inner, agreement)


def attach(monitor: Monitor, *, every: int = 1, group: Any = None) -> AgreeingDetectors | None:
    """Make ``monitor`` agree with the other ranks; returns the wrapper (None when not distributed).

    Call it on every rank at the same point (it runs collectives: it is done when the Monitor is
    made, before its first update). It also moves the Monitor's run directory to
    ``<rank 0's run dir>/rank{r}`` so the ranks of one job share one run root.
    """
    if not is_distributed():
        return None
    existing = _ATTACHED.get(monitor)
    if existing is not None:
        return existing
    agreement = DistributedAgreement(group, every=every)
    root = [str(monitor.run_dir)]
    dist.broadcast_object_list(root, src=0, group=agreement.group)
    run_root = Path(root[0])
    monitor.move_run_dir(run_root / f"rank{agreement.rank}")
    monitor.meta.update(rank=agreement.rank, world_size=agreement.world_size,
                        run_root=str(run_root))  # fmt: skip
    # a rollback resets the detectors: the wrapper stays, its reset renews only the local ones
    wrapper = AgreeingDetectors(monitor.detectors, agreement)
    monitor.wrap_detectors(lambda inner: wrapper)
    monitor.on_stop.append(_merge_at_stop)
    _ATTACHED[monitor] = wrapper
    _STATE["root"] = run_root
    _write_rank_file(run_root, agreement.rank, finished=False)
    atexit.register(_at_exit, str(run_root), agreement.rank)
    return wrapper


def attach_watcher(watcher: Any, *, every: int = 1) -> AgreeingDetectors | None:
    """:func:`attach` for a :class:`nanscope.torch.Watcher`'s Monitor."""
    wrapper = attach(watcher.monitor, every=every)
    if wrapper is not None:
        watcher.monitor.meta.setdefault("distributed", dist.get_backend())
    return wrapper


# ---------------------------------------------------------------------- the merged diagnosis


def _merge_at_stop(monitor: Monitor, alarm: Alarm) -> None:
    """``Monitor.on_stop`` callback: gather the ranks' diagnoses; rank 0 merges and writes them."""
    wrapper = _ATTACHED.get(monitor)
    diagnosis = monitor.diagnosis
    if wrapper is None or diagnosis is None:
        return
    ag = wrapper.agreement
    data = alarm.data
    ranks = list(data.get("ranks") or [])
    diagnosis.extra["rank"] = data.get("rank")
    diagnosis.extra["ranks"] = ranks
    diagnosis.extra["this_rank"] = ag.rank
    diagnosis.extra["world_size"] = ag.world_size
    run_root = Path(monitor.meta.get("run_root") or monitor.run_dir.parent)
    if wrapper.failed is not None:
        diagnosis.extra["dead_ranks"] = wrapper.failed["dead"]
        diagnosis.extra["rank_failure"] = wrapper.failed
        return
    mine = {
        "rank": ag.rank,
        "diagnosis": diagnosis.to_dict(),
        "trace": str(monitor.run_dir / "trace.jsonl"),
        "alarm": {"kind": alarm.kind, "step": alarm.step, "text": alarm.text,
                  "peer": bool(data.get("peer"))},
    }  # fmt: skip
    gathered: list[Any] = [None] * ag.world_size
    try:
        dist.all_gather_object(gathered, mine, group=ag.group)
    except Exception as exc:
        diagnosis.extra["merge_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return
    per_rank = [_rank_summary(g) for g in gathered if isinstance(g, dict)]
    diagnosis.extra["per_rank"] = per_rank
    if ag.rank != 0:
        _add_rank_evidence(diagnosis, ag, alarm)
        return
    first = data.get("rank")
    origin = next((g for g in gathered if isinstance(g, dict) and g["rank"] == first), None)
    if origin is not None and first != ag.rank:
        _adopt(diagnosis, origin["diagnosis"])
    diagnosis.run = {
        **diagnosis.run,
        "dir": str(run_root),
        "trace": origin["trace"] if origin else diagnosis.run.get("trace"),
        "rank_dirs": [str(run_root / f"rank{r}") for r in range(ag.world_size)],
    }
    diagnosis.extra.update(rank=first, ranks=ranks, this_rank=0, world_size=ag.world_size,
                           per_rank=per_rank)  # fmt: skip
    _add_rank_evidence(diagnosis, ag, alarm)
    if monitor.writes:
        try:
            run_root.mkdir(parents=True, exist_ok=True)
            (run_root / "diagnosis.json").write_text(diagnosis.to_json() + "\n")
        except Exception as exc:
            warnings.warn(f"nanscope: merged diagnosis not written ({exc})", RuntimeWarning,
                          stacklevel=2)  # fmt: skip


def _add_rank_evidence(diagnosis: Any, ag: DistributedAgreement, alarm: Alarm) -> None:
    """One evidence item (second, so the stop message shows it) naming the rank that broke."""
    from nanscope.diagnose.diagnosis import Evidence

    ranks = list(alarm.data.get("ranks") or [])
    if not ranks:
        return
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    what = f"non-finite {ag.what}" if ag.kind == "nonfinite" and ag.what else ag.kind
    text = (
        f"{who} of {ag.world_size} broke first ({what} at update {ag.first_step}); every rank "
        f"stopped at update {alarm.step}"
    )
    data = {"rank": ranks[0], "ranks": ranks, "world_size": ag.world_size,
            "alarmed_ranks": ag.bad_ranks(), "first_bad_step": ag.first_step}  # fmt: skip
    diagnosis.evidence.insert(min(1, len(diagnosis.evidence)), Evidence("distributed", text, data))


def _rank_summary(gathered: dict[str, Any]) -> dict[str, Any]:
    d = gathered.get("diagnosis") or {}
    return {
        "rank": gathered.get("rank"),
        "verdict": d.get("verdict"),
        "cause": d.get("cause"),
        "step": d.get("step"),
        "first_nonfinite": d.get("first_nonfinite"),
        "rows": (d.get("rows") or [])[:10],
        "alarm": gathered.get("alarm"),
        "trace": gathered.get("trace"),
    }


def _adopt(diagnosis: Any, origin: dict[str, Any]) -> None:
    """Copy the first bad rank's findings into rank 0's diagnosis object (in place: the raised
    :class:`~nanscope.DivergenceError` carries this very object)."""
    from nanscope.diagnose.diagnosis import Diagnosis

    other = Diagnosis.from_dict(origin)
    for name in ("verdict", "cause", "confidence", "step", "first_nonfinite", "evidence",
                 "actions", "alternatives", "contributing", "located", "rows", "rule"):  # fmt: skip
        setattr(diagnosis, name, getattr(other, name))


def finish(diagnosis: Any, *, code: int, wait: float = 20.0) -> Any:
    """After the script ended under ``nanscope run`` (every rank): settle what this rank reports.

    On a rank other than 0 it returns the diagnosis unchanged (its own files are already written).
    On rank 0: when the run stopped, the diagnosis is already merged (see :func:`attach`); when it
    did not, rank 0 waits up to ``wait`` seconds for the other ranks' ``rank{r}/diagnosis.json``
    and reports the worst of them, with ``rank``/``ranks``; a rank that died is named (stderr and
    ``failure.json``). Returns the diagnosis to report.
    """
    root = _STATE.get("root")
    _STATE["in_script"] = False
    if root is None or env_rank() != 0:
        if root is not None and code not in (0, 3):
            gone = _report_dead_peers(root)
            if gone and diagnosis is not None:
                diagnosis.extra["dead_ranks"] = gone
        return diagnosis
    if diagnosis is not None and "ranks" in diagnosis.extra:
        return diagnosis
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    others = _read_rank_diagnoses(Path(root), world, wait=wait if code == 0 else 3.0)
    gone = _report_dead_peers(root) if code != 0 else []
    if diagnosis is None:
        return None
    if gone:
        diagnosis.extra["dead_ranks"] = gone
        diagnosis.extra["rank_failure"] = _read_failure(Path(root))
    from nanscope.diagnose.diagnosis import VERDICT_RANK, Diagnosis, Evidence

    order = VERDICT_RANK
    worst: tuple[int, dict[str, Any]] | None = None
    for rank, d in sorted(others.items()):
        if rank == 0 or d.get("verdict") == "healthy":
            continue
        if worst is None or order.get(d.get("verdict", ""), 9) < order.get(
            worst[1].get("verdict", ""), 9
        ):
            worst = (rank, d)
    bad = sorted(r for r, d in others.items() if d.get("verdict") != "healthy")
    if diagnosis.verdict != "healthy" and 0 not in bad:
        bad = [0, *bad]
    if worst is not None and (
        order.get(worst[1].get("verdict", ""), 9) < order.get(diagnosis.verdict, 9)
    ):
        _adopt(diagnosis, worst[1])
        diagnosis.extra["rank"] = worst[0]
    elif bad:
        diagnosis.extra["rank"] = bad[0]
    diagnosis.extra["ranks"] = bad
    diagnosis.extra["world_size"] = world
    blind = sorted(r for r, d in others.items() if d.get("verdict") == "unobserved")
    if blind and diagnosis.verdict == "healthy":
        # healthy on the ranks it watched; the others are named, not counted as healthy
        diagnosis.evidence.append(Evidence(
            "engine",
            f"rank(s) {', '.join(map(str, blind))} of {world} recorded no update: their batches "
            "were not checked, so this verdict covers the other ranks only",
            {"unobserved_ranks": blind},
        ))  # fmt: skip
    diagnosis.extra["per_rank"] = [
        {"rank": r, "verdict": d.get("verdict"), "cause": d.get("cause"), "step": d.get("step")}
        for r, d in sorted(others.items())
    ]
    diagnosis.run = {**diagnosis.run, "dir": str(root)}
    with contextlib.suppress(OSError):
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / "diagnosis.json").write_text(Diagnosis.to_json(diagnosis) + "\n")
    return diagnosis


def _read_rank_diagnoses(root: Path, world: int, *, wait: float) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + wait
    found: dict[int, dict[str, Any]] = {}
    while True:
        for rank in range(world):
            if rank in found:
                continue
            path = root / f"rank{rank}" / "diagnosis.json"
            try:
                found[rank] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
        if len(found) == world or time.monotonic() > deadline:
            return found
        if dead_ranks(root=root, wait=0.0):
            deadline = min(deadline, time.monotonic() + 1.0)
        time.sleep(0.1)


# ---------------------------------------------------------------------- dead ranks


def _write_rank_file(root: Path, rank: int, *, finished: bool) -> None:
    with contextlib.suppress(OSError):
        folder = root / f"rank{rank}"
        folder.mkdir(parents=True, exist_ok=True)
        info = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
                "finished": finished, "time": time.time()}  # fmt: skip
        tmp = folder / "rank.json.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(folder / "rank.json")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited: the launcher has not reaped it yet
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def dead_ranks(*, root: str | os.PathLike[str] | None = None, wait: float = 0.0) -> list[int]:
    """Ranks of this job (same host) whose process ended without finishing, as far as known.

    Read from ``<run root>/rank{r}/rank.json``; waits up to ``wait`` seconds for the launcher to
    reap a rank that just died.
    """
    base = Path(root) if root is not None else _STATE.get("root")
    if base is None:
        return []
    host = socket.gethostname()
    deadline = time.monotonic() + wait
    while True:
        gone: list[int] = []
        for path in sorted(Path(base).glob("rank*/rank.json")):
            try:
                info = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if info.get("finished") or info.get("host") != host:
                continue
            if info.get("pid") != os.getpid() and not _alive(int(info["pid"])):
                gone.append(int(info["rank"]))
        if gone or time.monotonic() >= deadline:
            return sorted(gone)
        time.sleep(0.1)


def _report_failure(text: str, *, step: int | None, dead: list[int], error: str | None) -> None:
    if _STATE.get("reported"):
        return
    _STATE["reported"] = True
    rank = env_rank()
    print(f"nanscope (rank {rank}): {text}", file=sys.stderr, flush=True)
    root = _STATE.get("root")
    if root is None:
        return
    with contextlib.suppress(OSError):
        info = {"reported_by": rank, "step": step, "dead_ranks": dead, "text": text,
                "error": error, "time": time.time()}  # fmt: skip
        (Path(root) / "failure.json").write_text(json.dumps(info, indent=2) + "\n")


def _read_failure(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / "failure.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _report_dead_peers(root: Any, step: int | None = None) -> list[int]:
    gone = dead_ranks(root=root, wait=3.0)
    if not gone:
        return []
    who = ("rank " if len(gone) == 1 else "ranks ") + ", ".join(map(str, gone))
    if step is None:
        step = _last_step()
    at = f" after update {step}" if step is not None else ""
    _report_failure(
        f"{who} died (its process ended without finishing){at}; this rank could not go on. "
        f"Its trace is in {Path(root) / f'rank{gone[0]}'}",
        step=step,
        dead=gone,
        error=None,
    )
    return gone


def _last_step() -> int | None:
    for monitor in list(_ATTACHED):
        if monitor.trace.records:
            return int(monitor.trace.records[-1]["step"])
    return None


def _at_exit(root: str, rank: int) -> None:  # pragma: no cover - runs at interpreter exit
    _write_rank_file(Path(root), rank, finished=True)


# ---------------------------------------------------------------------- nanscope run


def arm() -> None:
    """Called by ``nanscope run`` before the script when launched by torchrun (else a no-op).

    Every Watcher that ``nanscope run`` creates is attached (:func:`attach_watcher`) once the
    script's process group is up, and SIGTERM (how torchrun stops the surviving ranks when one
    fails) ends the script like an exit, so the report still comes out.
    """
    if not launched_by_torchrun() or _STATE["armed"]:
        return
    _STATE["armed"] = True
    _STATE["in_script"] = True
    from nanscope.torch import autowatch

    autowatch.on_watcher.append(_attach_new)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _attach_new(watcher: Any) -> None:
    if watcher.monitor in _ATTACHED or not is_distributed():
        return
    try:
        attach_watcher(watcher)
    except Exception as exc:  # never stop training for nanscope's sake
        warnings.warn(f"nanscope: ranks will not agree on stops ({type(exc).__name__}: {exc})",
                      RuntimeWarning, stacklevel=2)  # fmt: skip


def _on_sigterm(signum: int, frame: Any) -> None:
    root = _STATE.get("root")
    if root is not None:
        _report_dead_peers(root)
    if _STATE.get("in_script"):
        _STATE["in_script"] = False
        raise SystemExit(128 + signum)
