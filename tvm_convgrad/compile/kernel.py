"""A compiled gradient (:class:`Kernel`): callable on numpy arrays or TVM tensors, timed, inspected, exported.

>>> kernel = tvm_convgrad.build(dw)              # or build([fmap, dy, dw], target="cuda")
>>> dw_np = kernel(fmap_np, dy_np)               # numpy in, numpy out
>>> kernel.time().gflops, kernel.source, kernel.export_library("dw.so")
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tvm
from tvm.target import Target

from ..errors import ConvGradError
from ..isa import IsaPlan, isa_plan
from ..schedule.cuda import units as cuda_units
from .ptxas import ptx_of
from .workload import Workload

__all__ = ["ArgSpec", "Kernel", "Timing", "numpy_dtype"]


@dataclass(frozen=True)
class ArgSpec:
    """One argument of a kernel: its placeholder name, static shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Timing:
    """Seconds per run, one entry per repeat, and the derived rates."""

    results: tuple[float, ...]
    flops: int

    @property
    def median(self) -> float:
        return float(np.median(self.results))

    @property
    def mean(self) -> float:
        return float(np.mean(self.results))

    @property
    def min(self) -> float:
        return float(np.min(self.results))

    @property
    def gflops(self) -> float:
        """GFLOP/s at the median time."""
        return self.flops / self.median / 1e9

    def __str__(self) -> str:
        return f"{self.median * 1e3:.3f} ms (median of {len(self.results)}), {self.gflops:.1f} GFLOP/s"


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a TVM dtype string (``bfloat16``: ``ml_dtypes.bfloat16``)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _random_array(spec: ArgSpec, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, spec.shape).astype(numpy_dtype(spec.dtype))


