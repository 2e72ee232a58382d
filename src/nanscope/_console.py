"""Text that fits the terminal: its width, rich consoles sized to it, wrapping with hanging indents.

Every report, table and story nanscope prints goes through these, so that at 80 columns no line
runs past the edge and no word is split:

- :func:`columns`: the width to fit: ``$COLUMNS`` when set, else the terminal's when the stream is
  one, else ``None`` (a file or a pipe: lines stay whole, for ``grep``);
- :func:`wrap`: a paragraph cut at spaces only, its later lines indented under the first's text
  (``  1. Cut the learning rate ...`` continues under ``Cut``);
- :func:`table`: rows of cells laid out in aligned columns that fit the width: cells (and
  headers) of several words wrap at their spaces; when even that is too wide, each row becomes a
  block of ``header: value`` lines;
- :func:`rich_text`: rich renderables rendered to a string at that width, in colour or plain.

>>> wrap("one two three four", 12, "  - ")
['  - one two', '    three', '    four']
>>> wrap("unbreakable-word-longer-than-the-width", 10, "> ")
['> unbreakable-word-longer-than-the-width']
>>> for line, _ in table(["name", "best loss"], [["a", "1.5"], ["bb", "0.25"]], 12, right={1}):
...     print(line)
name    best
        loss
a        1.5
bb      0.25
"""

from __future__ import annotations

import io
import os
import sys
import textwrap
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["NO_LIMIT", "columns", "rich_text", "shown_path", "table", "wrap"]

#: the width a rich console gets when there is no terminal to fit: tables take their own width
NO_LIMIT = 4000


def columns(stream: IO[str] | None = None) -> int | None:
    """The width to fit: ``$COLUMNS``, else the terminal's (when ``stream``, default stdout, is
    one), else ``None``: no limit."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return max(20, int(env))
    stream = stream if stream is not None else sys.stdout
    try:
        if stream.isatty():
            return max(20, os.get_terminal_size(stream.fileno()).columns)
    except (AttributeError, OSError, ValueError):
        pass
    return None


def shown_path(path: object) -> str:
    """A path as a report shows it: relative to the current folder when inside it (shorter)."""
    text = str(path)
    try:
        relative = Path(text).resolve().relative_to(Path.cwd().resolve())
    except (OSError, ValueError):
        return text
    return str(relative) if str(relative) != "." else text


def wrap(text: str, width: int | None, first: str = "", rest: str | None = None) -> list[str]:
    """``text`` after ``first`` as lines of at most ``width`` characters, cut at spaces only (a
    word longer than the line stays whole); later lines start with ``rest`` (default: as many
    spaces as ``first`` is long, a hanging indent). No ``width``: one line."""
    hang = " " * len(first) if rest is None else rest
    if width is None:
        return [first + text]
    lines = textwrap.wrap(
        text,
        width=max(width, len(first) + 8),
        initial_indent=first,
        subsequent_indent=hang,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [first.rstrip()]


def rich_text(*renderables: Any, width: int | None, color: bool) -> str:
    """The renderables (tables, :class:`rich.text.Text`) as printed at ``width`` (``None``: no
    limit), with ANSI colours only when ``color``."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width or NO_LIMIT,
        force_terminal=color,
        color_system="standard" if color else None,
        no_color=not color,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )
    for item in renderables:
        console.print(item)
    # a table pads its lines to its width: no trailing spaces
    return "\n".join(line.rstrip() for line in buffer.getvalue().split("\n"))


#: spaces between two columns of :func:`table`
GAP = 2


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int | None,
    *,
    right: Collection[int] = (),
    indent: str = "",
) -> list[tuple[str, int]]:
    """``rows`` under ``headers`` as aligned lines of at most ``width`` characters (``None``: no
    limit), each with the index of its row (``-1`` for the header): the columns ``right`` are
    right-aligned. A word is never split: a cell or header of several words wraps at its spaces
    when the columns do not fit whole; when not even the longest word of each column fits, each
    row is printed as a block of ``header: value`` lines instead."""
    n = len(headers)
    cells = [list(headers)] + [[str(c) for c in row] for row in rows]
    natural = [max(len(r[j]) for r in cells) for j in range(n)]
    least = [max(len(w) for r in cells for w in (r[j].split() or [""])) for j in range(n)]
    room = None if width is None else width - len(indent) - GAP * (n - 1)
    if room is None or sum(natural) <= room:
        widths = natural
    elif sum(least) <= room:
        widths, spare = list(least), room - sum(least)
        # whole columns first, the narrowest shortfall first; what is left widens the others
        order = sorted(range(n), key=lambda j: natural[j] - least[j])
        for j in order:
            if natural[j] - widths[j] <= spare:
                spare -= natural[j] - widths[j]
                widths[j] = natural[j]
        for j in reversed(order):  # the widest shortfall gains the most lines back
            extra = min(spare, natural[j] - widths[j])
            widths[j] += extra
            spare -= extra
    else:
        return _blocks(headers, cells[1:], width, indent)
    out: list[tuple[str, int]] = []
    for index, row in enumerate(cells):
        parts = [textwrap.wrap(c, widths[j], break_long_words=False, break_on_hyphens=False)
                 or [""] for j, c in enumerate(row)]  # fmt: skip
        for k in range(max(len(p) for p in parts)):
            line = [
                (p[k] if k < len(p) else "").rjust(w) if j in right
                else (p[k] if k < len(p) else "").ljust(w)
                for j, (p, w) in enumerate(zip(parts, widths))
            ]  # fmt: skip
            out.append((indent + (" " * GAP).join(line).rstrip(), index - 1))
    return out


def _blocks(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None, indent: str
) -> list[tuple[str, int]]:
    """Each row as ``header: value`` lines (the values aligned), a blank line between rows."""
    pad = max(len(h) for h in headers) + 2
    out: list[tuple[str, int]] = []
    for index, row in enumerate(rows):
        if index:
            out.append(("", index))
        for header, value in zip(headers, row):
            if value:
                label = indent + f"{header}: ".ljust(pad)
                out.extend((line, index) for line in wrap(value, width, label))
    return out
