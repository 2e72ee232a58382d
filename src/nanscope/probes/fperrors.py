"""numpy's own floating-point error machinery as a producer probe: op and line for free.

numpy already knows where a non-finite value is born: ``overflow encountered in square``, ``divide
by zero encountered in log``, ``invalid value encountered in divide``. With ``np.seterr(...,
"call")`` and ``np.seterrcall`` it calls us instead of printing, from inside the ufunc: the
calling Python frame is the user's line, and its current bytecode instruction (``f_lasti``, with
``co_positions``) is the exact operator or call (``** 2`` is numpy's ``square``). Each error is
kept, tagged with the update it belongs to (the next ``Monitor.update``), and the warning numpy
would have printed is still printed, once per line, as before.

Only the error kinds that were set to ``"warn"`` (numpy's default) are switched to ``"call"``: a
user's ``"ignore"``, ``"raise"`` or ``np.errstate(...)`` block is left alone (and then nothing is
seen there, which the rules treat as "no producer located"). ``watch(monitor)`` returns the probe
the Monitor calls after a detector fired: ``{"located": {...}}`` for the failing update's first
error (the producer), the later ones as its ``chain``.
"""

from __future__ import annotations

import contextlib
import dis
import linecache
import math
import os
import sys
import threading
import warnings
import weakref
from collections import deque
from typing import Any

from nanscope._frames import is_user_file
from nanscope.probes.rows import suspect_batch_rows

__all__ = ["arm", "errors_of", "watch"]

_KINDS = ("divide", "over", "invalid")
_LOCK = threading.Lock()
_WATCHES: weakref.WeakSet[_Watch] = weakref.WeakSet()
_STATE: dict[str, Any] = {"installed": False, "previous": None}
#: errors seen before any Monitor watched (``nanscope run`` arms this at the script's start): the
#: data preparation before training, where a log of a zero count makes the -inf a batch holds
_PRELUDE: deque[dict[str, Any]] = deque(maxlen=16)

#: the message kind numpy passes to the callback -> its np.seterr key
_SETTING = {"overflow": "over", "divide by zero": "divide", "invalid value": "invalid",
            "underflow": "under"}  # fmt: skip

_BINARY = {"**": "power", "*": "multiply", "/": "divide", "+": "add", "-": "subtract",
           "@": "matmul", "//": "floor_divide", "%": "remainder", "**=": "power",
           "*=": "multiply", "/=": "divide", "+=": "add", "-=": "subtract", "@=": "matmul",
           "//=": "floor_divide"}  # fmt: skip


class _Watch:
    """One Monitor's record of the floating-point errors of its recent updates."""

    def __init__(self, monitor: Any) -> None:
        self.monitor = weakref.ref(monitor)
        self.events: deque[dict[str, Any]] = deque(maxlen=64)
        # the errors since the last Monitor began are this one's data preparation; an earlier
        # run's (another test, another fit in this process) are not
        self.prelude = list(_PRELUDE)
        _PRELUDE.clear()
        _STATE["prelude"] = self.prelude

    def add(self, event: dict[str, Any]) -> None:
        monitor = self.monitor()
        if monitor is None:
            return
        count = int(getattr(monitor, "_count", 0))
        mine = [e for e in self.events if e["update"] == count + 1]
        if len(mine) >= 16:
            return
        for old in self.events:  # operands are kept for the update in progress only
            if old["update"] <= count:
                old.pop("operands", None)
        event = {**event, "update": count + 1}
        if len(mine) >= 2:
            event.pop("operands", None)  # the producer is the first one: no more copies
        self.events.append(event)

    def probe(self, monitor: Any, alarm: Any) -> dict[str, Any]:
        step = int(getattr(alarm, "step", 0) or 0)
        located = errors_of(self, step, monitor)
        out: dict[str, Any] = {"located": located} if located else {}
        others = [p for p in getattr(monitor, "probes", []) if p != self.probe]
        if getattr(alarm, "kind", "nonfinite") == "nonfinite" and not others:
            # (a framework adapter's probe, PyTorch's, runs its own experiment)
            # a numpy loop has no function nanscope can rerun: the producer op is recomputed
            # from the operands numpy's error callback saw, where they were plain names
            count = int(getattr(monitor, "_count", step) or step)
            first = next((e for e in self.events if e["update"] == count
                          and e["why"].get("kind") != "nonfinite_input"), None)  # fmt: skip
            try:
                out["confirmation"] = confirm_numpy(first, monitor, step)
            except Exception as exc:  # a probe bug must never kill the user's run
                out["confirmation"] = [{"change": "float64", "ran": False, "finite": None,
                                        "loss": None, "text": f"not run: the recompute failed "
                                        f"({type(exc).__name__}: {exc})"}]  # fmt: skip
        return out


