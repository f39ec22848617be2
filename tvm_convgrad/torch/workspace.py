"""The kernels' scratch memory: from malloc as PyTorch's CPU tensors', or kept between calls.

A compiled TVM kernel takes the buffers it packs into (dy, x, weights in the cube's layouts)
through ``TVMBackendAllocWorkspace``, a function pointer the module loader fills like the parallel
launcher's (:mod:`.openmp`). TVM's own keeps freed buffers in a pool of its own and never returns
them to malloc. Beside PyTorch that changes PyTorch's speed, not the kernels': glibc's heap
keeps or returns memory by what the whole process allocates and frees, and a step of PyTorch's
own convolutions takes its scratch buffers (9.4 MB a call in ResNet-18 at 8 x 64x64) from malloc
and frees them. With the drop-in's step holding its buffers in TVM's pool instead, glibc returned
the top of its heap after stock's step, and stock's next step took 13,792 page faults getting it
back (ResNet-18 8 x 64x64, Sapphire Rapids-class guest: stock's step 74 ms beside the drop-in, 60
alone, 64 beside a second stock model). From malloc: 2,304 faults, 65 ms
(``python -m tvm_convgrad.training.torch_beside``). Whether glibc trims is decided by the heap's
layout, which every allocation in the process shapes; :mod:`.heap` now pins its thresholds, so
that a free leaving less than 64 MiB at the heap's top trims nothing, whatever the policy.

:func:`use_pytorch_allocator` registers a helper of its own (LLVM IR compiled by TVM's LLVM like
the launcher; every kernel loaded afterwards, a JIT-compiled one on its first run, takes its
workspaces from it; other devices' from TVM's own functions), with two policies
(:func:`set_workspaces`, or ``TVM_CONVGRAD_WORKSPACES`` at import):

* ``"malloc"`` (the default): every CPU workspace from ``posix_memalign`` (64-byte aligned, as
  TVM's and PyTorch's are) and back to ``free`` -- glibc sees the drop-in's buffers as it sees
  stock's convolutions', and stock's step beside the drop-in is not slowed. Where glibc trims its
  heap between the calls, the kernels re-fault their buffers (ResNet-18 bf16 8 x 64x64, the
  drop-in alone: ~3,500 more faults a step than TVM's pool, 8-20% of the step).
* ``"kept"``: a workspace of :data:`KEPT_FROM` bytes or more is mapped (``mmap``, outside glibc's
  heap; huge pages advised from 2 MiB) and kept after its call in one of :data:`KEPT_SLOTS` slots
  (:data:`KEPT_BYTES` at most, round-robin out when full), for the next call that asks for
  1-1.25x its size: the kernels stop faulting, and glibc's heap no longer holds the drop-in's
  buffers -- but (measured under glibc's own heap rule, before :mod:`.heap` pinned its thresholds)
  stock's step beside the drop-in took its 13,792 faults again: glibc trimmed its heap's top after
  stock's frees and stock grew it back, where under malloc the drop-in's touched buffers lay there
  for stock to re-use. The faster policy where a process trains the converted model only.

:func:`workspace_allocations` counts the CPU workspaces served, :func:`kept_workspaces` what the
``"kept"`` policy maps and holds. Smaller workspaces come from ``posix_memalign`` in both.
"""

from __future__ import annotations

import ctypes
import os
import sys

from ..errors import ConvGradError
from .openmp import load_llvm, mapped_library, register_context_symbols

__all__ = ["KEPT_BYTES", "KEPT_FROM", "KEPT_SLOTS", "POLICIES", "WORKSPACE_LLVM", "get_workspaces", "kept_workspaces", "set_workspaces",
           "use_pytorch_allocator", "using_pytorch_allocator", "workspace_allocations"]  # fmt: skip

