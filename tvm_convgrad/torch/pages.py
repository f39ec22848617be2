"""Large outputs on transparent huge pages: the first write faults 2 MB pages, not 4 KB ones.

A gradient the size of a large activation (MobileNetV2's 96 x 56 x 56 at batch 32: 38.5 MB) is
fresh memory on every call: glibc serves any allocation above its mmap threshold (at most
:data:`ALWAYS_MAPPED_BYTES`) with a new ``mmap``, and the kernel that writes it first takes a page
fault per 4 KB (9,409 for 38.5 MB: 12-13 ms on a 2-core Zen 3 virtual machine, more than the
kernel's arithmetic). :func:`empty` advises the kernel to back such a tensor's whole 2 MB extents
with huge pages (``madvise(MADV_HUGEPAGE)``, as PyTorch's own allocator does for every tensor
under ``THP_MEM_ALLOC_ENABLE=1``): 722 faults, 3.2-3.6 ms for the same allocation and write.

Only tensors at least :data:`ALWAYS_MAPPED_BYTES` are advised: glibc maps each of them on its own
and unmaps it when it is freed, so the advice ends with the tensor and no other allocation of the
process is touched (a smaller one may be a reused piece of the heap, already faulted in). Where
the system has no ``madvise`` (not Linux) or transparent huge pages are off, :func:`empty` is
``torch.empty``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

__all__ = ["ALWAYS_MAPPED_BYTES", "HUGE_PAGE", "advise_huge_pages", "empty"]

ALWAYS_MAPPED_BYTES = 32 * 1024 * 1024
"""glibc's largest mmap threshold on a 64-bit system (``DEFAULT_MMAP_THRESHOLD_MAX``): an
allocation this large is always a mapping of its own."""
HUGE_PAGE = 2 * 1024 * 1024
MADV_HUGEPAGE = 14  # <linux/mman.h>


def _madvise():
    """libc's ``madvise`` (None where the platform has no transparent huge pages to ask for)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as modes:
            if "[never]" in modes.read():
                return None
    except OSError:
        return None
    madvise = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).madvise
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


_MADVISE = _madvise()


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask for huge pages under the whole 2 MB extents of ``t``'s memory (before anything writes
    it). Returns whether the advice was taken."""
    if _MADVISE is None:
        return False
    start = t.data_ptr()
    end = start + t.untyped_storage().nbytes()
    first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
    return last > first and _MADVISE(first, last - first, MADV_HUGEPAGE) == 0


def empty(shape, dtype: torch.dtype, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """``torch.empty``, on huge pages where the tensor is at least :data:`ALWAYS_MAPPED_BYTES`."""
    t = torch.empty(shape, dtype=dtype, memory_format=memory_format)
    if t.untyped_storage().nbytes() >= ALWAYS_MAPPED_BYTES:
        advise_huge_pages(t)
    return t