def arm() -> None:
    """Record numpy's floating-point errors from now on, before any Monitor exists (``nanscope
    run`` calls this before the script starts): the warnings numpy prints are printed as before."""
    with contextlib.suppress(Exception):
        _install()


def watch(monitor: Any) -> Any:
    """Start recording numpy's floating-point errors for ``monitor``; returns its probe."""
    w = _Watch(monitor)
    try:
        _install()
        _WATCHES.add(w)
    except Exception:
        pass  # numpy missing or odd: the probe finds nothing
    return w.probe


def errors_of(w: _Watch, step: int, monitor: Any) -> dict[str, Any] | None:
    """The producer of update ``step`` (its first floating-point error), with the rest as chain."""
    count = int(getattr(monitor, "_count", step) or step)
    events = [e for e in w.events if e["update"] == count]
    made_batch = _batch_nonfinite(monitor, step)
    # a loop that updates by hand is found at its second update: the first one's batch is gone
    unseen = step == 1 and not made_batch and not _batch_recorded(monitor, step)
    how = "numpy floating-point error"
    producers = [e for e in events if e["why"].get("kind") != "nonfinite_input"]
    inferred = False
    if (made_batch or unseen) and not producers:
        # the batch was broken before training began: an op of the data preparation made it
        loop = _loop_file()  # (another file's preparation is another fit's, a test's)
        prelude = [e for e in w.prelude if e["why"].get("kind") != "nonfinite_input"
                   and (loop is None or e["source"].get("file") == loop)]  # fmt: skip
        if prelude:
            events = [*prelude, *events]
            producers = prelude
            how = "numpy floating-point error, in the data preparation before training"
            if unseen:
                inferred = True
                how += ("; the first update's batch was not recorded: that the value reached "
                        "it is inferred")  # fmt: skip
    if not events:
        return None
    first = producers[0] if producers else events[0]
    located = _located(first, step, how, observed=bool(producers) and not inferred)
    if inferred:
        located["phase"] = "preprocess"
    if producers and made_batch:
        # an op that made a value from finite ones, and the batch handed to update() holds a
        # non-finite value: the loop's (or the data preparation's) own op made the batch
        located["phase"] = "preprocess"
    also = [p for p in producers[1:] if p["source"].get("line") != first["source"].get("line")
            or p["op"] != first["op"]]  # fmt: skip
    if also:
        # numpy does not say which one reached the loss: every op that made a non-finite value
        # from finite inputs in this update is kept (exp's inf can turn into 1/(1+inf) = 0 ...)
        located["also"] = [{"op": e["op"], "source": e["source"], "message": e["message"],
                            "why": e["why"]} for e in also[:6]]  # fmt: skip
    rest = [e for e in events if e is not first]
    if rest:
        located["chain"] = [{"op": e["op"], "source": e["source"], "message": e["message"]}
                            for e in rest[:8]]  # fmt: skip
    return located