WORKSPACE_LLVM = r"""
declare i32 @posix_memalign(ptr, i64, i64)
declare void @free(ptr)
declare ptr @mmap(ptr, i64, i32, i32, i32, i64)
declare i32 @munmap(ptr, i64)
declare i32 @madvise(ptr, i64, i32)
declare ptr @TVMBackendAllocWorkspace(i32, i32, i64, i32, i32)
declare i32 @TVMBackendFreeWorkspace(i32, i32, ptr)

@tvm_convgrad_workspaces = global i64 0, align 8
@tvm_convgrad_keep = global i64 0, align 8
@tvm_convgrad_maps = global i64 0, align 8
@tvm_convgrad_kept_bytes = global i64 0, align 8
@tvm_convgrad_turn = global i64 0, align 8
@tvm_convgrad_kept = global [@SLOTS@ x ptr] zeroinitializer, align 64
@tvm_convgrad_kept_length = global [@SLOTS@ x i64] zeroinitializer, align 64

; A CPU workspace starts 64 bytes into its block; the block's first i64 is its mapping's length
; (0: from posix_memalign). A slot holds null (empty), 1 (being filled) or a kept workspace;
; @tvm_convgrad_claim takes a slot's workspace of a length in [shortest, longest] (leaving
; the replacement there, its bytes no longer counted kept), @tvm_convgrad_unmap returns one.

define internal ptr @tvm_convgrad_claim(i64 %i, ptr %replacement, i64 %shortest, i64 %longest) {
entry:
  %at = getelementptr inbounds [@SLOTS@ x ptr], ptr @tvm_convgrad_kept, i64 0, i64 %i
  %kept = load atomic ptr, ptr %at acquire, align 8
  %held = icmp ugt ptr %kept, inttoptr (i64 1 to ptr)
  br i1 %held, label %measure, label %none
measure:
  %length_at = getelementptr inbounds [@SLOTS@ x i64], ptr @tvm_convgrad_kept_length, i64 0, i64 %i
  %kept_length = load atomic i64, ptr %length_at monotonic, align 8
  %long = icmp uge i64 %kept_length, %shortest
  %short = icmp ule i64 %kept_length, %longest
  %fits = and i1 %long, %short
  br i1 %fits, label %claim, label %none
claim:
  %pair = cmpxchg ptr %at, ptr %kept, ptr %replacement acq_rel monotonic
  %won = extractvalue { ptr, i1 } %pair, 1
  br i1 %won, label %claimed, label %none
claimed:
  %base = getelementptr inbounds i8, ptr %kept, i64 -64
  %own_length = load i64, ptr %base, align 8
  %gone = atomicrmw sub ptr @tvm_convgrad_kept_bytes, i64 %own_length monotonic
  ret ptr %kept
none:
  ret ptr null
}

define internal void @tvm_convgrad_unmap(ptr %memory) {
entry:
  %base = getelementptr inbounds i8, ptr %memory, i64 -64
  %length = load i64, ptr %base, align 8
  %unmapped = call i32 @munmap(ptr %base, i64 %length)
  ret void
}

define internal ptr @tvm_convgrad_take(i64 %length) {
entry:
  %quarter = lshr i64 %length, 2
  %limit = add i64 %length, %quarter
  br label %scan
scan:
  %i = phi i64 [ 0, %entry ], [ %next, %next_slot ]
  %kept = call ptr @tvm_convgrad_claim(i64 %i, ptr null, i64 %length, i64 %limit)
  %taken = icmp ne ptr %kept, null
  br i1 %taken, label %check, label %next_slot
check:
  %base = getelementptr inbounds i8, ptr %kept, i64 -64
  %own_length = load i64, ptr %base, align 8
  %still_fits = icmp uge i64 %own_length, %length
  br i1 %still_fits, label %found, label %misfit
misfit:
  call void @tvm_convgrad_unmap(ptr %kept)
  ret ptr null
found:
  ret ptr %kept
next_slot:
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, @SLOTS@
  br i1 %more, label %scan, label %none
none:
  ret ptr null
}

define internal void @tvm_convgrad_keep_or_unmap(ptr %memory, i64 %length) {
entry:
  %policy = load atomic i64, ptr @tvm_convgrad_keep monotonic, align 8
  %keeping = icmp ne i64 %policy, 0
  br i1 %keeping, label %budget, label %unmap
budget:
  %before = atomicrmw add ptr @tvm_convgrad_kept_bytes, i64 %length monotonic
  %after = add i64 %before, %length
  %over = icmp ugt i64 %after, @BUDGET@
  br i1 %over, label %refuse, label %scan
scan:
  %i = phi i64 [ 0, %budget ], [ %next, %next_slot ]
  %at = getelementptr inbounds [@SLOTS@ x ptr], ptr @tvm_convgrad_kept, i64 0, i64 %i
  %pair = cmpxchg ptr %at, ptr null, ptr inttoptr (i64 1 to ptr) acq_rel monotonic
  %won = extractvalue { ptr, i1 } %pair, 1
  br i1 %won, label %store, label %next_slot
next_slot:
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, @SLOTS@
  br i1 %more, label %scan, label %evict
evict:
  %turn = atomicrmw add ptr @tvm_convgrad_turn, i64 1 monotonic
  %victim = urem i64 %turn, @SLOTS@
  %old = call ptr @tvm_convgrad_claim(i64 %victim, ptr inttoptr (i64 1 to ptr), i64 0, i64 -1)
  %evicted = icmp ne ptr %old, null
  br i1 %evicted, label %evict_unmap, label %refuse
evict_unmap:
  call void @tvm_convgrad_unmap(ptr %old)
  br label %store
store:
  %slot = phi i64 [ %i, %scan ], [ %victim, %evict_unmap ]
  %slot_at = getelementptr inbounds [@SLOTS@ x ptr], ptr @tvm_convgrad_kept, i64 0, i64 %slot
  %length_at = getelementptr inbounds [@SLOTS@ x i64], ptr @tvm_convgrad_kept_length, i64 0, i64 %slot
  store atomic i64 %length, ptr %length_at monotonic, align 8
  store atomic ptr %memory, ptr %slot_at release, align 8
  ret void
refuse:
  %back = atomicrmw sub ptr @tvm_convgrad_kept_bytes, i64 %length monotonic
  br label %unmap
unmap:
  call void @tvm_convgrad_unmap(ptr %memory)
  ret void
}

define void @tvm_convgrad_release_kept() {
entry:
  br label %scan
scan:
  %i = phi i64 [ 0, %entry ], [ %next, %next_slot ]
  %kept = call ptr @tvm_convgrad_claim(i64 %i, ptr null, i64 0, i64 -1)
  %released = icmp ne ptr %kept, null
  br i1 %released, label %unmap, label %next_slot
unmap:
  call void @tvm_convgrad_unmap(ptr %kept)
  br label %next_slot
next_slot:
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, @SLOTS@
  br i1 %more, label %scan, label %done
done:
  ret void
}

define ptr @tvm_convgrad_alloc_workspace(i32 %device_type, i32 %device_id, i64 %nbytes, i32 %code, i32 %bits) {
entry:
  %slot = alloca ptr, align 8
  %cpu = icmp eq i32 %device_type, 1
  br i1 %cpu, label %count, label %other
count:
  %served = atomicrmw add ptr @tvm_convgrad_workspaces, i64 1 monotonic
  %policy = load atomic i64, ptr @tvm_convgrad_keep monotonic, align 8
  %keeping = icmp ne i64 %policy, 0
  %large = icmp uge i64 %nbytes, @KEPT_FROM@
  %mapped = and i1 %keeping, %large
  br i1 %mapped, label %kept, label %heap
heap:
  %with_header = add i64 %nbytes, 64
  %failed = call i32 @posix_memalign(ptr %slot, i64 64, i64 %with_header)
  %ok = icmp eq i32 %failed, 0
  br i1 %ok, label %heap_ok, label %fail
heap_ok:
  %heap_base = load ptr, ptr %slot, align 8
  store i64 0, ptr %heap_base, align 8
  %heap_memory = getelementptr inbounds i8, ptr %heap_base, i64 64
  ret ptr %heap_memory
kept:
  %padded = add i64 %nbytes, 4159
  %length = and i64 %padded, -4096
  %reused = call ptr @tvm_convgrad_take(i64 %length)
  %hit = icmp ne ptr %reused, null
  br i1 %hit, label %reuse, label %map
reuse:
  ret ptr %reused
map:
  %base = call ptr @mmap(ptr null, i64 %length, i32 3, i32 34, i32 -1, i64 0)
  %bad = icmp eq ptr %base, inttoptr (i64 -1 to ptr)
  br i1 %bad, label %fail, label %map_ok
map_ok:
  %maps = atomicrmw add ptr @tvm_convgrad_maps, i64 1 monotonic
  %huge = icmp uge i64 %length, 2097152
  br i1 %huge, label %advise, label %header
advise:
  %advised = call i32 @madvise(ptr %base, i64 %length, i32 14)
  br label %header
header:
  store i64 %length, ptr %base, align 8
  %memory = getelementptr inbounds i8, ptr %base, i64 64
  ret ptr %memory
fail:
  ret ptr null
other:
  %theirs = call ptr @TVMBackendAllocWorkspace(i32 %device_type, i32 %device_id, i64 %nbytes, i32 %code, i32 %bits)
  ret ptr %theirs
}

define i32 @tvm_convgrad_free_workspace(i32 %device_type, i32 %device_id, ptr %memory) {
entry:
  %cpu = icmp eq i32 %device_type, 1
  br i1 %cpu, label %mine, label %other
mine:
  %base = getelementptr inbounds i8, ptr %memory, i64 -64
  %length = load i64, ptr %base, align 8
  %from_heap = icmp eq i64 %length, 0
  br i1 %from_heap, label %heap, label %mapped
heap:
  call void @free(ptr %base)
  ret i32 0
mapped:
  call void @tvm_convgrad_keep_or_unmap(ptr %memory, i64 %length)
  ret i32 0
other:
  %status = call i32 @TVMBackendFreeWorkspace(i32 %device_type, i32 %device_id, ptr %memory)
  ret i32 %status
}
"""
"""``TVMBackendAllocWorkspace`` / ``TVMBackendFreeWorkspace``: CPU workspaces by the policy in
``@tvm_convgrad_keep`` (0: malloc, 1: kept; ``@SLOTS@``, ``@BUDGET@``, ``@KEPT_FROM@`` filled
from :data:`KEPT_SLOTS`, :data:`KEPT_BYTES`, :data:`KEPT_FROM`), TVM's own for other devices."""

