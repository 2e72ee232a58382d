"""Errors raised by nanscope.

All of them derive from one root, so ``except nanscope.NanscopeError`` catches everything nanscope
raises on purpose::

    NanscopeError
    ├── DivergenceError (also FloatingPointError)   a watched fit was stopped; carries .diagnosis
    ├── UsageError (also ValueError)                 a bad argument; message names it
    ├── InputError                                   a file or object nanscope was asked to read
    │   └── TraceError                               ... a trace or log that cannot be read
    └── MissingExtraError (also ModuleNotFoundError) an optional package is not installed; the
                                                     message names the extra to install

The command line turns ``UsageError``, ``InputError`` and ``MissingExtraError`` into one line on
stderr and exit code 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanscope.diagnose.diagnosis import Diagnosis

__all__ = [
    "DivergenceError",
    "InputError",
    "MissingExtraError",
    "NanscopeError",
    "TraceError",
    "UsageError",
]


class NanscopeError(Exception):
    """Root of every error nanscope raises on purpose."""


class DivergenceError(NanscopeError, FloatingPointError):
    """A watched fit went non-finite or diverged; ``.diagnosis`` says why and what to do."""

    def __init__(self, message: str, diagnosis: Diagnosis | None = None) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.diagnosis))


class UsageError(NanscopeError, ValueError):
    """An argument nanscope was given is wrong; the message names it."""


class InputError(NanscopeError):
    """A file or object nanscope was asked to read is missing, empty or malformed."""


class TraceError(InputError):
    """A trace or a log cannot be read."""


class MissingExtraError(NanscopeError, ModuleNotFoundError):
    """An optional package a feature needs is not installed: ``.name`` is the package, ``.extra``
    the extra of ``pip install 'nanscope[EXTRA]'`` that brings it; the message says both."""

    def __init__(self, message: str, *, name: str, extra: str) -> None:
        super().__init__(message, name=name)
        self.extra = extra

    def __reduce__(self) -> tuple[Any, ...]:
        return (_missing_extra, (str(self), self.name, self.extra))


def _missing_extra(message: str, name: str, extra: str) -> MissingExtraError:
    return MissingExtraError(message, name=name, extra=extra)