def prepared(step: int) -> dict[str, Any] | None:
    """The first numpy op of the data preparation (before any Monitor, or in a script no
    Monitor watches, like a PyTorch one) that made a NaN/inf from finite values, as a located
    producer of phase ``preprocess``; None when numpy reported no such op."""
    producers = [e for e in (_STATE.get("prelude") or _PRELUDE)
                 if e["why"].get("kind") != "nonfinite_input"]  # fmt: skip
    if not producers:
        return None
    how = "numpy floating-point error, in the data preparation before training"
    return {"phase": "preprocess", **_located(producers[0], step, how, observed=True)}


def _located(event: dict[str, Any], step: int, how: str, *, observed: bool) -> dict[str, Any]:
    """The located producer of one floating-point error event."""
    return {
        "op": event["op"], "source": event["source"], "message": event["message"],
        "observed": observed, "how": how, "step": step, "why": event["why"],
        "inputs": event["inputs"], "input_zero": bool(event["why"].get("zero", False)),
    }  # fmt: skip


def _loop_file() -> str | None:
    """The file of the user's code that called ``Monitor.update`` (up the stack), or None."""
    from nanscope._frames import is_user_file

    frame: Any = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            return None
        if is_user_file(frame.f_code.co_filename):
            return str(frame.f_code.co_filename)
        frame = frame.f_back
    return None


def _batch_recorded(monitor: Any, step: int) -> bool:
    """Update ``step``'s record says whether its targets were finite (and its inputs, where it
    has any: a loop on bare tensors records the data its weights multiplied, not the targets
    its loss compares them with)."""
    trace = getattr(monitor, "trace", None)
    records = getattr(trace, "records", None) or []
    for record in reversed(records[-8:]):
        if record.get("step") == step:
            return "nf_targets" in record or ("nf_inputs" in record and not _bare(monitor))
    return False


def _bare(monitor: Any) -> bool:
    """A loop on bare tensors (no model): its batch is read off the loss's graph."""
    meta = getattr(monitor, "meta", None) or {}
    return str(meta.get("source") or "").startswith("torch") and not meta.get("model")


def _batch_nonfinite(monitor: Any, step: int) -> bool:
    """The inputs or targets given to update ``step`` hold a NaN or inf."""
    trace = getattr(monitor, "trace", None)
    records = getattr(trace, "records", None) or []
    for record in reversed(records[-8:]):
        if record.get("step") == step:
            return bool(record.get("nf_inputs") or record.get("nf_targets"))
    return False


# ---------------------------------------------------------------------------- the numpy side


def _install() -> None:
    with _LOCK:
        if _STATE["installed"]:
            return
        import numpy as np

        current = np.geterr()
        wanted = {k: ("call" if current.get(k) == "warn" else current.get(k)) for k in _KINDS}
        if all(v != "call" for v in wanted.values()):
            return
        previous_call = np.geterrcall()
        _STATE["previous"] = previous_call
        _STATE["modes"] = dict(current)
        np.seterrcall(_on_error)
        np.seterr(**wanted)  # type: ignore[arg-type]
        _STATE["installed"] = True


def _on_error(kind: str, flag: int) -> None:
    frame: Any = sys._getframe(1)
    try:
        event, user = _event(kind, frame)
    except Exception:
        event, user = None, frame
    if event is not None:
        watches = list(_WATCHES)
        for w in watches:
            with contextlib.suppress(Exception):
                w.add(event)
        if not watches:
            event.pop("operands", None)
            _PRELUDE.append({**event, "update": 0})
    previous = _STATE.get("previous")
    setting = (_STATE.get("modes") or {}).get(_SETTING.get(kind, ""), "warn")
    if setting == "call" and callable(previous):
        previous(kind, flag)  # the user's own callback, for the kinds they had set to "call"
        return
    if setting != "warn":
        return
    # what numpy would have printed under "warn", at the same line
    op = event["op"] if event else "a ufunc"
    message = f"{kind} encountered in {op}"
    if user is not None:
        code = user.f_code
        warnings.warn_explicit(message, RuntimeWarning, code.co_filename, user.f_lineno,
                               module=user.f_globals.get("__name__", "__main__"),
                               registry=user.f_globals.setdefault("__warningregistry__", {}))
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=2)


