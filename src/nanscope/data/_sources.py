"""Turn whatever the user has into a Polars LazyFrame: files, directories, arrays, frames, Datasets.

Files are scanned lazily (``scan_parquet``/``scan_csv``/``scan_ipc``), so nothing is read until the
engine runs its streaming queries. NPY is memory-mapped and NPZ loaded, then wrapped. In-memory
objects are wrapped without copying where Polars allows it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from nanscope.errors import InputError

__all__ = ["EXTENSIONS", "Source", "resolve"]

#: file suffix -> format
EXTENSIONS: dict[str, str] = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "ipc",
    ".feather": "ipc",
    ".ipc": "ipc",
    ".npy": "npy",
    ".npz": "npz",
}

_TARGET_NAMES = ("y", "target", "label", "labels")


@dataclass
class Source:
    name: str
    make: Callable[[], pl.LazyFrame]
    files: list[str] = field(default_factory=list)
    default_target: str | None = None
    in_memory: bool = False
    #: given a read error, adjust the scan (e.g. read a column as text) and return True to retry.
    retry: Callable[[Exception], bool] | None = None
    #: what was skipped or changed while reading (also warned), kept in the report
    notes: list[str] = field(default_factory=list)


def resolve(obj: Any) -> Source:
    """A :class:`Source` for ``obj``; raises InputError for what cannot be read."""
    if isinstance(obj, (str, os.PathLike)):
        return _from_path(Path(obj))
    if isinstance(obj, pl.LazyFrame):
        return Source("LazyFrame", lambda: obj, in_memory=True)
    if isinstance(obj, pl.DataFrame):
        return _frame("polars DataFrame", obj)
    mod = type(obj).__module__ or ""
    if mod.startswith("pandas") and hasattr(obj, "columns"):
        return _frame("pandas DataFrame", _from_pandas(obj))
    if isinstance(obj, np.ndarray):
        return _frame(f"array {obj.shape}", _from_arrays([("", obj)], "array"))
    if isinstance(obj, tuple) and obj and all(isinstance(a, np.ndarray) for a in obj):
        parts = [("x", obj[0]), *(("y" if i == 1 else f"a{i}", a) for i, a in enumerate(obj) if i)]
        df = _from_arrays(parts, "arrays")
        return _frame("arrays", df, default_target="y" if len(obj) == 2 else None)
    if _is_torch_dataset(obj):
        return _from_torch(obj)
    raise InputError(
        f"cannot scan an object of type {type(obj).__name__}: pass a path, a numpy array, "
        f"a pandas/polars frame or a torch Dataset"
    )


def _frame(name: str, df: pl.DataFrame, default_target: str | None = None) -> Source:
    return Source(name, lambda: df.lazy(), default_target=default_target, in_memory=True)


def _from_pandas(obj: Any) -> pl.DataFrame:
    try:
        frame = obj.reset_index(drop=True)
        frame.columns = [str(c) for c in frame.columns]
        return pl.from_pandas(frame, nan_to_null=False)
    except Exception as exc:  # pragma: no cover - exotic pandas dtypes
        raise InputError(f"cannot convert the pandas DataFrame: {_first_line(exc)}") from exc


def _is_torch_dataset(obj: Any) -> bool:
    return any((t.__module__ or "").startswith("torch.utils.data") for t in type(obj).__mro__)


# --- files ---------------------------------------------------------------------------------------


def _from_path(path: Path) -> Source:
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in EXTENSIONS
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            known = ", ".join(sorted(EXTENSIONS))
            raise InputError(f"{path}: directory holds no data files ({known})")
        fmts = {EXTENSIONS[p.suffix.lower()] for p in files}
        for p in files:
            _check_readable(p)
        if fmts == {"parquet"}:
            strs = [str(p) for p in files]
            return Source(str(path), lambda: pl.scan_parquet(strs), files=strs)
        parts = [_from_file(p) for p in files]
        targets = {s.default_target for s in parts}

        def make() -> pl.LazyFrame:
            return pl.concat([s.make() for s in parts], how="vertical_relaxed")

        return Source(
            str(path),
            make,
            files=[str(p) for p in files],
            default_target=targets.pop() if len(targets) == 1 else None,
            notes=[note for s in parts for note in s.notes],
        )
    _check_readable(path)
    return _from_file(path)


def _check_readable(path: Path) -> None:
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: cannot be read (permission denied)")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty")


def _from_file(path: Path) -> Source:
    fmt = EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        known = ", ".join(sorted(EXTENSIONS))
        raise InputError(f"{path}: unknown file type '{path.suffix or path.name}' (known: {known})")
    name = str(path)
    if fmt == "parquet":
        return Source(name, lambda: pl.scan_parquet(path), files=[name])
    if fmt == "ipc":
        return Source(name, lambda: pl.scan_ipc(path), files=[name])
    if fmt in ("csv", "tsv"):
        return _csv(path, "\t" if fmt == "tsv" else ",")
    if fmt == "npy":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as exc:
            raise InputError(f"{path}: not a readable .npy file ({_first_line(exc)})") from exc
        df = _from_arrays([("", arr)], name)
        return Source(name, lambda: df.lazy(), files=[name])
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = [(k, z[k]) for k in z.files]
    except Exception as exc:
        raise InputError(f"{path}: not a readable .npz file ({_first_line(exc)})") from exc
    if not arrays:
        raise InputError(f"{path}: the .npz archive holds no arrays")
    df = _from_arrays(arrays, name)
    keys = [k for k, _ in arrays]
    target = next((k for k in _TARGET_NAMES if k in keys), None)
    return Source(name, lambda: df.lazy(), files=[name], default_target=target)


_PARSE_COL = re.compile(r"at column '([^']+)'")
#: the longest header line scanned: a longer first line is not a CSV header (a binary file, a
#: JSON blob, a file with no line breaks); reading it whole would cost its size many times over
MAX_HEADER_BYTES = 1 << 20
#: how much of the file is looked at to tell text from binary
_SNIFF_BYTES = 1 << 16
_CHUNK = 1 << 24
#: words a float cell may hold that Polars' type inference takes for text (np.savetxt, str(float))
_FLOAT_WORDS = ("nan", "-nan", "+nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity")
_TEXT_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _sniff_csv(path: Path) -> None:
    """Refuse, with one line, a file that is not CSV text: NUL bytes or mostly non-text lines in
    its first 64 KiB, or a first line longer than :data:`MAX_HEADER_BYTES`."""
    with path.open("rb") as fh:
        head = fh.read(MAX_HEADER_BYTES + 1)
    sample = head[:_SNIFF_BYTES]
    if b"\x00" in sample:
        raise InputError(f"{path}: looks binary (it holds NUL bytes), not CSV text")
    newline = head.find(b"\n")
    if newline == -1 and len(head) > MAX_HEADER_BYTES:
        raise InputError(
            f"{path}: the first line is longer than {MAX_HEADER_BYTES >> 20} MiB with no line "
            "break; that is no CSV header nanscope can scan (is the file CSV text?)"
        )
    lines = sample.split(b"\n")
    if len(lines) > 1 and len(sample) == _SNIFF_BYTES:
        lines = lines[:-1]  # the last one is cut by the sample
    bad = sum(1 for line in lines if not _text_line(line))
    header_binary = bool(lines) and _TEXT_CONTROL.search(lines[0]) is not None
    if header_binary or bad > max(2, len(lines) // 4):
        raise InputError(
            f"{path}: does not look like CSV text ({bad} of the first {len(lines)} lines are not "
            "UTF-8 text); is it a binary file with a .csv name?"
        )


def _text_line(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not _TEXT_CONTROL.search(line)


def _invalid_utf8_lines(path: Path) -> list[int]:
    """0-based line numbers (header = line 0) that are not valid UTF-8; one streaming pass that
    decodes 16 MiB at a time and looks at single lines only where a chunk does not decode."""
    bad: list[int] = []
    line_no = 0
    rest = b""
    with path.open("rb") as fh:
        while True:
            block = fh.read(_CHUNK)
            data = rest + block
            if not block:
                chunk, rest = data, b""
            else:
                cut = data.rfind(b"\n")
                if cut == -1:
                    rest = data
                    continue
                chunk, rest = data[: cut + 1], data[cut + 1 :]
            if chunk:
                try:
                    chunk.decode("utf-8")
                except UnicodeDecodeError:
                    for i, line in enumerate(chunk.split(b"\n")):
                        try:
                            line.decode("utf-8")
                        except UnicodeDecodeError:
                            bad.append(line_no + i)
                line_no += chunk.count(b"\n")
            if not block:
                return bad


_CLEANED: list[str] = []


def _remove_cleaned() -> None:  # pragma: no cover - runs at interpreter exit
    for name in _CLEANED:
        with contextlib.suppress(OSError):
            os.unlink(name)


def _without_invalid_cells(path: Path, sep: str, bad: list[int]) -> Path:
    """A temporary copy of the CSV whose cells holding bytes that are not UTF-8 are empty: every
    other cell and every row (so every row number) stays as it was."""
    import csv
    import io

    wanted = set(bad)
    fd, name = tempfile.mkstemp(prefix="nanscope-scan-", suffix=path.suffix)
    _CLEANED.append(name)
    if len(_CLEANED) == 1:
        atexit.register(_remove_cleaned)
    with path.open("rb") as src, os.fdopen(fd, "wb") as out:
        for number, line in enumerate(src):
            if number in wanted:
                text = line.decode("utf-8", errors="replace").rstrip("\r\n")
                cells = next(csv.reader([text], delimiter=sep), [])
                cells = ["" if "\ufffd" in c else c for c in cells]
                buffer = io.StringIO()
                csv.writer(buffer, delimiter=sep, lineterminator="\n").writerow(cells)
                line = buffer.getvalue().encode("utf-8")
            out.write(line)
    return Path(name)


def _csv(path: Path, sep: str) -> Source:
    """A CSV scan; a column whose text cannot be parsed as its inferred type is read as text.

    Before: a file that is not CSV text is refused (:func:`_sniff_csv`); cells that are not UTF-8
    are read as empty, with a warning that counts them and names their lines; a column whose
    cells are numbers or ``nan``/``inf`` words (what ``np.savetxt`` writes) is read as floats.
    """
    _sniff_csv(path)
    bad = _invalid_utf8_lines(path)
    notes: list[str] = []
    read_path = path
    if 0 in bad:
        raise InputError(f"{path}: the header line is not UTF-8 text (save the file as UTF-8)")
    if bad:
        read_path = _without_invalid_cells(path, sep, bad)
        shown = ", ".join(str(n + 1) for n in bad[:5]) + (", ..." if len(bad) > 5 else "")
        rows = "row holds" if len(bad) == 1 else "rows hold"
        notes.append(
            f"{path}: {len(bad)} {rows} bytes that are not UTF-8 (file line {shown}); "
            "those cells were read as empty (null), the rest of each row was scanned"
        )
        _warn(notes[-1])
    overrides: dict[str, Any] = {}
    floats_checked = False

    def scan() -> pl.LazyFrame:
        return pl.scan_csv(
            read_path,
            separator=sep,
            infer_schema_length=10_000,
            schema_overrides=dict(overrides) or None,
        )

    def make() -> pl.LazyFrame:
        nonlocal floats_checked
        if not floats_checked:
            floats_checked = True
            overrides.update(_float_word_columns(scan()))
        return scan()

    def retry(exc: Exception) -> bool:
        m = _PARSE_COL.search(str(exc))
        if m and overrides.get(m.group(1)) is not pl.String and "could not parse" in str(exc):
            overrides[m.group(1)] = pl.String
            return True
        return False

    return Source(str(path), make, files=[str(path)], retry=retry, notes=notes)


def _float_word_columns(lf: pl.LazyFrame) -> dict[str, Any]:
    """Text columns whose first 10,000 cells are all numbers or nan/inf words: read as Float64
    (a later cell that is really text sends the column back to text through ``retry``)."""
    try:
        schema = lf.collect_schema()
        text = [name for name, dt in schema.items() if dt == pl.String]
        if not text:
            return {}
        head = lf.select(text).head(10_000).collect()
    except Exception:
        return {}
    out: dict[str, Any] = {}
    for name in text:
        col = head.get_column(name)
        words = col.str.strip_chars().str.to_lowercase()
        is_word = words.is_in(list(_FLOAT_WORDS))
        parses = col.cast(pl.Float64, strict=False).is_not_null()
        filled = col.is_not_null()
        if bool(is_word.any()) and bool((is_word | parses | ~filled).all()):
            out[name] = pl.Float64
    return out


def _warn(message: str) -> None:
    from nanscope._messages import warn

    warn(message)


# --- arrays --------------------------------------------------------------------------------------


def _from_arrays(parts: Sequence[tuple[str, Any]], where: str) -> pl.DataFrame:
    """Columns from named arrays: 1-D -> one column, N-D -> one column per trailing element."""
    cols: dict[str, Any] = {}
    n: int | None = None
    for key, raw in parts:
        arr = np.asarray(raw)
        if arr.dtype == object or arr.dtype.kind in "OV":
            raise InputError(f"{where}: array '{key or 'data'}' has dtype {arr.dtype}, not numbers")
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if n is None:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise InputError(
                f"{where}: arrays have different lengths ({n} and {arr.shape[0]} for "
                f"'{key}'); scan them separately"
            )
        if arr.ndim == 1:
            cols[key or "0"] = arr
        else:
            flat = arr.reshape(arr.shape[0], -1)
            for j in range(flat.shape[1]):
                cols[f"{key}[{j}]" if key else str(j)] = flat[:, j]
    if not n:
        raise InputError(f"{where}: the data has no rows")
    return pl.DataFrame({k: np.ascontiguousarray(v) for k, v in cols.items()})


def _from_torch(ds: Any) -> Source:
    """Iterate a torch Dataset item by item into columns: (x, y) pairs, dicts or tensors."""
    import torch  # only here: the object is a torch Dataset

    def to_np(v: Any) -> np.ndarray:
        if isinstance(v, torch.Tensor):
            return np.asarray(v.detach().cpu().numpy())
        return np.asarray(v)

    keys: list[str] | None = None
    rows: dict[str, list[np.ndarray]] = {}
    try:
        n = len(ds)
        items: Any = (ds[i] for i in range(n))
    except TypeError:
        items = iter(ds)
    count = 0
    for item in items:
        if isinstance(item, dict):
            named = [(str(k), to_np(v)) for k, v in item.items()]
        elif isinstance(item, (tuple, list)):
            labels = ["x", "y"] if len(item) == 2 else [f"a{i}" for i in range(len(item))]
            named = list(zip(labels, (to_np(v) for v in item)))
        else:
            named = [("x", to_np(item))]
        if keys is None:
            keys = [k for k, _ in named]
            rows = {k: [] for k in keys}
        for k, v in named:
            rows[k].append(v.reshape(-1))
        count += 1
    if count == 0 or keys is None:
        raise InputError(f"{type(ds).__name__}: the Dataset has no items")
    try:
        parts = [(k, np.stack(rows[k])) for k in keys]
    except ValueError as exc:
        raise InputError(
            f"{type(ds).__name__}: items have different shapes ({_first_line(exc)})"
        ) from exc
    parts = [(k, a[:, 0] if a.shape[1] == 1 else a) for k, a in parts]
    df = _from_arrays(parts, type(ds).__name__)
    target = next((k for k in _TARGET_NAMES if k in keys), None)
    name = f"{type(ds).__name__} ({count} items)"
    return Source(name, lambda: df.lazy(), default_target=target, in_memory=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
