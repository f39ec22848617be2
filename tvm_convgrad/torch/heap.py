"""glibc's heap thresholds pinned where its own dynamic rule tops out, so that what the drop-in
allocates beside PyTorch does not decide when glibc returns PyTorch's memory.

glibc serves a request from its heap, or maps it (``mmap``) when it is at least the *mmap
threshold*; a ``free`` that leaves more than the *trim threshold* free at the heap's top returns
that top to the kernel (``brk``), and whatever grows the heap back takes a page fault on every 4
KiB page it touches. Both thresholds move: freeing a mapped chunk of up to 32 MiB raises the mmap
threshold to its size and the trim threshold to twice that (glibc's ``DEFAULT_MMAP_THRESHOLD_MAX``
on 64-bit machines). Which free finds the top large enough then depends on the heap's layout,
that is on everything the process holds. In ResNet-18's step at 8 x 64x64 (Zen 4) a process
training stock alone and one training stock beside the drop-in had both reached 9.4 / 18.9 MB (a
freed 9.4 MB weight gradient), yet only beside the drop-in did stock's ``zero_grad`` free its
weight gradients onto a free top: glibc trimmed 56 MB and stock's backward took them back in 13,792 page
faults, 74-123 ms a step against 64-67 alone (``python -m tvm_convgrad.training.torch_beside``);
the package's own one-process step ratios counted those faults against stock.

:func:`pin_heap` (called when :mod:`tvm_convgrad.torch` is imported) sets the mmap threshold to
:data:`MMAP_FROM` and the trim threshold to :data:`TRIM_FROM` with ``mallopt``: the values glibc's
dynamic rule reaches at most, so glibc never maps or trims more than it would have, and no longer
by the process's history. The cost: requests of up to 32 MiB come from the heap, whose freed middle
stays the process's, and up to 64 MiB stay mapped at its top (ResNet-18's and MobileNetV2's steps:
resident memory within 1% either way). ``mallopt`` cannot give glibc its dynamic rule back; a
process keeps it by setting ``TVM_CONVGRAD_HEAP=glibc`` before the import, and one whose thresholds
are set already (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``GLIBC_TUNABLES``' ``glibc.malloc`` thresholds) keeps its own. Other C libraries: nothing is set.
"""

from __future__ import annotations

import ctypes
import os

from ..errors import ConvGradError

__all__ = ["HEAP_POLICIES", "MMAP_FROM", "TRIM_FROM", "heap_pinned", "pin_heap"]

MMAP_FROM = 32 << 20
"""The pinned mmap threshold: glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit machines."""
TRIM_FROM = 2 * MMAP_FROM
"""The pinned trim threshold: twice the mmap threshold, as glibc's dynamic rule sets it."""
HEAP_POLICIES = ("pinned", "glibc")
"""``TVM_CONVGRAD_HEAP``'s values: pin the thresholds (the default), or leave glibc's dynamic rule."""
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad")

_STATE: dict = {}


def _glibc():
    """The process's C library where it is glibc (it has ``gnu_get_libc_version``), else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version, libc.mallopt  # noqa: B018 -- both, or not glibc
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def _user_set() -> bool:
    """Whether the environment set glibc's heap thresholds itself."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(name in os.environ for name in USER_SETTINGS) or any(name in tunables for name in USER_TUNABLES)


def pin_heap() -> bool:
    """Pin glibc's mmap and trim thresholds at :data:`MMAP_FROM` and :data:`TRIM_FROM` (once per
    process; see the module docstring) unless ``TVM_CONVGRAD_HEAP`` is ``"glibc"``, the
    environment set them, or the C library is not glibc. Returns whether they are pinned."""
    if "pinned" in _STATE:
        return _STATE["pinned"]
    policy = os.environ.get("TVM_CONVGRAD_HEAP", "pinned")
    if policy not in HEAP_POLICIES:
        raise ConvGradError("tvm_convgrad.torch", "TVM_CONVGRAD_HEAP", policy, f"must be one of {list(HEAP_POLICIES)}")
    libc = _glibc() if policy == "pinned" and not _user_set() else None
    _STATE["pinned"] = bool(libc and libc.mallopt(M_MMAP_THRESHOLD, MMAP_FROM) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_FROM) == 1)
    return _STATE["pinned"]


def heap_pinned() -> bool:
    """Whether :func:`pin_heap` pinned glibc's thresholds in this process."""
    return bool(_STATE.get("pinned"))