def _event(kind: str, frame: Any) -> tuple[dict[str, Any] | None, Any]:
    depth = 0
    while frame is not None and depth < 32:
        if is_user_file(frame.f_code.co_filename):
            break  # (numpy's Python functions, nanscope's own numpy: their caller's line)
        frame = frame.f_back
        depth += 1
    if frame is None:
        return None, None
    code = frame.f_code
    op, span = _instruction(frame)
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    source: dict[str, Any] = {"file": code.co_filename, "line": frame.f_lineno,
                              "function": code.co_name}  # fmt: skip
    if line:
        source["code"] = line
    if span:
        source["expression"] = span
    why = _why(kind, op)
    if kind.startswith("invalid") and why.get("kind") != "nonfinite_input":
        held = _nonfinite_name(span or line, frame)
        if held is not None:  # (inf - inf in a mean or a std of data that held it already)
            why = {"kind": "nonfinite_input", "text": f"invalid value in {op}: {held} already "
                   "held a NaN/inf"}  # fmt: skip
    event = {"kind": kind, "op": op, "source": source, "message": f"{kind} encountered in {op}",
             "why": why, "inputs": _inputs(why)}  # fmt: skip
    operands = _operands(span, frame)
    if operands is not None:
        event["operands"] = operands  # kept in memory for the recompute, never written out
    return event, frame


def _nonfinite_name(code: str, frame: Any) -> str | None:
    """A name the expression reads whose value (a float array of at most ``MAX_OPERAND``
    elements, or a float) already holds a NaN/inf, or None."""
    import ast

    import numpy as np

    try:
        tree = ast.parse(code.strip())  # (an expression, or the statement of the line)
    except SyntaxError:
        return None
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Load)}  # fmt: skip
    for name in sorted(names):
        value = frame.f_locals.get(name, frame.f_globals.get(name))
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc" \
                and value.size <= MAX_OPERAND and not np.isfinite(value).all():  # fmt: skip
            return name
        if isinstance(value, float) and not math.isfinite(value):
            return name
    return None


#: the ops nanscope recomputes from their operands (numpy's own functions, nothing else)
_RECOMPUTE = {"square": ("square", 1), "power": ("power", 2), "multiply": ("multiply", 2),
              "divide": ("divide", 2), "true_divide": ("divide", 2), "add": ("add", 2),
              "subtract": ("subtract", 2), "matmul": ("matmul", 2), "exp": ("exp", 1),
              "expm1": ("expm1", 1), "log": ("log", 1), "log2": ("log2", 1),
              "log10": ("log10", 1), "log1p": ("log1p", 1), "sqrt": ("sqrt", 1),
              "reciprocal": ("reciprocal", 1), "cosh": ("cosh", 1),
              "sinh": ("sinh", 1)}  # fmt: skip
#: operands larger than this (elements) are not copied
MAX_OPERAND = 1_000_000


def _operands(span: str, frame: Any) -> list[Any] | None:
    """The operands of ``a ** 2`` / ``np.exp(z)`` when each is a plain name or a number: copies
    of the arrays (looked up in the frame, nothing is evaluated)."""
    import ast

    import numpy as np

    if not span or len(span) > 200:
        return None
    try:
        node = ast.parse(span.strip(), mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.BinOp):
        parts = [node.left, node.right]
    elif isinstance(node, ast.Call) and not node.keywords and 1 <= len(node.args) <= 2:
        parts = list(node.args)
    else:
        return None
    out: list[Any] = []
    for part in parts:
        if isinstance(part, ast.Constant) and isinstance(part.value, (int, float)):
            out.append(part.value)
        elif isinstance(part, ast.Name):
            value = frame.f_locals.get(part.id, frame.f_globals.get(part.id))
            if isinstance(value, np.ndarray) and value.size <= MAX_OPERAND:
                out.append(value.copy())
            elif isinstance(value, (np.floating, float, int)):
                out.append(value)
            else:
                return None
        else:
            return None
    return out


