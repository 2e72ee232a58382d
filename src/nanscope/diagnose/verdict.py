"""The verdict vocabulary: what a diagnosis says about a whole run, one typed name per verdict.

A :class:`Verdict` is a ``str`` (``Verdict.HEALTHY == "healthy"``), so a diagnosis, its JSON and
every comparison with a plain string read exactly as before; the enum adds the two facts callers
used to retype by hand: which verdict to report first (:attr:`Verdict.rank`) and which ones are a
failure found at an update (:attr:`Verdict.is_failure`).

* failures: ``nonfinite``, ``diverging``, ``suspect``;
* ``healthy``: watched, nothing wrong seen;
* inconclusive (:attr:`Verdict.is_inconclusive`, never healthy, no failure found either; cause
  ``unknown``): ``unobserved`` (nothing recorded), ``interrupted`` (stopped from outside),
  ``crashed`` (the script's own exception).

Verdicts read from a file may name none of these (a newer version's): :func:`is_failure`,
:func:`is_inconclusive` and :func:`rank_of` take any value and treat such a one as a failure,
ranked last.
"""

from __future__ import annotations

from nanscope._vocabulary import Vocabulary

__all__ = ["UNRANKED", "Verdict", "is_failure", "is_inconclusive", "rank_of"]


class Verdict(Vocabulary):
    """One run's verdict; members are listed in the order of the ``nanscope.diagnosis/1`` schema."""

    HEALTHY = "healthy"
    DIVERGING = "diverging"
    NONFINITE = "nonfinite"
    SUSPECT = "suspect"
    UNOBSERVED = "unobserved"
    INTERRUPTED = "interrupted"
    CRASHED = "crashed"

    @property
    def rank(self) -> int:
        """Which diagnosis to report when several monitors (or ranks) have one: lowest first."""
        return _RANK[self]

    @property
    def is_failure(self) -> bool:
        """A failure was found at an update: ``nonfinite``, ``diverging`` or ``suspect``."""
        return self in _FAILURES

    @property
    def is_inconclusive(self) -> bool:
        """No failure found, and not healthy either: the run was not watched to its end."""
        return self in _INCONCLUSIVE


#: a script that crashed or was stopped from outside outranks a healthy one; one that saw
#: nothing never hides one that did
_RANK: dict[Verdict, int] = {
    Verdict.NONFINITE: 0,
    Verdict.DIVERGING: 1,
    Verdict.CRASHED: 2,
    Verdict.SUSPECT: 3,
    Verdict.INTERRUPTED: 4,
    Verdict.HEALTHY: 5,
    Verdict.UNOBSERVED: 6,
}
_FAILURES = frozenset({Verdict.NONFINITE, Verdict.DIVERGING, Verdict.SUSPECT})
_INCONCLUSIVE = frozenset({Verdict.UNOBSERVED, Verdict.INTERRUPTED, Verdict.CRASHED})

#: the rank of a value that names no verdict: after every verdict
UNRANKED = 9


def _known(value: object) -> Verdict | None:
    try:
        return Verdict(value)
    except (ValueError, TypeError):
        return None


def is_failure(verdict: object) -> bool:
    """``verdict`` (a :class:`Verdict`, a string from a diagnosis's JSON, or None) is a failure
    found at an update; a value that names no verdict counts as one (it is never hidden)."""
    known = _known(verdict)
    return known is None or known.is_failure


def is_inconclusive(verdict: object) -> bool:
    """``verdict`` (any value) is inconclusive (:attr:`Verdict.is_inconclusive`)."""
    known = _known(verdict)
    return known is not None and known.is_inconclusive


def rank_of(verdict: object) -> int:
    """:attr:`Verdict.rank` of any value; :data:`UNRANKED` for one that names no verdict."""
    known = _known(verdict)
    return UNRANKED if known is None else known.rank
