"""The user's source line of the op that made a non-finite value.

Read, best first, from anomaly mode's traceback of an autograd node (:func:`traceback_source`),
the stack at the op (:func:`stack_source`), or, as a last resort, the ``loss.backward()``
function scanned for the op's spelling (:func:`scan_function`, marked ``guessed``). Which frames
are the user's is :mod:`nanscope._frames`' one list.
"""

from __future__ import annotations

import os
import re
import traceback
from typing import Any

from nanscope._frames import is_user_file

__all__ = ["SPELLING", "op_family", "scan_function", "stack_source", "traceback_source"]

#: how an op is spelled in source code, for the last-resort line scan
SPELLING: dict[str, tuple[str, ...]] = {
    "log": ("log(", ".log", "log_softmax", "xlogy"),
    "div": ("/", "div(", "true_divide"),
    "sqrt": ("sqrt(", ".sqrt", "** 0.5", "**0.5"),
    "rsqrt": ("rsqrt",),
    "norm": ("norm(", ".norm"),
    "pow": ("**", "pow("),
    "exp": ("exp(", ".exp"),
    "reciprocal": ("reciprocal", "1 /", "1/"),
    "cosine": ("cosine", "cos_sim"),
    "binary_cross_entropy": ("BCELoss", "binary_cross_entropy"),
    "mse_loss": ("mse_loss", "**", "pow("),
    "mul": ("*", "mul("),
    "mm": ("@", "matmul", "mm("),
    "addmm": ("@", "matmul", "linear"),
}

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)')
#: the replay's own calls of the model and of the loss (``probes/locate.py``): the frames
#: outside them are the replay's callers, not the op's
_REPLAY_FILE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "locate.py")
_REPLAY_FUNCS = ("_replay", "_replay_loss")


def _inside_replay(frames: list[tuple[str, int, str, str | None]]) -> int:
    """Index of the first frame below the replay's own call (frames outside it are not the op's)."""
    start = 0
    for i, (file, _line, func, _code) in enumerate(frames):
        if func in _REPLAY_FUNCS and os.path.realpath(file) == _REPLAY_FILE:
            start = i + 1
    return start


def _innermost_user(frames: list[tuple[str, int, str, str | None]]) -> dict[str, Any] | None:
    """``{"file", "line", "function"[, "code"]}`` of the innermost frame in the user's files."""
    for file, line, func, code in reversed(frames[_inside_replay(frames):]):
        if is_user_file(file):
            out: dict[str, Any] = {"file": os.path.abspath(file), "line": line, "function": func}
            if code:
                out["code"] = code.strip()
            return out
    return None


def traceback_source(entries: Any) -> dict[str, Any] | None:
    """The innermost user frame of anomaly mode's recorded traceback (a list of strings)."""
    if not entries:
        return None
    text = "".join(entries) if isinstance(entries, (list, tuple)) else str(entries)
    frames: list[tuple[str, int, str, str | None]] = [
        (m.group("file"), int(m.group("line")), m.group("func").strip(), None)
        for m in _FRAME.finditer(text)
    ]
    return _innermost_user(frames)


def stack_source(stack: list[traceback.FrameSummary]) -> dict[str, Any] | None:
    """The innermost user frame of a stack taken at the op."""
    return _innermost_user([(f.filename, int(f.lineno or 0), f.name, f.line) for f in stack])


def op_family(op: str) -> str:
    """The op's family for its spelling and its inputs (``LogBackward0`` -> ``"log"``)."""
    low = op.lower()
    if "special_entr" in low or "specialentr" in low or low == "entr":
        return "xlogy"  # -x log x: finite at 0, its gradient -(log x + 1) is not
    for family in ("rsqrt", "sqrt", "reciprocal", "binary_cross_entropy", "binarycrossentropy",
                   "xlogy", "log", "div", "norm", "pow", "exp", "cosine"):  # fmt: skip
        if family in low:
            return "binary_cross_entropy" if family == "binarycrossentropy" else family
    return low


def scan_function(site: Any, op: str) -> dict[str, Any] | None:
    """Last resort: the line of the ``loss.backward()`` function that spells the op."""
    if site is None or not getattr(site, "file", None):
        return None
    spellings = SPELLING.get(op_family(op))
    if not spellings:
        return None
    try:
        with open(site.file, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    start, end = 0, min(len(lines), int(site.line))
    # the enclosing function: walk up from the backward line to its `def`
    indent_of = lambda s: len(s) - len(s.lstrip())  # noqa: E731
    for i in range(end - 1, -1, -1):
        stripped = lines[i].lstrip()
        if stripped.startswith(("def ", "async def ")) and indent_of(lines[i]) < indent_of(
            lines[end - 1]
        ):
            start = i
            break
    for i in range(end - 1, start - 1, -1):
        code = lines[i].split("#", 1)[0]
        if any(s in code for s in spellings):
            return {"file": os.path.abspath(site.file), "line": i + 1, "code": lines[i].strip(),
                    "guessed": True}  # fmt: skip
    return None
