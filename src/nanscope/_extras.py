"""Optional dependencies: which extra of ``pip install 'nanscope[...]'`` brings which package.

The core needs numpy, orjson and rich; everything else is an extra, imported only where it is
used. When one is missing, the user gets one line that names the extra, never a traceback::

    >>> extra_for("polars"), extra_for("torch.nn"), extra_for("numpy")
    ('data', 'torch', None)
    >>> install_hint("polars")
    "pip install 'nanscope[data]'"

:func:`needs` turns a :class:`ModuleNotFoundError` for one of these packages into a
:class:`~nanscope.errors.MissingExtraError` (a ``ModuleNotFoundError`` and a
:class:`~nanscope.errors.NanscopeError`) whose message is that line; the command line prints it as
``nanscope COMMAND: error: ...`` with exit code 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from nanscope.errors import MissingExtraError

__all__ = ["EXTRAS", "extra_for", "install_hint", "missing", "needs"]

#: top-level package -> the extra that installs it (see ``pyproject.toml``)
EXTRAS: dict[str, str] = {
    "torch": "torch",
    "polars": "data",
    "pyarrow": "data",
    "matplotlib": "plots",
    "tensorboard": "logs",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "transformers": "transformers",
    "accelerate": "transformers",
    "keras": "keras",
}


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name is read by its top-level package)."""
    if not module:
        return None
    return EXTRAS.get(module.split(".", 1)[0])


def install_hint(module: str) -> str:
    """``pip install 'nanscope[data]'`` for ``polars``."""
    return f"pip install 'nanscope[{extra_for(module) or 'all'}]'"


def missing(exc: BaseException, what: str) -> MissingExtraError | None:
    """The one-line error for ``exc`` when it is a missing optional package, else ``None``.

    ``what`` is the feature that needs it (``"nanscope scan"``, ``"nanscope.watch"``).
    """
    if not isinstance(exc, ModuleNotFoundError):
        return None
    name = exc.name or ""
    extra = extra_for(name)
    if extra is None:
        return None
    package = name.split(".", 1)[0]
    return MissingExtraError(
        f"{what} needs {package}, which is not installed here: {install_hint(package)}",
        name=package,
        extra=extra,
    )


@contextmanager
def needs(what: str) -> Iterator[None]:
    """Inside, a missing optional package raises :class:`~nanscope.errors.MissingExtraError`
    naming ``what`` and the extra to install; any other error passes unchanged."""
    try:
        yield
    except ModuleNotFoundError as exc:
        error = missing(exc, what)  # (an inner one is named again by what the user called)
        if error is None:
            raise
        raise error from None
