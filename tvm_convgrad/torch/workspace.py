"""The kernels' scratch memory from the allocator PyTorch's CPU tensors come from (glibc's malloc).

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
(``python -m tvm_convgrad.training.torch_beside``).

:func:`use_pytorch_allocator` registers a helper of its own: CPU workspaces from
``posix_memalign`` (64-byte aligned, as TVM's and PyTorch's are) and back to ``free``, other
devices' from TVM's own functions; it counts the CPU workspaces it served
(:func:`workspace_allocations`). Written in LLVM IR and compiled by TVM's LLVM like the launcher;
every kernel loaded afterwards (a JIT-compiled one: first run afterwards) takes its workspaces from it.
"""

from __future__ import annotations

import ctypes
import os
import sys

from .openmp import load_llvm, mapped_library, register_context_symbols

__all__ = ["WORKSPACE_LLVM", "use_pytorch_allocator", "using_pytorch_allocator", "workspace_allocations"]

WORKSPACE_LLVM = r"""
declare i32 @posix_memalign(ptr, i64, i64)
declare void @free(ptr)
declare ptr @TVMBackendAllocWorkspace(i32, i32, i64, i32, i32)
declare i32 @TVMBackendFreeWorkspace(i32, i32, ptr)

@tvm_convgrad_workspaces = global i64 0, align 8

define ptr @tvm_convgrad_alloc_workspace(i32 %device_type, i32 %device_id, i64 %nbytes, i32 %code, i32 %bits) {
entry:
  %cpu = icmp eq i32 %device_type, 1
  br i1 %cpu, label %heap, label %other
heap:
  %slot = alloca ptr
  %failed = call i32 @posix_memalign(ptr %slot, i64 64, i64 %nbytes)
  %ok = icmp eq i32 %failed, 0
  %memory = load ptr, ptr %slot
  %result = select i1 %ok, ptr %memory, ptr null
  %served = atomicrmw add ptr @tvm_convgrad_workspaces, i64 1 monotonic
  ret ptr %result
other:
  %theirs = call ptr @TVMBackendAllocWorkspace(i32 %device_type, i32 %device_id, i64 %nbytes, i32 %code, i32 %bits)
  ret ptr %theirs
}

define i32 @tvm_convgrad_free_workspace(i32 %device_type, i32 %device_id, ptr %memory) {
entry:
  %cpu = icmp eq i32 %device_type, 1
  br i1 %cpu, label %heap, label %other
heap:
  call void @free(ptr %memory)
  ret i32 0
other:
  %status = call i32 @TVMBackendFreeWorkspace(i32 %device_type, i32 %device_id, ptr %memory)
  ret i32 %status
}
"""
"""``TVMBackendAllocWorkspace`` / ``TVMBackendFreeWorkspace`` on malloc for the CPU, TVM's own for
other devices."""

_STATE: dict = {}


def use_pytorch_allocator() -> bool:
    """Register the malloc workspaces for every kernel built or loaded from now on (once per
    process; Linux, whose libc has ``posix_memalign``). Returns whether they are registered."""
    if "registered" in _STATE:
        return _STATE["registered"]
    runtime = mapped_library("libtvm_runtime")
    if not sys.platform.startswith("linux") or runtime is None:
        _STATE["registered"] = False
        return False
    ctypes.CDLL(runtime, mode=os.RTLD_GLOBAL | getattr(os, "RTLD_NOLOAD", 0))  # TVM's own functions for TVM's JIT
    helper, addresses = load_llvm(WORKSPACE_LLVM, ("tvm_convgrad_alloc_workspace", "tvm_convgrad_free_workspace", "tvm_convgrad_workspaces"))
    register_context_symbols({"__TVMBackendAllocWorkspace": addresses["tvm_convgrad_alloc_workspace"],
                              "__TVMBackendFreeWorkspace": addresses["tvm_convgrad_free_workspace"]})  # fmt: skip
    _STATE.update(registered=True, helper=helper, count=addresses["tvm_convgrad_workspaces"])  # the helper's code lives as long as the process
    return True


def using_pytorch_allocator() -> bool:
    """Whether :func:`use_pytorch_allocator` registered the malloc workspaces in this process."""
    return bool(_STATE.get("registered"))


def workspace_allocations() -> int:
    """How many CPU workspaces the registered helper has served in this process (0 before)."""
    return ctypes.c_int64.from_address(_STATE["count"]).value if _STATE.get("registered") else 0