def _recompute(op: str, operands: list[Any], dtype: Any = None, keep: Any = None) -> Any:
    import numpy as np

    name, arity = _RECOMPUTE[op]
    args = []
    for a in operands[:arity]:
        if isinstance(a, np.ndarray):
            if keep is not None and a.ndim >= 1 and a.shape[0] == keep.shape[0]:
                a = a[keep]
            if dtype is not None and a.dtype.kind == "f":
                a = a.astype(dtype)
        elif dtype is not None and isinstance(a, (float, np.floating)):
            a = dtype(a)
        args.append(a)
    with np.errstate(all="ignore"):
        return np.asarray(getattr(np, name)(*args))


def _not_run(change: str, text: str) -> dict[str, Any]:
    return {"change": change, "ran": False, "finite": None, "loss": None, "text": text}


_NO_FUNCTION = "a numpy loop gives nanscope no function to rerun"


def confirm_numpy(event: dict[str, Any] | None, monitor: Any, step: int) -> list[dict[str, Any]]:
    """The confirming experiment for a numpy fit: the producer op recomputed in float64 and
    without the suspect rows, from its operands; what cannot be recomputed says why."""
    import numpy as np

    out: list[dict[str, Any]] = []
    rows = _numpy_suspect_rows(monitor, step)
    batch = _batch_len(monitor)
    op = event["op"] if event else None
    operands = event.get("operands") if event else None
    where = ""
    if event:
        src = event["source"]
        where = f"{op} at {os.path.basename(str(src.get('file')))}:{src.get('line')}"
    if not event or operands is None or op not in _RECOMPUTE:
        why = (f"{_NO_FUNCTION}, and the operands of {where} are not plain names"
               if event else f"{_NO_FUNCTION}, and numpy reported no floating-point error in "
               "this update's code (none happened, or np.errstate silenced it)")  # fmt: skip
        out.append(_not_run("float64", f"not run: {why}"))
        if rows:
            out.append({**_not_run("without_rows", f"not run: {_NO_FUNCTION} (the batch is "
                        "kept, not the loss code)"), "rows": rows})  # fmt: skip
        out.append(_not_run("lr_x0.1", f"not run: {_NO_FUNCTION}"))
        return out
    scope = "the producer op recomputed from its operands (numpy's error callback saw them)"
    narrow = [a for a in operands if isinstance(a, (np.ndarray, np.floating))
              and a.dtype.kind == "f" and a.dtype.itemsize < 8]  # fmt: skip
    if narrow:
        dtype = narrow[0].dtype
        wide = _recompute(op, operands, dtype=np.float64)
        finite = bool(np.isfinite(wide).all())
        finite_part = np.abs(wide[np.isfinite(wide)])
        big = float(finite_part.max()) if finite_part.size else 0.0
        limit = float(np.finfo(dtype).max)
        if finite and big > limit:
            text = (f"in float64, {where} is finite (largest {big:.3g}, past {dtype}'s "
                    f"{limit:.3g}): a precision overflow of {dtype}")  # fmt: skip
        elif finite:
            text = f"in float64, {where} is finite (largest {big:.3g})"
        else:
            text = f"in float64, {where} is still non-finite: not a precision problem"
        out.append({"change": "float64", "ran": True, "finite": finite, "loss": None,
                    "scope": scope, "text": text,
                    "largest": big if finite else None})  # fmt: skip
    if rows:
        shaped = [a for a in operands if isinstance(a, np.ndarray) and a.ndim >= 1]
        if batch is None or not shaped or any(a.shape[0] != batch for a in shaped):
            out.append({**_not_run("without_rows", f"not run: {_NO_FUNCTION}, and the operands of "
                        f"{where} are not one row per batch row"), "rows": rows})  # fmt: skip
        else:
            keep = np.ones(batch, dtype=bool)
            keep[[r for r in rows if r < batch]] = False
            if not keep.any():
                out.append({**_not_run("without_rows", "not run: every row of the batch is a "
                            "suspect"), "rows": rows})  # fmt: skip
            else:
                result = _recompute(op, operands, keep=keep)
                finite = bool(np.isfinite(result).all())
                names = ", ".join(str(r) for r in rows[:8])
                outcome = ("finite: those rows made the value" if finite
                           else "still non-finite: leaving those rows out does not fix it")
                text = f"{where} recomputed without batch row(s) {names}: {outcome}"
                out.append({"change": "without_rows", "ran": True, "finite": finite,
                            "loss": None, "rows": rows, "scope": scope, "text": text})  # fmt: skip
    out.append(_not_run("lr_x0.1", f"not run: {_NO_FUNCTION}"))
    return out


