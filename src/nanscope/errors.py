"""Errors raised by nanscope.

All of them derive from one root, so ``except nanscope.NanscopeError`` catches everything nanscope
raises on purpose::

    NanscopeError
    ├── DivergenceError (also FloatingPointError)   a watched fit was stopped; carries .diagnosis
    ├── UsageError (also ValueError)                 a bad argument; message names it
    └── InputError                                   a file or object nanscope was asked to read
        └── TraceError                               ... a trace or log that cannot be read

The command line turns ``UsageError`` and ``InputError`` into one line on stderr and exit code 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanscope.diagnose.diagnosis import Diagnosis

__all__ = ["DivergenceError", "InputError", "NanscopeError", "TraceError", "UsageError"]


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
