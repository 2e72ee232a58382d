"""The allocator a benchmark runs under, and the page faults it pays.

On glibc, a CPU tensor of more than 128 KiB is its own ``mmap``: freed, it goes back to the
kernel, and the next update's tensor of the same size is faulted in again, page by page. On the
development machine (2-core KVM guest) the MLP of ``overhead.py`` paid 500-960 minor faults per
update that way, 0.7-1.2 ms of a 3-4 ms step; which tensors paid depended on the order of
allocations, so a plain and a watched arm of the same process differed by up to 5% for reasons
that were not nanscope's work, and two processes of the same code disagreed by as much.

:func:`pin_allocator` keeps freed memory in the process (``mallopt``: no ``mmap`` below 64 MiB,
no trimming of the heap), the setting PyTorch's CPU tuning guides reach with jemalloc or
tcmalloc. The faults go to zero and the plain step is the step's own arithmetic, so what is
left between two arms is the work each one does. Each script that pins says so in its header,
and ``--malloc default`` runs it under the allocator as it comes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def pin_allocator() -> str:
    """Keep freed memory in the process for the rest of the run; says what was done."""
    if not sys.platform.startswith("linux"):
        return "allocator as it comes (not glibc)"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = (
            libc.mallopt(_M_MMAP_THRESHOLD, 1 << 26)
            and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 28)
            and libc.mallopt(_M_TOP_PAD, 1 << 26)
        )
    except (OSError, AttributeError):
        ok = False
    if not ok:
        return "allocator as it comes (mallopt unavailable)"
    return "allocator pinned (glibc mallopt: no mmap below 64 MiB, no trim; see bench/_alloc.py)"


def minor_faults() -> int:
    """Minor page faults of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
