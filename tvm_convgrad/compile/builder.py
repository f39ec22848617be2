"""Compile gradient tensors into callable kernels: TE -> PrimFunc -> schedule -> tvm.compile.

>>> dw = dsl.conv2d_backprop_filter(fmap, dy, filter_sizes, para_dict)
>>> kernel = tvm_convgrad.build(dw)              # or build([fmap, dy, dw], target="cuda")
>>> mod = tvm_convgrad.lower(dw, "llvm")         # the scheduled IRModule, for your own tvm.compile

The schedule is the tuned record of the workload when the records hold one (:mod:`.records`), else
the target's rule's default (:mod:`tvm_convgrad.schedule`). Builds are cached by workload, target
and records.
"""

from __future__ import annotations

import os
import shutil
from collections import OrderedDict
from typing import Any, Sequence

import tvm
import tvm_ffi
from tvm import te, tirx
from tvm.target import Target

from .. import schedule
from ..isa import host_can_run
from ..schedule.cpu.amx import request_amx
from ..schedule.cpu.marks import lower_marks
from . import stored
from .kernel import Kernel
from .records import SHIPPED, database_folder, shipped_schedules, tuned_schedule
from .target import pass_context, resolve_target
from .workload import Workload

__all__ = ["CACHED_KERNELS", "build", "build_func", "lower"]


def lower(tensors: te.Tensor | Sequence[te.Tensor], target: str | dict | Target = "llvm", bf16_dot: bool = False) -> tvm.IRModule:
    """The scheduled ``IRModule`` of a gradient, ready for your own ``tvm.compile(mod, target)``
    (compile it inside :func:`~tvm_convgrad.pass_context` to get the package's code).

    Its one function is named by the ``kernel_name``. A bf16 gradient keeps the exact fp32 path
    unless ``bf16_dot`` asks for its ``vdpbf16ps`` form (where ``target`` runs them,
    :meth:`~tvm_convgrad.compile.Workload.for_target`, as :func:`build` does): that module must then be compiled for a target with the extension too
    (``tvm.compile(mod, "llvm")`` means LLVM's baseline x86-64, on which LLVM aborts).
    """
    target = resolve_target(target)
    workload = Workload.of(tensors)
    workload = workload.for_target(target) if bf16_dot else workload
    sch = schedule.apply(workload.prim_func(target), target)
    return lower_marks(tvm.IRModule({workload.name: sch.mod["main"]}))


CACHED_KERNELS = 256
"""How many compiled kernels :func:`build` keeps (the least recently built or reused are dropped
first): a notebook or a bench never compiles twice, and a long sweep does not hold every
executable it ever built."""
_CACHE: OrderedDict[tuple, list[tuple[tirx.PrimFunc | None, Kernel]]] = OrderedDict()
"""Kernels by (the PrimFunc's structural hash, target, schedules), or by ``("stored", key)`` for those
built with ``store=True`` (:func:`.stored.key`)."""


def _cached(key: tuple, func: tirx.PrimFunc | None) -> Kernel | None:
    """The kernel cached under ``key`` for ``func`` (None: a stored kernel's key, which names it whole)."""
    for cached_func, kernel in _CACHE.get(key, []):
        if func is None or tvm_ffi.structural_equal(cached_func, func):
            _CACHE.move_to_end(key)
            return kernel
    return None


def _cache(key: tuple, func: tirx.PrimFunc | None, kernel: Kernel):
    _CACHE.setdefault(key, []).append((func, kernel))
    _CACHE.move_to_end(key)
    while sum(len(v) for v in _CACHE.values()) > CACHED_KERNELS:
        _CACHE.popitem(last=False)



def _schedule(func: tirx.PrimFunc, target: Target, schedules) -> tuple[Any, str]:
    """``(s_tir.Schedule, how)``: a tuned record's when the database has one, else the rule's."""
    path = shipped_schedules(target) if schedules == SHIPPED else schedules
    if path is not None:
        path = database_folder(path)  # a tune() work_dir: its kept records
        sch = tuned_schedule(func, target, path)
        if sch is not None:
            return sch, f"tuned:{os.path.basename(os.path.normpath(path))}"
    return schedule.apply(func, target), "default"


