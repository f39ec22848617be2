"""The package's kernels on PyTorch's OpenMP threads: one set of cores, nobody spinning against anybody.

A compiled TVM kernel runs its parallel loops through ``TVMBackendParallelLaunch``, a function
pointer that the module loader fills from the context symbols registered with TVM's FFI (a
library module when it is loaded, a JIT module when it is compiled). TVM's own launcher runs them
on TVM's thread pool, whose workers spin after each kernel, while PyTorch's ops run on GNU
OpenMP's pool, whose workers spin after each op: in a training step on few cores each pool takes
the cores from the other's next call.

:func:`use_pytorch_threads` registers a launcher of its own instead: ``GOMP_parallel`` on the
calling thread's OpenMP team, the one PyTorch's ops use (``torch.get_num_threads()`` threads),
each thread one task (``omp_get_thread_num`` of ``omp_get_num_threads``), and
``TVMBackendParallelBarrier`` as ``GOMP_barrier``. It is written in LLVM IR and compiled by TVM's
own LLVM (no C compiler needed), its symbols resolved against the libgomp PyTorch loaded. Every
kernel built (or loaded) afterwards runs on PyTorch's threads; TVM's pool never starts.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path
from typing import Sequence

import tvm
import tvm_ffi.libinfo
from tvm.script import tirx as T

from ..tvmscript import fast_tvmscript

__all__ = ["LAUNCH_LLVM", "load_llvm", "mapped_library", "pytorch_libgomp", "register_context_symbols", "use_pytorch_threads", "using_pytorch_threads"]

LAUNCH_LLVM = r"""
%tvm_convgrad_env = type { ptr, i32 }
%tvm_convgrad_job = type { ptr, ptr, i32 }

declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare void @GOMP_barrier()
declare i32 @omp_get_thread_num()
declare i32 @omp_get_num_threads()

define internal void @tvm_convgrad_omp_task(ptr %job) {
entry:
  %lambda_at = getelementptr inbounds %tvm_convgrad_job, ptr %job, i32 0, i32 0
  %lambda = load ptr, ptr %lambda_at
  %cdata_at = getelementptr inbounds %tvm_convgrad_job, ptr %job, i32 0, i32 1
  %cdata = load ptr, ptr %cdata_at
  %tasks = call i32 @omp_get_num_threads()
  %task = call i32 @omp_get_thread_num()
  %env = alloca %tvm_convgrad_env
  %sync_at = getelementptr inbounds %tvm_convgrad_env, ptr %env, i32 0, i32 0
  store ptr null, ptr %sync_at
  %tasks_at = getelementptr inbounds %tvm_convgrad_env, ptr %env, i32 0, i32 1
  store i32 %tasks, ptr %tasks_at
  %status = call i32 %lambda(i32 %task, ptr %env, ptr %cdata)
  %failed = icmp ne i32 %status, 0
  br i1 %failed, label %record, label %done
record:
  %status_at = getelementptr inbounds %tvm_convgrad_job, ptr %job, i32 0, i32 2
  store atomic i32 %status, ptr %status_at monotonic, align 4
  br label %done
done:
  ret void
}

define i32 @tvm_convgrad_omp_launch(ptr %lambda, ptr %cdata, i32 %num_task) {
entry:
  %job = alloca %tvm_convgrad_job
  %lambda_at = getelementptr inbounds %tvm_convgrad_job, ptr %job, i32 0, i32 0
  store ptr %lambda, ptr %lambda_at
  %cdata_at = getelementptr inbounds %tvm_convgrad_job, ptr %job, i32 0, i32 1
  store ptr %cdata, ptr %cdata_at
  %status_at = getelementptr inbounds %tvm_convgrad_job, ptr %job, i32 0, i32 2
  store i32 0, ptr %status_at
  call void @GOMP_parallel(ptr @tvm_convgrad_omp_task, ptr %job, i32 %num_task, i32 0)
  %status = load atomic i32, ptr %status_at monotonic, align 4
  ret i32 %status
}

