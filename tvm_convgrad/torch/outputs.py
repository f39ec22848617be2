"""The drop-in's large results -- the forward's output and dX -- in memory kept mapped between calls.

A training step frees its activations and their gradients and allocates them again in the next
step, and every freshly mapped page costs a page fault on its first touch (~1 us on the Emerald
Rapids guest, each 4 KiB; ~2 us on the Zen 3). glibc maps every request of 32 MiB or more
(:mod:`.heap`) and unmaps it when freed, and serves smaller ones from its heap, which it trims
when 64 MiB lie free at its top; so whether a step's tensors fault depends on what the whole
process holds, and the step time follows the count. MobileNetV2 channels-last at 32 x 112x112
(f32, the Emerald Rapids guest): steps took 0-47,000 faults (each 9,409 one 38.5 MB tensor), and
those without any ran ~370 ms on both sides, those with the most up to 550. Steps alternating stock,
the drop-in with kept results and with ``torch.empty``'s, in one process (9 rounds, medians): 331 /
316 / 327 ms, 13,623 / 0 / 18,819 faults a step (``docs/training.md``, "The results, kept").

Under ``"kept"`` (the default) a result of :data:`OUTPUTS_FROM` bytes or more is a tensor over
a mapping (``mmap``, outside glibc's heap) that returns to this module when PyTorch frees the
tensor's storage, and the next result of the same length takes it: its pages are touched already,
as PyTorch's CUDA caching allocator keeps device memory. At most :data:`KEPT_BYTES` lie idle: a
mapping returned beyond that takes the place of the idle ones returned longest ago, which are
unmapped (a process that trains one network and then another, as the step benchmark does, would
otherwise keep the first one's sizes and map every result of the second afresh). :func:`release_outputs` unmaps the idle ones now
(``torch.cuda.empty_cache``'s counterpart). Under ``"malloc"`` results are ``torch.empty``'s.
Set with :func:`set_outputs`, or ``TVM_CONVGRAD_OUTPUTS`` at import. Once the drop-in's C++
extension is loaded (:mod:`.native`), it holds the mappings (:func:`use_native`): cold, in a step
whose large tensors evict the interpreter's data, a tensor over one took ~60-75 us here (the lease,
numpy's array, ``from_numpy``, ``set_``) and ~20 there, as ``torch.empty``; its C++ node's dX takes
one without a call into Python.

The tensors are ordinary CPU tensors with their own storage (not views), laid out as
``torch.empty`` would lay them (contiguous, or channels-last where asked); their storage is not
resizable (``resize_`` to more elements raises), as a tensor from ``torch.from_numpy``.
:func:`is_kept` says whether a tensor's storage is a kept mapping, :func:`kept_outputs` counts them.
"""

from __future__ import annotations

import collections
import functools
import math
import mmap
import os
import threading

import numpy as np
import torch

from ..errors import ConvGradError
from . import settled
from .kernels import memory_format

__all__ = ["KEPT_BYTES", "OUTPUTS_FROM", "POLICIES", "empty", "get_outputs", "is_kept", "kept_for", "kept_outputs",
           "release_outputs", "set_outputs", "use_native"]

POLICIES = ("kept", "malloc")
"""``TVM_CONVGRAD_OUTPUTS``' values (see the module docstring)."""
OUTPUTS_FROM = 1 << 20
"""Fewest bytes of a result taken from the kept mappings (smaller ones from ``torch.empty``)."""
KEPT_BYTES = 1 << 30
"""Most bytes of idle mappings held (the oldest unmapped to make room for one returned beyond it);
the extension's pool reads it when it is loaded and when :func:`set_outputs` sets a policy."""
PAGE = mmap.PAGESIZE
PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}
"""Anonymous mappings private to the process (Python's default is shared: a forked child, a
DataLoader's worker, would write into the parent's tensors)."""

_LOCK = threading.RLock()  # re-entrant: a collection inside a locked section may free a lease
_IDLE: collections.deque = collections.deque()  # (length, mapping), oldest first
_LENT: dict[int, int] = {}  # address: length of the mappings lent to tensors now
_STATE = {"policy": "kept", "bytes": 0, "maps": 0}
_NATIVE: list = []  # the extension once :func:`use_native` is called: its mappings from then on


def _check(policy: str, name: str = "policy") -> None:
    if policy not in POLICIES:
        raise ConvGradError("tvm_convgrad.torch.set_outputs", name, policy, f"must be one of {list(POLICIES)}")


class _Lease:
    """One mapping lent to a tensor (numpy's ``__array_interface__`` keeps it as the array's base):
    counted lent while it lives, back to the idle ones when PyTorch frees the storage."""

    __slots__ = ("mapping", "length", "address", "__array_interface__")

    def __init__(self, mapping: np.ndarray, length: int):
        self.mapping, self.length, self.address = mapping, length, mapping.ctypes.data
        self.__array_interface__ = {"data": (self.address, False), "shape": (length,), "typestr": "|u1", "version": 3}
        with _LOCK:
            _LENT[self.address] = length

    def __del__(self):
        try:
            _give_back(self)
        except Exception:  # noqa: BLE001 -- at interpreter shutdown the module's globals are gone
            pass