def _compiled(workload: Workload, target: Target, schedules, func: tirx.PrimFunc | None = None) -> tuple[Any, tvm.IRModule, str]:
    """``(executable, scheduled module, how it was scheduled)`` of ``workload``."""
    func = workload.prim_func(target) if func is None else func
    sch, how = _schedule(func, target, schedules)
    mod = lower_marks(tvm.IRModule({workload.name: sch.mod["main"]}))
    with pass_context(target):
        return tvm.compile(mod, target=target), mod, how


def build(tensors: te.Tensor | Sequence[te.Tensor], target: str | dict | Target = "llvm", schedules: str | os.PathLike | None = SHIPPED,  # fmt: skip
          store: bool = False) -> Kernel:  # fmt: skip
    """Compile a gradient for ``target`` (``"llvm"``, ``"cuda"``, a dict or a Target).

    ``tensors`` is the result of ``tvm_convgrad.dsl`` (its inputs are known), or the argument
    list ``[inputs..., result]`` as for ``te.create_prim_func``. ``schedules``: the tuning
    records to look the workload up in — the ones shipped for this target (default), a database
    folder written by :func:`tvm_convgrad.tune` (``report.database``) or the ``work_dir`` given to
    it (its kept records), or None for the rule's default schedule
    (``Kernel.schedule`` says which was used). Compiled kernels are cached by workload, target
    and schedules: building the same thing twice returns the same :class:`Kernel`. ``store``: keep
    the kernel on disk, and load it from there in later processes (:mod:`.stored`: a CPU kernel
    this host runs, with the shipped or no records; ``$TVM_CONVGRAD_KERNEL_CACHE`` names the
    folder, ``off`` keeps nothing).
    """
    target = resolve_target(target)
    workload = Workload.of(tensors).for_target(target)
    stored_as = None
    if store and schedules in (SHIPPED, None) and target.kind.name == "llvm" and host_can_run(target) and stored.folder():
        stored_as = ("stored", stored.key(workload, target, schedules))
        kernel = _cached(stored_as, None)
        if kernel is not None:
            return kernel
        kernel = stored.load(stored_as[1], workload, target, lambda: _compiled(workload, target, schedules)[:2])
        if kernel is not None:
            _cache(stored_as, None, _ready(kernel))
            return kernel
    func = workload.prim_func(target)
    key = (tvm_ffi.structural_hash(func), str(target), str(schedules))
    kernel = _cached(key, func)
    if kernel is not None:
        return kernel
    executable, mod, how = _compiled(workload, target, schedules, func)
    kernel = Kernel(executable, mod, workload, target, how)
    if stored_as is not None:
        kernel = stored.save(stored_as[1], kernel)
    _cache(key if stored_as is None else stored_as, func, _ready(kernel))
    return kernel


def build_func(func: tirx.PrimFunc, target: str | dict | Target = "llvm"):
    """Compile a PrimFunc whose loops are written out already (no rule schedules it: e.g.
    :mod:`tvm_convgrad.schedule.cpu.depthwise_backward`) for ``target``, in the package's pass
    context; returns the compiled function, named by its ``global_symbol``. Not cached, not stored
    on disk: the caller keeps it (such a kernel compiles in ~0.2 s)."""
    target = resolve_target(target)
    name = str(func.attrs["global_symbol"])
    with pass_context(target):
        return tvm.compile(tvm.IRModule({name: func}), target=target)[name]


def _ready(kernel: Kernel) -> Kernel:
    """``kernel``, with what running it needs asked for: AMX's tile registers (Linux hands them out
    on request only), a CUDA kernel's PTX where there is no CUDA runtime to JIT it (nvcc makes it)."""
    if kernel.formulation == "cube-amx" and host_can_run(kernel.target):
        request_amx()
    if kernel.target.kind.name == "cuda" and not tvm.runtime.enabled("cuda") and shutil.which("nvcc"):
        kernel.ptx
    return kernel

