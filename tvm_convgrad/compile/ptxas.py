"""A CUDA module's PTX (:func:`ptx_of`) and what ``ptxas -v`` says about it: registers, spills and
shared memory per entry.

>>> for entry in kernel_report(kernel):     # a CUDA Kernel; ptxas_report(ptx, arch) for any PTX
...     print(entry)          # bench_wgrad_..._kernel: 128 registers, 0 B spilled, 4096 B shared + 19456 B dynamic

:data:`MAX_REGISTERS` is what a thread may hold on every arch since sm_35; the package's shared-memory
budget is :data:`tvm_convgrad.schedule.cuda.gemm.SHARED_BYTES` (48 KB, below the H100's 227 KB).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["MAX_REGISTERS", "PtxasEntry", "dynamic_shared_bytes", "kernel_report", "parse_report", "ptx_of", "ptxas_report", "spilled", "target_arch"]

MAX_REGISTERS = 255


@dataclass(frozen=True)
class PtxasEntry:
    """The resources ``ptxas`` assigned to one ``.entry`` (a ``__global__`` kernel), and the
    dynamic shared memory its launch adds (:func:`kernel_report`; 0 from :func:`ptxas_report`)."""

    name: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    stack_bytes: int
    dynamic_shared_bytes: int = 0

    @property
    def total_shared_bytes(self) -> int:
        """Static and dynamic shared memory of one thread block: what the budget bounds."""
        return self.shared_bytes + self.dynamic_shared_bytes

    def __str__(self) -> str:
        spilled = self.spill_stores + self.spill_loads
        return (f"{self.name} ({self.arch}): {self.registers} registers, {spilled} B spilled, {self.shared_bytes} B shared"
                + (f" + {self.dynamic_shared_bytes} B dynamic" if self.dynamic_shared_bytes else ""))  # fmt: skip


def target_arch(target) -> str:
    """The ``sm_XX`` a CUDA target compiles for (sm_80 where it names none)."""
    return str(target.attrs.get("arch", "sm_80"))


def ptx_of(module, target) -> str:
    """PTX of a compiled CUDA module (``tvm.compile(...).mod``): the one the CUDA runtime built, or,
    on a machine without it, nvcc's from the module's generated CUDA source for ``target``'s arch."""
    built = module.imports[0].inspect_source("ptx")
    if built:
        return built
    if shutil.which("nvcc") is None:
        raise RuntimeError("PTX needs nvcc (no CUDA runtime here to compile it) and nvcc is not on PATH")
    from tvm.support import nvcc

    with target:
        return nvcc.compile_cuda(module.imports[0].inspect_source("cuda"), target_format="ptx", arch=target_arch(target), compiler="nvcc").decode()


def spilled(entries: list[PtxasEntry]) -> list[PtxasEntry]:
    """The entries that spill registers to local memory (stores or loads)."""
    return [e for e in entries if e.spill_stores or e.spill_loads]