class Kernel:
    """A compiled gradient: callable on numpy arrays (returns numpy) or ``tvm.runtime.Tensor``.

    ``args`` lists the arguments in call order (inputs, then the result); call with the inputs
    only. ``flops`` is ``2*N*Cout*(Cin/groups)*KH*KW*Ho*Wo``.
    """

    def __init__(self, executable, mod: tvm.IRModule | None, workload: Workload, target: Target, schedule: str = "default", *,
                 library: tvm.runtime.Module | None = None, rebuild: Callable[[], tuple[Any, tvm.IRModule]] | None = None):  # fmt: skip
        self._executable, self._mod, self._rebuild = executable, mod, rebuild
        self.library = library
        """The shared library the function runs from, for a kernel stored on disk (:mod:`.stored`), else None."""
        self.name = workload.name
        self.schedule = schedule
        """``"default"`` (the rule's deterministic schedule), ``"tuned:<database>"``, or
        ``"emulated:<cuda target>"`` (:func:`emulate_cuda`)."""
        self.units = cuda_units(mod[self.name]) if mod is not None else None
        """What the CUDA schedule runs the mads on: ``"tensor-core"`` or ``"simt"`` (None on LLVM)."""
        self.workload = workload
        self.target = target
        self.params = workload.params
        self.args = tuple(ArgSpec(t.op.name, tuple(int(d) for d in t.shape), str(t.dtype)) for t in workload.args)
        self.call = workload.call
        """The framework operator's call (:class:`~tvm_convgrad.params.framework.FrameworkCall`) the
        kernel computes, or None for the TBE DSL's (whose inputs are 5HD / FracZ, see ``params``)."""
        self.flops = workload.flops
        self.formulation = workload.formulation
        """Which compute the gradient uses: ``"cube"`` (16x16 blocks; ``"cube-bf16"`` / ``"cube-amx"``
        its bf16-pair forms), ``"cout-lanes"`` (dW with Cout on the lanes; ``"cout-lanes-bf16"``),
        ``"pixel-lanes"`` (dX with output columns on the lanes), ``"depthwise"``, or ``"zero"`` (a
        dX no tap reaches: the result is 0, no mad)."""
        self._ptx: str | None = None

    def _built(self):
        """A kernel loaded from disk: its executable and scheduled module made again, on first use."""
        if self._executable is None or self._mod is None:
            self._executable, self._mod = self._rebuild()

    @property
    def executable(self):
        """What ``tvm.compile`` made (a kernel loaded from disk: compiled again on first use, for inspection)."""
        self._built()
        return self._executable

    @property
    def mod(self) -> tvm.IRModule:
        """The scheduled ``IRModule`` (a kernel loaded from disk: scheduled again on first use)."""
        self._built()
        return self._mod

    @property
    def _runtime(self) -> tvm.runtime.Module:
        return self.library if self.library is not None else self.executable.mod

    @functools.cached_property
    def function(self) -> tvm.runtime.PackedFunc:
        """The compiled function itself, ``function(*inputs, result)`` on tensors (``tvm.runtime.Tensor``
        or DLPack-capable, e.g. torch), no checks: looked up once (a module lookup costs ~50 us)."""
        return self._runtime[self.name]

    @property
    def isa(self) -> IsaPlan | None:
        """The vector-ISA plan the CPU schedule sized its register tiles for (None on CUDA)."""
        return isa_plan(self.target) if self.target.kind.name == "llvm" else None

    def __repr__(self) -> str:
        sig = ", ".join(f"{a.name}: {a.dtype}{list(a.shape)}" for a in self.args[:-1])
        out = self.args[-1]
        plan = ", ".join(p for p in (self.isa.name if self.isa else self.units, self.formulation, None if self.schedule == "default" else self.schedule) if p)
        return f"<Kernel {self.name}({sig}) -> {out.dtype}{list(out.shape)} on {self.target.kind.name} [{plan}]>"

    @property
    def inputs(self) -> tuple[ArgSpec, ...]:
        return self.args[:-1]

    @property
    def output(self) -> ArgSpec:
        return self.args[-1]

    @property
    def device(self) -> tvm.runtime.Device:
        return tvm.cuda(0) if self.target.kind.name == "cuda" else tvm.cpu(0)

    @property
    def has_device(self) -> bool:
        """Whether this machine can run the kernel (always for LLVM; a GPU for CUDA)."""
        return self.target.kind.name != "cuda" or (tvm.runtime.enabled("cuda") and self.device.exist)

    def _check_device(self):
        if not self.has_device:
            raise RuntimeError(
                f"{self.name} is a CUDA kernel and this machine has no CUDA device: use .source / .ptx, "
                "or export_library() and load it where a GPU is"
            )

    def _to_device(self, i: int, value: Any) -> tvm.runtime.Tensor:
        spec = self.args[i]
        shape, dtype = tuple(value.shape), str(value.dtype)
        if shape != spec.shape or dtype != spec.dtype:
            raise ConvGradError(
                self.name, f"argument {i} ({spec.name})", f"{dtype}{list(shape)}", f"must be {spec.dtype}{list(spec.shape)}"
            )
        if isinstance(value, tvm.runtime.Tensor):
            return value
        return tvm.runtime.tensor(np.asarray(value, order="C"), self.device)  # (ascontiguousarray makes a 0-d array 1-d)

    def __call__(self, *inputs: Any, out: tvm.runtime.Tensor | None = None):
        """Run on the inputs (numpy arrays or ``tvm.runtime.Tensor``); returns the result.

        The result is a numpy array when the inputs are numpy arrays and ``out`` is not given,
        else the ``tvm.runtime.Tensor`` written (``out``, or a new one).
        """
        if len(inputs) != len(self.inputs):
            names = [a.name for a in self.inputs]
            raise ConvGradError(self.name, "inputs", f"{len(inputs)} arrays", f"must be {len(names)} arrays: {names}")
        self._check_device()
        tensors = [self._to_device(i, v) for i, v in enumerate(inputs)]
        result = self._to_device(len(inputs), out) if out is not None else tvm.runtime.empty(self.output.shape, self.output.dtype, self.device)
        self.function(*tensors, result)
        if out is None and all(isinstance(v, np.ndarray) for v in inputs):
            return result.numpy()
        return result

    def time(self, *inputs: Any, repeat: int = 5, min_repeat_ms: int = 100, seed: int = 0) -> Timing:
        """Time the kernel (compile excluded) on ``inputs``, or on random ones when none are given.

        Each of the ``repeat`` results is the mean of as many runs as fill ``min_repeat_ms``.
        """
        self._check_device()
        rng = np.random.default_rng(seed)
        arrays = inputs or tuple(_random_array(a, rng) for a in self.inputs)
        tensors = [self._to_device(i, v) for i, v in enumerate(arrays)]
        result = tvm.runtime.empty(self.output.shape, self.output.dtype, self.device)
        evaluator = self._runtime.time_evaluator(
            self.name, self.device, number=1, repeat=repeat, min_repeat_ms=int(min_repeat_ms)
        )
        return Timing(tuple(evaluator(*tensors, result).results), self.flops)

    # --- what was generated -----------------------------------------------------------------

    def inspect_source(self, fmt: str = "") -> str:
        """Generated code: ``"asm"`` / ``"ll"`` (LLVM host code), ``"cuda"`` (CUDA C++), ``"ptx"``,
        ``"tir"`` (the scheduled TensorIR). The default is ``"cuda"`` on CUDA, ``"asm"`` on LLVM."""
        cuda = self.target.kind.name == "cuda"
        fmt = fmt or ("cuda" if cuda else "asm")
        if fmt == "tir":
            return self.mod.script()
        if fmt == "ptx":
            return self.ptx
        if fmt == "cuda":
            if not cuda:
                raise ValueError(f"{self.name} is an LLVM kernel: it has no CUDA source")
            return self.executable.mod.imports[0].inspect_source("cuda")
        return self.executable.mod.inspect_source(fmt)

    @property
    def source(self) -> str:
        """CUDA C++ for a CUDA kernel, assembly for an LLVM kernel."""
        return self.inspect_source()

    @property
    def ptx(self) -> str:
        """PTX of a CUDA kernel (:func:`.ptxas.ptx_of`: the CUDA runtime's, or nvcc's from the source)."""
        if self.target.kind.name != "cuda":
            raise ValueError(f"{self.name} is an LLVM kernel: it has no PTX")
        if self._ptx is None:
            self._ptx = ptx_of(self.executable.mod, self.target)
        return self._ptx

    @property
    def ptx_entries(self) -> list[str]:
        """Names of the GPU kernels (``.entry`` functions) in :attr:`ptx`."""
        return re.findall(r"\.entry\s+(\w+)", self.ptx)

    def export_library(self, path: str | os.PathLike) -> str:
        """Write a shared library that ``tvm.runtime.load_module(path)[kernel.name]`` runs with
        the TVM runtime alone (a CUDA library holds CUDA source, compiled when loaded)."""
        path = os.fspath(path)
        self.executable.export_library(path)
        return path