POLICIES = ("malloc", "kept")
KEPT_FROM = 256 << 10
"""Workspaces this large or larger are mapped and kept under ``"kept"`` (smaller ones: malloc)."""
KEPT_SLOTS = 64
"""How many freed workspaces ``"kept"`` holds at most."""
KEPT_BYTES = 1 << 30
"""How many bytes of freed workspaces ``"kept"`` holds at most (a buffer beyond it is unmapped)."""

_STATE: dict = {}
_GLOBALS = ("tvm_convgrad_workspaces", "tvm_convgrad_keep", "tvm_convgrad_maps", "tvm_convgrad_kept_bytes", "tvm_convgrad_kept")


def _helper_llvm() -> str:
    return WORKSPACE_LLVM.replace("@SLOTS@", str(KEPT_SLOTS)).replace("@BUDGET@", str(KEPT_BYTES)).replace("@KEPT_FROM@", str(KEPT_FROM))


def use_pytorch_allocator() -> bool:
    """Register the workspace helper for every kernel built or loaded from now on (once per
    process; Linux, whose libc has ``posix_memalign`` and ``mmap``), its policy from
    ``TVM_CONVGRAD_WORKSPACES`` (default ``"malloc"``). Returns whether it is registered."""
    if "registered" in _STATE:
        return _STATE["registered"]
    policy = os.environ.get("TVM_CONVGRAD_WORKSPACES", "malloc")
    _check(policy, "TVM_CONVGRAD_WORKSPACES")
    runtime = mapped_library("libtvm_runtime")
    if not sys.platform.startswith("linux") or runtime is None:
        _STATE["registered"] = False
        return False
    ctypes.CDLL(runtime, mode=os.RTLD_GLOBAL | getattr(os, "RTLD_NOLOAD", 0))  # TVM's own functions for TVM's JIT
    helper, addresses = load_llvm(_helper_llvm(), ("tvm_convgrad_alloc_workspace", "tvm_convgrad_free_workspace", "tvm_convgrad_release_kept", *_GLOBALS))
    register_context_symbols({"__TVMBackendAllocWorkspace": addresses["tvm_convgrad_alloc_workspace"],
                              "__TVMBackendFreeWorkspace": addresses["tvm_convgrad_free_workspace"]})  # fmt: skip
    release = ctypes.CFUNCTYPE(None)(addresses["tvm_convgrad_release_kept"])
    _STATE.update(registered=True, helper=helper, release=release, **{name: addresses[name] for name in _GLOBALS})  # the helper lives as long as the process
    set_workspaces(policy)
    return True