def ptxas_report(ptx: str, arch: str = "sm_80") -> list[PtxasEntry]:
    """Assemble ``ptx`` for ``arch`` with ``ptxas -v`` (from the CUDA toolkit) and parse its report:
    one entry per ``.entry`` of the PTX. A report it cannot read raises ``ValueError`` (never a
    silent 0 registers or spills).

    Dynamic shared memory is not in ptxas's count: a kernel's ``shared_bytes`` is its static part
    (:func:`kernel_report` adds the dynamic part the launch requests)."""
    if shutil.which("ptxas") is None:
        raise RuntimeError("ptxas_report needs ptxas (CUDA toolkit) on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "kernel.ptx")
        source.write_text(ptx)
        done = subprocess.run(
            ["ptxas", "-v", f"-arch={arch}", str(source), "-o", str(Path(tmp, "kernel.cubin"))], capture_output=True, text=True
        )
    if done.returncode != 0:
        raise RuntimeError(f"ptxas rejected the PTX for {arch}:\n{done.stderr.strip()}")
    entries = parse_report(done.stderr, arch)
    expected = set(re.findall(r"\.entry\s+(\w+)", ptx))
    if {e.name for e in entries} != expected:
        raise ValueError(f"ptxas reported the kernels {sorted(e.name for e in entries)}, the PTX has {sorted(expected)}:\n{done.stderr}")
    return entries


def parse_report(log: str, arch: str) -> list[PtxasEntry]:
    """The entries of a ``ptxas -v`` log. Every entry must state its registers and its stack /
    spill line; ``smem`` appears only where a kernel has static shared memory (else 0)."""
    entries = []
    for block in re.split(r"ptxas info\s+: Compiling entry function ", log)[1:]:
        name = re.match(r"'(\w+)'", block)
        used = re.search(r"Used (\d+) registers", block)
        spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
        if name is None or used is None or spills is None:
            raise ValueError(f"cannot read ptxas's report of an entry (no name, 'Used N registers' or spill line):\n{block.strip()}")
        smem = re.search(r"(\d+) bytes smem", block)
        entries.append(PtxasEntry(name.group(1), arch, int(used.group(1)), int(spills.group(2)), int(spills.group(3)),
                                  int(smem.group(1)) if smem else 0, int(spills.group(1))))  # fmt: skip
    if not entries:
        raise ValueError(f"ptxas's report names no entry function:\n{log.strip()}")
    return entries


def dynamic_shared_bytes(kernel) -> dict[str, int]:
    """Bytes of dynamic shared memory (``shared.dyn``, after TVM merges a kernel's buffers into one)
    each GPU kernel of a CUDA :class:`~tvm_convgrad.Kernel` launches with, by kernel (PTX entry)
    name: its scheduled TIR lowered as ``tvm.compile`` lowers it (the target bound with its host,
    TVM's default pipeline for it), one device function per GPU kernel."""
    import tvm
    from tvm.target import Target

    host = Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    mod = tvm.tirx.transform.BindTarget(Target(kernel.target).with_host(host))(kernel.mod)
    lower, _, _ = tvm.tirx.get_default_tir_pipeline(kernel.target)
    with tvm.transform.PassContext():
        lowered = lower(mod)
    sizes = {}
    for gv, func in lowered.functions.items():
        if func.attrs is None or "tirx.kernel_launch_params" not in func.attrs:
            continue  # the host function
        sizes[gv.name_hint] = sum(_bytes(buffer) for buffer in _allocations(func.body) if buffer.scope() == "shared.dyn")
    return sizes


def _allocations(stmt) -> list:
    """The buffers allocated anywhere in ``stmt`` (TVM 0.27 has no Python statement visitor)."""
    found = [stmt.buffer] if type(stmt).__name__ == "AllocBuffer" else []
    for child in (getattr(stmt, "body", None), getattr(stmt, "then_case", None), getattr(stmt, "else_case", None)):
        if child is not None:
            found += _allocations(child)
    for child in getattr(stmt, "seq", None) or ():
        found += _allocations(child)
    return found


def _bytes(buffer) -> int:
    import tvm

    count = 1
    for d in buffer.shape:
        count *= int(d)
    return count * tvm.DataType(buffer.dtype).bits // 8


def kernel_report(kernel) -> list[PtxasEntry]:
    """:func:`ptxas_report` of a CUDA kernel's PTX for its arch, each entry with the dynamic shared
    memory its launch adds (:func:`dynamic_shared_bytes`)."""
    dynamic = dynamic_shared_bytes(kernel)
    entries = ptxas_report(kernel.ptx, target_arch(kernel.target))
    unknown = {e.name for e in entries} - set(dynamic)
    if unknown:
        raise ValueError(f"{kernel.name}: PTX entries {sorted(unknown)} match no kernel launch of its TIR ({sorted(dynamic)})")
    return [replace(e, dynamic_shared_bytes=dynamic[e.name]) for e in entries]
