"""Arrays placed flush against an inaccessible page, so that a kernel's stray access faults.

A read or write outside a tensor is invisible in its results when the stray lanes are dropped, and
valgrind sees it only where it lands outside every live allocation. Here each argument of a
kernel is a zero-copy DLPack view of ``mmap``-ed memory whose last byte sits right before a page
mapped ``PROT_NONE`` (side ``"after"``: overruns) or whose first byte sits right after one (side
``"before"``: underruns); any access past that edge is a segmentation fault.

TVM's kernels assume 64-byte aligned arguments (``from_dlpack`` checks it), so on the ``after``
side an array whose size is not a multiple of 64 bytes ends up to 63 bytes short of the page: a
stray access that stays within those bytes is not caught there (the ``before`` side has no gap).

Run the kernels in child processes (:func:`run_in_children`): a fault must fail a test, not end the
test run.
"""

from __future__ import annotations

import ctypes
import mmap
import subprocess
from dataclasses import dataclass

import numpy as np

__all__ = ["PAGE", "SIDES", "ChildFault", "GuardedMemory", "run_in_children"]

PAGE = mmap.PAGESIZE
SIDES = ("after", "before")
_ALIGN = 64
_STORAGE = {2: np.uint16, 1: np.uint8}  # DLPack has no bfloat16 (ml_dtypes): its bytes as uint16, viewed in TVM


class GuardedMemory:
    """Owner of guarded arrays (the mappings live as long as it does)."""

    def __init__(self):
        self._maps: list[mmap.mmap] = []
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def array(self, shape, dtype, side: str) -> np.ndarray:
        """An uninitialized ``(shape, dtype)`` numpy array touching a ``PROT_NONE`` page on ``side``."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        body = -(-(nbytes + _ALIGN) // PAGE) * PAGE
        mm = mmap.mmap(-1, body + 2 * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if side == "after":  # end as close to the guard page as the alignment allows
            offset = PAGE + body - nbytes
            offset -= offset % _ALIGN
            guard = base + PAGE + body
        elif side == "before":
            offset, guard = PAGE, base
        else:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        if self._libc.mprotect(guard, PAGE, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
        self._maps.append(mm)
        return np.frombuffer(mm, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)), offset=offset).reshape(shape)

    def tensor(self, array: np.ndarray, side: str):
        """A ``tvm.runtime.Tensor`` holding a copy of ``array`` in guarded memory (bf16 too)."""
        import tvm

        storage = self.array(array.shape, array.dtype, side)
        storage[...] = array
        if storage.dtype.kind in "fiu" and storage.dtype.name != "bfloat16":
            return tvm.runtime.from_dlpack(storage)
        raw = tvm.runtime.from_dlpack(storage.view(_STORAGE[storage.dtype.itemsize]))
        return raw._create_view(array.shape, str(array.dtype))

    def run(self, kernel, inputs: list[np.ndarray], side: str) -> np.ndarray:
        """``kernel(*inputs)`` with every input and the output guarded on ``side``; the result
        as numpy (copied out)."""
        from tvm_convgrad.compile import numpy_dtype

        tensors = [self.tensor(a, side) for a in inputs]
        out = self.tensor(np.zeros(kernel.output.shape, numpy_dtype(kernel.output.dtype)), side)
        kernel(*tensors, out=out)
        return out.numpy()


@dataclass(frozen=True)
class ChildFault:
    """A call a child process did not finish: its label, the child's exit status and stderr's tail."""

    label: str
    returncode: int
    stderr: str

    def __str__(self) -> str:
        how = f"signal {-self.returncode}" if self.returncode < 0 else f"exit {self.returncode}"
        return f"{self.label}: child died ({how}): {self.stderr[-600:]}"


def run_in_children(command: list[str], labels: list[str], timeout: float = 1500) -> list[ChildFault]:
    """Run the calls ``labels`` in child processes: ``command`` (a Python command line) gets the
    labels still to run as its last arguments, prints ``start <label>`` before each call and
    ``done`` at the end, and exits non-zero on a wrong result. A child that dies is a fault of
    the call it had started; the calls after it run in a new child. Returns the faults (empty:
    every call ran clean)."""
    faults, pending = [], list(labels)
    while pending:
        run = subprocess.run([*command, *pending], capture_output=True, text=True, timeout=timeout)
        started = [line.split(" ", 1)[1] for line in run.stdout.splitlines() if line.startswith("start ")]
        if run.returncode == 0 and run.stdout.rstrip().endswith("done"):
            return faults
        label = started[-1] if started else "(before the first call)"
        faults.append(ChildFault(label, run.returncode, run.stderr))
        if label not in pending:
            return faults
        pending = pending[pending.index(label) + 1 :]
    return faults
