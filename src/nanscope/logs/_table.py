"""Tables in text logs: a header row of column names, then rows of values aligned under it.

YOLO prints one per epoch (``Epoch GPU_mem box_loss obj_loss cls_loss Instances Size``, then
``1/100 3.72G 0.04613 0.06738 0.02063 232 640: 100%|####| 8/8 [00:05<00:00]``, a tqdm bar
redrawn on each batch); fastai prints ``epoch train_loss valid_loss accuracy time``; a printed
DataFrame adds an index column; a table copied from a notebook separates its columns with tabs
(``Step<TAB>Training Loss<TAB>Validation Loss``). :meth:`Table.header` reads a header row,
:meth:`Table.row` one row under it.

Which column is the loss: a column named as the whole loss (``loss``, ``train_loss``,
``total_loss``); else a total column (``total``, ``T``) whose value is the sum of the numbers
before it (checked on the first finite row: YOLOv5's ``box obj cls total``); else the sum of the
loss columns (``box_loss + obj_loss + cls_loss``, the loss YOLO minimises, per image).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from nanscope.logs._common import LOSS_KEYS, role_of

__all__ = ["TQDM_TAIL", "Table", "sums_to"]

#: Where a tqdm bar starts after a row or a header used as the bar's description.
TQDM_TAIL = re.compile(r":?\s+\d{1,3}%\|")
_NAME = re.compile(r"[A-Za-z_%@][\w.%@:/()\-]*")
_MEMORY = re.compile(r"\d+(?:\.\d+)?[KMGT]i?B?", re.IGNORECASE)
_CLOCK = re.compile(r"\d{1,3}(?::\d\d){1,2}(?:\.\d+)?")
_OF = re.compile(r"(\d{1,15})/(\d{1,15})")
_EMPTY = frozenset({"-", "no log", "none", "n/a"})
_TOTAL = frozenset({"t", "total", "tot", "sum"})


@dataclass
class Table:
    """A header's columns and the role of each: ``epoch``, ``step``, ``loss``, ``val_loss``,
    ``lr``, ``grad_norm``, ``total`` (a total to check), ``part`` (a loss summed into the loss
    when no column is the whole loss), or ``""`` (read as nothing)."""

    names: list[str]
    roles: list[str]
    tabs: bool
    #: the loss is the sum of the ``part`` columns
    summed: bool = False
    #: the total column is checked on the first finite row, then trusted
    checked: bool = False
    loss_name: str = field(default="")

    @staticmethod
    def header(line: str) -> Table | None:
        """The table a header row opens, or None when the line is not a header row (a name
        that is a number, fewer than three names)."""
        cut = TQDM_TAIL.search(line)
        text = line[: cut.start()] if cut else line
        tabs = "\t" in text.strip()
        names = [n.strip() for n in text.split("\t")] if tabs else text.split()
        names = [n for n in names if n]
        if len(names) < 3 or not all(_NAME.fullmatch(n) or (tabs and n) for n in names):
            return None
        if any(_number(n) is not None or _OF.fullmatch(n) for n in names):
            return None
        roles: list[str] = []
        for name in names:
            role = role_of(name)
            if role is None:
                roles.append("total" if name.lower() in _TOTAL else "")
            elif role[0] == "loss" and role[1] >= len(LOSS_KEYS):
                roles.append("part")  # a named part of the loss (box_loss)
            else:
                roles.append(role[0])
        table = Table(names, roles, tabs)
        if "loss" in roles:
            table.roles = ["" if r in ("part", "total") else r for r in roles]
            table.loss_name = names[roles.index("loss")]
        elif "total" in roles:
            table.roles = ["" if r == "part" else r for r in roles]
            table.loss_name = names[roles.index("total")]
        elif "part" in roles:
            table.summed = True
            table.loss_name = " + ".join(n for n, r in zip(names, roles) if r == "part")
        return table

    @property
    def reads_loss(self) -> bool:
        return bool(self.loss_name) or "val_loss" in self.roles

    def row(self, line: str) -> dict[str, float | int] | None:
        """The values of one row under this header (``loss``, ``val_loss``, ``lr``,
        ``grad_norm``, ``epoch``, ``step``), or None when the line is not such a row."""
        cut = TQDM_TAIL.search(line)
        text = line[: cut.start()] if cut else line
        cells = [c.strip() for c in text.split("\t")] if self.tabs else text.split()
        if len(cells) == len(self.roles) + 1 and cells[0].isdigit():
            cells = cells[1:]  # a printed DataFrame's index
        if len(cells) != len(self.roles):
            return None
        values: dict[str, float | int] = {}
        parts: list[float] = []
        before: list[str] = []
        total: str | None = None
        for cell, role in zip(cells, self.roles):
            number = _number(cell)
            if number is None and not _other_cell(cell):
                return None
            if role in ("epoch", "step"):
                whole = _OF.fullmatch(cell)
                if whole is not None:
                    values[role] = int(whole.group(1))
                elif number is not None and number == int(number):
                    values[role] = int(number)
                else:
                    return None
            elif role == "total":
                total = cell
            elif role == "part":
                if number is None:
                    return None
                parts.append(number)
            elif role and number is not None:
                values[role] = number
            elif total is None and number is not None and ("." in cell or cell[-1].isalpha()):
                before.append(cell)  # a number the total may add up
        if total is not None:
            if not self.checked:
                if _number(total) is None or not sums_to(total, before):
                    return None
                self.checked = math.isfinite(_number(total) or math.nan)
            value = _number(total)
            if value is not None:
                values["loss"] = value
        if self.summed and parts:
            values["loss"] = math.fsum(parts) if all(map(math.isfinite, parts)) else math.nan
        if not any(key in values for key in ("loss", "val_loss")):
            return None
        return values


def sums_to(total: str, parts: list[str]) -> bool:
    """Whether the number ``total`` is the sum of two or more ``parts`` (all as printed, so to
    within their rounding), or is non-finite where one of them is."""
    if len(parts) < 2:
        return False
    value = float(total)
    values = [float(p) for p in parts]
    if not math.isfinite(value):
        return not all(math.isfinite(v) for v in values)
    if not all(math.isfinite(v) for v in values):
        return False
    slack = sum(_half_unit(text) for text in [total, *parts]) + 1e-9 * abs(value)
    return abs(math.fsum(values) - value) <= slack * 1.01


def _half_unit(text: str) -> float:
    """Half a unit of the last printed digit of a number (``0.125`` -> 0.0005, ``1.5e-03`` ->
    5e-05): how far the printed value may be from the one that was rounded."""
    mantissa, _, exponent = text.lower().partition("e")
    digits = len(mantissa.partition(".")[2])
    try:
        power = int(exponent) if exponent else 0
    except ValueError:
        power = 0
    return 0.5 * 10.0 ** (power - digits)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _other_cell(cell: str) -> bool:
    """A cell that is not a number but may stand in a row: memory (``3.72G``), a clock
    (``00:12``), a count of a total (``1/100``), an empty mark (``-``, ``No log``)."""
    return bool(
        _MEMORY.fullmatch(cell)
        or _CLOCK.fullmatch(cell)
        or _OF.fullmatch(cell)
        or cell.lower() in _EMPTY
    )
