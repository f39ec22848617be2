"""Large fresh outputs on transparent huge pages: the first write faults 2 MB pages, not 4 KB ones.

A gradient the size of a large activation (MobileNetV2's 96 x 56 x 56 at batch 32: 38.5 MB) is
often memory no one has touched: a new ``mmap`` (glibc serves an allocation past its mmap
threshold so when no freed piece of the heap fits it) or heap pages given back to the system and
taken again. The kernel that writes it first then takes a page fault per 4 KB (9,409 for 38.5 MB:
12-13 ms on a 2-core Zen 3 virtual machine, more than the kernel's arithmetic). :func:`empty`
finds such an output (its first page not resident: ``mincore``) and advises the kernel to back its
whole 2 MB extents with huge pages (``madvise(MADV_HUGEPAGE)``, as PyTorch's own allocator does for
every tensor under ``THP_MEM_ALLOC_ENABLE=1``): 722 faults, 3.2-3.6 ms for the same allocation and
write. Memory already resident (a reused piece of the heap: no faults to save) is left alone.

The advice covers only the tensor's own extents and lasts as long as the mapping under them: a
mapping of its own goes with the tensor; on the heap, the range keeps it, and a later allocation
there that faults takes huge pages too. Where the system has no ``madvise`` / ``mincore`` (not
Linux) or transparent huge pages are off, :func:`empty` is ``torch.empty``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

import torch

__all__ = ["HUGE_PAGE", "MIN_BYTES", "advise_if_fresh", "empty"]

MIN_BYTES = 4 * 1024 * 1024
"""The smallest output :func:`empty` looks at (two huge pages)."""
HUGE_PAGE = 2 * 1024 * 1024
MADV_HUGEPAGE = 14  # <linux/mman.h>


def _libc():
    """libc's ``(madvise, mincore)`` (None where the platform has no transparent huge pages to ask for)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as modes:
            if "[never]" in modes.read():
                return None
    except OSError:
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.madvise.argtypes, libc.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    libc.mincore.argtypes, libc.mincore.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p], ctypes.c_int
    return libc.madvise, libc.mincore


_LIBC = _libc()


def _resident(address: int) -> bool:
    """Whether the page at ``address`` (page-aligned) is in memory (or cannot be asked about)."""
    page = ctypes.create_string_buffer(1)
    return _LIBC[1](address, mmap.PAGESIZE, page) != 0 or bool(page.raw[0] & 1)


def advise_if_fresh(t: torch.Tensor) -> bool:
    """Ask for huge pages under the whole 2 MB extents of ``t``'s memory if no one has touched
    them yet (the first one's first page not resident). Returns whether the advice was given."""
    if _LIBC is None:
        return False
    start = t.data_ptr()
    end = start + t.untyped_storage().nbytes()
    first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
    return last > first and not _resident(first) and _LIBC[0](first, last - first, MADV_HUGEPAGE) == 0


def empty(shape, dtype: torch.dtype, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """``torch.empty``; at least :data:`MIN_BYTES` of fresh memory advised onto huge pages."""
    t = torch.empty(shape, dtype=dtype, memory_format=memory_format)
    if t.untyped_storage().nbytes() >= MIN_BYTES:
        advise_if_fresh(t)
    return t