def _give_back(lease: _Lease) -> None:
    """A mapping back from its tensor: idle, the oldest idle ones unmapped to make room within
    :data:`KEPT_BYTES` (the extension's pool does the same, ``native.cpp``'s ``give_back``)."""
    with _LOCK:
        _LENT.pop(lease.address, None)
        if _STATE["policy"] == "kept" and not _NATIVE and lease.length <= KEPT_BYTES:
            while _STATE["bytes"] + lease.length > KEPT_BYTES:
                _STATE["bytes"] -= _IDLE.popleft()[0]  # (unmapped when its array is collected)
            _IDLE.append((lease.length, lease.mapping))
            _STATE["bytes"] += lease.length


def _take(length: int) -> np.ndarray:
    """An idle mapping of ``length`` bytes (the latest returned), or a new one."""
    with _LOCK:
        for i in range(len(_IDLE) - 1, -1, -1):
            if _IDLE[i][0] == length:
                mapping = _IDLE[i][1]
                del _IDLE[i]
                _STATE["bytes"] -= length
                return mapping
        _STATE["maps"] += 1
    return np.frombuffer(mmap.mmap(-1, length, **PRIVATE), np.uint8)


@functools.lru_cache(maxsize=256)
def _strides(shape: tuple, layout: torch.memory_format) -> tuple:
    """``torch.empty``'s strides of ``shape`` in ``layout`` (read off a meta tensor: nothing allocated)."""
    return torch.empty(shape, device="meta", memory_format=layout).stride()


def empty(shape, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """An uninitialized CPU tensor of ``shape`` and ``dtype``, channels-last where asked and 4-D:
    over a kept mapping under ``"kept"`` from :data:`OUTPUTS_FROM` bytes, else ``torch.empty``'s."""
    shape = tuple(int(extent) for extent in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    layout = memory_format(channels_last and len(shape) == 4)
    if not kept_for(nbytes):
        return torch.empty(shape, dtype=dtype, memory_format=layout)
    if _NATIVE:
        return _NATIVE[0].kept_empty(list(shape), dtype, channels_last)
    length = -(-nbytes // PAGE) * PAGE
    storage = torch.from_numpy(np.asarray(_Lease(_take(length), length))).untyped_storage()
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, _strides(shape, layout))


def kept_for(nbytes: int) -> bool:
    """Whether a result of ``nbytes`` bytes is a kept mapping now (``"kept"``, :data:`OUTPUTS_FROM` or more)."""
    return _STATE["policy"] == "kept" and nbytes >= OUTPUTS_FROM


def _idle_budget() -> int:
    """The idle bytes the extension's pool may hold under the current policy (none under ``"malloc"``)."""
    return KEPT_BYTES if _STATE["policy"] == "kept" else 0


def use_native(module) -> None:
    """From now on ``module`` (the loaded extension, ``native.cpp``'s ``kept_empty``) holds the kept
    mappings, or this module where None; the idle ones of the other are unmapped now, those lent
    now when PyTorch frees them."""
    with _LOCK:
        if _NATIVE:
            _NATIVE[0].kept_limit(0)
        _NATIVE[:] = [] if module is None else [module]
        if module is not None:
            module.kept_limit(_idle_budget())
            _IDLE.clear()
            _STATE["bytes"] = 0


def is_kept(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s storage is a kept mapping (lent to it and its views)."""
    address = tensor.untyped_storage().data_ptr()
    return address in _LENT or bool(_NATIVE and _NATIVE[0].is_kept(address))


def release_outputs() -> int:
    """Unmap the idle mappings now; returns their bytes."""
    with _LOCK:
        released = _STATE["bytes"]
        _IDLE.clear()
        _STATE["bytes"] = 0
        if _NATIVE:
            released += _NATIVE[0].kept_limit(0)
            _NATIVE[0].kept_limit(_idle_budget())
    return released


def set_outputs(policy: str) -> None:
    """The results' policy from now on, ``"kept"`` or ``"malloc"``; leaving ``"kept"`` unmaps the
    idle mappings (those lent out are unmapped when PyTorch frees them)."""
    _check(policy)
    _STATE["policy"] = policy
    settled.reset()
    if policy != "kept":
        release_outputs()
    if _NATIVE:
        _NATIVE[0].kept_limit(_idle_budget())


def get_outputs() -> str:
    """The current policy."""
    return _STATE["policy"]


def kept_outputs() -> dict[str, int]:
    """``{"maps": mappings made, "held": idle mappings now, "bytes": their bytes}`` in this process."""
    with _LOCK:
        maps, held, held_bytes, _ = _NATIVE[0].kept_counts() if _NATIVE else (0, 0, 0, 0)
        return {"maps": _STATE["maps"] + maps, "held": len(_IDLE) + held, "bytes": _STATE["bytes"] + held_bytes}


_policy = os.environ.get("TVM_CONVGRAD_OUTPUTS", "kept")
_check(_policy, "TVM_CONVGRAD_OUTPUTS")
_STATE["policy"] = _policy