def using_pytorch_allocator() -> bool:
    """Whether :func:`use_pytorch_allocator` registered the workspace helper in this process."""
    return bool(_STATE.get("registered"))


def _check(policy: str, name: str = "policy") -> None:
    if policy not in POLICIES:
        raise ConvGradError("tvm_convgrad.torch.set_workspaces", name, policy, f"must be one of {list(POLICIES)}")


def _global(name: str) -> ctypes.c_int64:
    return ctypes.c_int64.from_address(_STATE[name])


def set_workspaces(policy: str) -> None:
    """The CPU workspace policy from now on: ``"malloc"`` or ``"kept"`` (see the module docstring).
    Leaving ``"kept"`` unmaps what it holds; a workspace in use then is unmapped when freed."""
    _check(policy)
    if not _STATE.get("registered"):
        return
    _global("tvm_convgrad_keep").value = POLICIES.index(policy)
    if policy != "kept":
        _STATE["release"]()


def get_workspaces() -> str:
    """The current policy (``"malloc"`` where the helper is not registered: TVM's pool then)."""
    return POLICIES[_global("tvm_convgrad_keep").value] if _STATE.get("registered") else "malloc"


def workspace_allocations() -> int:
    """How many CPU workspaces the registered helper has served in this process (0 before)."""
    return _global("tvm_convgrad_workspaces").value if _STATE.get("registered") else 0


def kept_workspaces() -> dict[str, int]:
    """``{"maps": mappings made, "held": workspaces held now, "bytes": their bytes}`` of the
    ``"kept"`` policy in this process (all 0 where the helper is not registered)."""
    if not _STATE.get("registered"):
        return {"maps": 0, "held": 0, "bytes": 0}
    slots = (ctypes.c_void_p * KEPT_SLOTS).from_address(_STATE["tvm_convgrad_kept"])
    held = sum(1 for slot in slots if slot is not None and slot > 1)
    return {"maps": _global("tvm_convgrad_maps").value, "held": held, "bytes": _global("tvm_convgrad_kept_bytes").value}
