"""What ``ptxas -v`` says about a CUDA kernel's PTX: registers, spills and shared memory per entry.

>>> for entry in ptxas_report(kernel.ptx, "sm_90"):
...     print(entry)          # bench_wgrad_..._kernel: 128 registers, 0 B spilled, 41472 B shared

:data:`MAX_REGISTERS` is what a thread may hold on every arch since sm_35; the package's shared-memory
budget is :data:`tvm_convgrad.schedule.tensor_core.SHARED_BYTES` (48 KB, below the H100's 227 KB).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_REGISTERS", "PtxasEntry", "ptxas_report"]

MAX_REGISTERS = 255


@dataclass(frozen=True)
class PtxasEntry:
    """The resources ``ptxas`` assigned to one ``.entry`` (a ``__global__`` kernel)."""

    name: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    stack_bytes: int

    def __str__(self) -> str:
        spilled = self.spill_stores + self.spill_loads
        return f"{self.name} ({self.arch}): {self.registers} registers, {spilled} B spilled, {self.shared_bytes} B shared"


def ptxas_report(ptx: str, arch: str = "sm_80") -> list[PtxasEntry]:
    """Assemble ``ptx`` for ``arch`` with ``ptxas -v`` (from the CUDA toolkit) and parse its report.

    Dynamic shared memory is not in ptxas's count: a kernel's ``shared_bytes`` is its static part
    (the launch adds the dynamic part, which TVM computes)."""
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
    return _parse(done.stderr, arch)


def _parse(log: str, arch: str) -> list[PtxasEntry]:
    entries = []
    for block in re.split(r"ptxas info\s+: Compiling entry function ", log)[1:]:
        name = re.match(r"'(\w+)'", block).group(1)
        used = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        stack = re.search(r"(\d+) bytes stack frame", block)
        entries.append(
            PtxasEntry(
                name, arch, int(used.group(1)) if used else 0, int(spills.group(1)) if spills else 0,
                int(spills.group(2)) if spills else 0, int(smem.group(1)) if smem else 0, int(stack.group(1)) if stack else 0,
            )
        )  # fmt: skip
    return entries