def _numpy_suspect_rows(monitor: Any, step: int) -> list[int]:
    try:
        found = monitor._probe_rows(1)
    except Exception:
        return []
    return suspect_batch_rows(found)


def _batch_len(monitor: Any) -> int | None:
    recent = getattr(monitor, "_recent", None)
    if not recent:
        return None
    _, inputs, targets, _ = recent[-1]
    for batch in (inputs, targets):
        shape = getattr(batch, "shape", None)
        if shape:
            return int(shape[0])
    return None


def _instruction(frame: Any) -> tuple[str, str]:
    """The operator or the function the frame is executing, and its source text."""
    code = frame.f_code
    lasti = frame.f_lasti
    span = ""
    op = "?"
    with contextlib.suppress(Exception):
        positions = list(code.co_positions())
        lineno, end_lineno, col, end_col = positions[lasti // 2]
        if lineno is not None and lineno == end_lineno and col is not None:
            text = linecache.getline(code.co_filename, lineno)
            span = text[col:end_col]
    with contextlib.suppress(Exception):
        for ins in dis.get_instructions(code):
            if ins.offset == lasti:
                if ins.opname.startswith("BINARY_OP") and ins.argrepr in _BINARY:
                    op = _BINARY[ins.argrepr]
                    if op == "power" and span.replace(" ", "").endswith("**2"):
                        op = "square"  # numpy computes x ** 2 as square
                elif ins.opname.startswith("CALL") and "(" in span:
                    op = span.split("(", 1)[0].rsplit(".", 1)[-1].strip() or "?"
                break
    return op, span


_LOGS = ("log", "log2", "log10", "log1p", "arctanh", "xlogy")
_DIVS = ("divide", "true_divide", "reciprocal", "floor_divide", "remainder", "sqrt", "std", "var",
         "norm", "mean")  # fmt: skip


def _why(kind: str, op: str) -> dict[str, Any]:
    if op in _LOGS or op.startswith("log"):
        if kind.startswith("divide"):
            return {"kind": "log_domain", "zero": True, "text": "its argument was exactly 0"}
        if kind.startswith("invalid"):
            return {"kind": "log_domain", "text": "its argument was negative (or NaN)"}
    if kind.startswith("divide"):
        return {"kind": "zero_denominator", "zero": True, "text": "its denominator was exactly 0"}
    if kind.startswith("overflow"):
        return {"kind": "past_range", "text": f"{op} overflowed: its result passed the range of "
                "its dtype"}  # fmt: skip
    if kind.startswith("invalid") and op in _DIVS:
        return {"kind": "zero_denominator", "zero": True,
                "text": "0/0 (or the root of a negative value)"}  # fmt: skip
    if kind.startswith("invalid") and op in ("add", "subtract", "multiply", "matmul", "sum"):
        return {"kind": "nonfinite_input", "text": f"invalid value in {op}: inf - inf or 0 * inf, "
                "from a value already non-finite"}  # fmt: skip
    return {"kind": "invalid", "text": f"invalid value in {op} (inf - inf, 0 * inf or a NaN "
            "input)"}  # fmt: skip


def _inputs(why: dict[str, Any]) -> str:
    if why.get("zero"):
        return "exactly zero"
    if why.get("kind") == "past_range":
        return "huge"
    return str(why.get("text", ""))