define i32 @tvm_convgrad_omp_barrier(i32 %task, ptr %env) {
entry:
  call void @GOMP_barrier()
  ret i32 0
}
"""
"""``TVMBackendParallelLaunch`` / ``TVMBackendParallelBarrier`` on GNU OpenMP (``num_task`` 0: the
team's default size; a task's error code is returned)."""

_STATE: dict = {}


def mapped_library(fragment: str) -> str | None:
    """The path of a shared library mapped into this process whose file name holds ``fragment``."""
    maps = Path("/proc/self/maps")
    for line in maps.read_text().splitlines() if maps.exists() else []:
        path = line.split()[-1]
        if fragment in Path(path).name:
            return path
    return None


def pytorch_libgomp() -> str | None:
    """The GNU OpenMP library PyTorch loaded into this process (None where its ops run on another
    thread pool)."""
    import torch

    return mapped_library("libgomp") if "OpenMP" in torch.__config__.parallel_info() else None


with fast_tvmscript():  # the decorator's source lookup without scanning PyTorch's thousands of modules

    @T.prim_func
    def _probe(out: T.Buffer((1,), "int32")):
        out[0] = 0


def _host_llvm_header() -> str:
    """The ``target datalayout`` and ``target triple`` lines TVM's LLVM gives this host's code."""
    ir = tvm.compile(tvm.IRModule({"probe": _probe}), target=tvm.target.Target({"kind": "llvm"})).mod.inspect_source("ll")
    return "\n".join(line for line in ir.splitlines() if line.startswith(("target datalayout", "target triple")))


def load_llvm(ir: str, functions: Sequence[str]) -> tuple[object, dict[str, int]]:
    """``(module, {name: address})``: a TVM module of the LLVM IR ``ir`` (this host's datalayout and
    triple put before it), compiled by TVM's own LLVM (an external symbol resolves against the
    libraries loaded global), and the addresses of its ``functions`` (globals of ``ir``), read
    through a packed function added to it (:func:`_addresses_llvm`). The module must outlive them."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tvm_convgrad_helper.ll"
        path.write_text(_host_llvm_header() + "\n" + ir + _addresses_llvm(functions))
        module = tvm.runtime.load_module(str(path))
    return module, {name: int(module["addresses"](which)) for which, name in enumerate(functions)}


def _addresses_llvm(functions: Sequence[str]) -> str:
    """LLVM IR of a function ``addresses`` in TVM FFI's packed calling convention: its int argument
    ``i`` -> the address of ``functions[i]`` (an int result, type index 1)."""
    chosen, value = [], "0"
    for i, name in enumerate(functions):
        chosen += [f"  %is{i} = icmp eq i64 %which, {i}", f"  %a{i} = select i1 %is{i}, i64 ptrtoint (ptr @{name} to i64), i64 {value}"]
        value = f"%a{i}"
    body = "\n".join(chosen)
    return f"""
%tvm_convgrad_any = type {{ i32, i32, i64 }}

define i32 @__tvm_ffi_addresses(ptr %self, ptr %args, i32 %num_args, ptr %result) {{
entry:
  %which_at = getelementptr inbounds %tvm_convgrad_any, ptr %args, i32 0, i32 2
  %which = load i64, ptr %which_at
{body}
  %type_at = getelementptr inbounds %tvm_convgrad_any, ptr %result, i32 0, i32 0
  store i32 1, ptr %type_at
  %pad_at = getelementptr inbounds %tvm_convgrad_any, ptr %result, i32 0, i32 1
  store i32 0, ptr %pad_at
  %value_at = getelementptr inbounds %tvm_convgrad_any, ptr %result, i32 0, i32 2
  store i64 {value}, ptr %value_at
  ret i32 0
}}
"""


def register_context_symbols(addresses: dict[str, int]) -> None:
    """Set TVM FFI's context symbols (``__TVMBackend*`` names, the function pointers a module loader
    fills in a kernel) to ``addresses`` for every module loaded from now on."""
    ffi = ctypes.CDLL(tvm_ffi.libinfo.find_libtvm_ffi())
    ffi.TVMFFIEnvModRegisterContextSymbol.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    for name, address in addresses.items():
        if ffi.TVMFFIEnvModRegisterContextSymbol(name.encode(), address) != 0:
            raise RuntimeError(f"TVM's FFI refused the context symbol {name}")


def use_pytorch_threads() -> bool:
    """Register the OpenMP launcher for every kernel built or loaded from now on (once per
    process). Returns whether the kernels now run on PyTorch's threads (False where PyTorch's
    ops do not run on GNU OpenMP: then TVM's pool stays)."""
    if "registered" in _STATE:
        return _STATE["registered"]
    libgomp = pytorch_libgomp()
    if libgomp is None:
        _STATE["registered"] = False
        return False
    ctypes.CDLL(libgomp, mode=os.RTLD_GLOBAL | getattr(os, "RTLD_NOLOAD", 0))  # its symbols for TVM's JIT
    launcher, addresses = load_llvm(LAUNCH_LLVM, ("tvm_convgrad_omp_launch", "tvm_convgrad_omp_barrier"))
    register_context_symbols({"__TVMBackendParallelLaunch": addresses["tvm_convgrad_omp_launch"],
                              "__TVMBackendParallelBarrier": addresses["tvm_convgrad_omp_barrier"]})  # fmt: skip
    _STATE.update(registered=True, launcher=launcher, libgomp=libgomp)  # the launcher's code lives as long as the process
    return True


def using_pytorch_threads() -> bool:
    """Whether :func:`use_pytorch_threads` registered the launcher in this process."""
    return bool(_STATE.get("registered"))
