"""Compile gradient tensors into callable kernels: TE -> PrimFunc -> schedule -> tvm.compile.

>>> dw = dsl.conv2d_backprop_filter(fmap, dy, filter_sizes, para_dict)
>>> kernel = tvm_convgrad.build(dw)              # or build([fmap, dy, dw], target="cuda")
>>> dw_np = kernel(fmap_np, dy_np)               # numpy in, numpy out
>>> kernel.time().gflops, kernel.source, kernel.export_library("dw.so")

Argument order (``Kernel.args``): the operator's inputs in TBE order, then the result:
``conv2d_backprop_filter``: ``(input_x, out_backprop, dw)``; ``conv2d_backprop_input``:
``(filters, out_backprop[, tensor_bias], dx)``. The compiled function's symbol is the
``kernel_name`` of the ``para_dict``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, te, tirx
from tvm.ir.instrument import pass_instrument
from tvm.target import Target

from . import schedule, usable_cores
from .dsl import framework_call, result_info
from .dsl.compute import ARGUMENT_STAGES, formulation
from .errors import ConvGradError
from .params import ConvGradParams
from .schedule.cuda import CudaRule
from .schedule.cuda import units as cuda_units
from .schedule.isa import IsaPlan, isa_plan, x86_triple

__all__ = [
    "ArgSpec", "ISA_MCPU", "Kernel", "KeepIndexWidth", "SHIPPED", "Timing", "build", "emulate_cuda", "isa_target", "lower", "numpy_dtype",
    "pass_context", "resolve_target", "schedule_key", "shipped_schedules",
]  # fmt: skip

_INT32_LIMIT = 2**31


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------


def _cuda_arch() -> str:
    dev = tvm.cuda(0)
    if tvm.runtime.enabled("cuda") and dev.exist:
        return "sm_" + dev.compute_version.replace(".", "")
    return "sm_80"


def resolve_target(target: str | dict | Target = "llvm") -> Target:
    """A :class:`tvm.target.Target` from ``"llvm"`` (this CPU, all cores; the environment
    variable ``TVM_CONVGRAD_MCPU`` names another LLVM CPU model, e.g. ``haswell`` to build and
    test the AVX2 plan on an AVX-512 machine), ``"cuda"`` (this GPU's arch, else sm_80), a target
    dict, or a Target."""
    if isinstance(target, Target):
        return target
    if isinstance(target, dict):
        try:
            return Target(target)
        except Exception as err:  # TVM's own message says which key is wrong
            raise ConvGradError("build", "target", target, f"is not a valid TVM target: {str(err).strip().splitlines()[-1]}") from None
    if target == "llvm":
        cpu = os.environ.get("TVM_CONVGRAD_MCPU") or tvm.target.codegen.llvm_get_system_cpu()
        return Target({"kind": "llvm", "mcpu": cpu, "num-cores": usable_cores()})
    if target == "cuda":
        return Target({"kind": "cuda", "arch": _cuda_arch()})
    raise ConvGradError("build", "target", target, "must be 'llvm', 'cuda', a target dict or a tvm.target.Target")


ISA_MCPU = {"avx512": "skylake-avx512", "avx2": "haswell", "sse": "x86-64"}
"""The LLVM CPU model that stands for a vector ISA when the host's own CPU is of another plan."""


def isa_target(isa: str = "native", cores: int | None = None) -> Target:
    """An x86 LLVM target for one vector ISA: ``"native"`` (this CPU, as ``"llvm"``), ``"avx512"``,
    ``"avx2"`` or ``"sse"``. The host's own CPU model when its plan is that ISA (so the code is
    tuned for it), else the model of :data:`ISA_MCPU` (e.g. AVX2 = ``haswell`` on an AVX-512
    machine) with an x86-64 triple (x86 code whatever the host: on an AArch64 one it cross-compiles);
    ``cores`` threads (default: every usable core)."""
    host = resolve_target("llvm")
    cores = cores or usable_cores()
    if isa == "native" or (isa in ISA_MCPU and isa_plan(host).name == isa):
        return Target({"kind": "llvm", "mcpu": str(host.attrs["mcpu"]), "num-cores": cores})
    if isa not in ISA_MCPU:
        raise ConvGradError("isa_target", "isa", isa, f"must be 'native' or one of {sorted(ISA_MCPU)}")
    return Target({"kind": "llvm", "mtriple": x86_triple(), "mcpu": ISA_MCPU[isa], "num-cores": cores})


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def _placeholders(output: te.Tensor) -> list[te.Tensor]:
    """The placeholders ``output`` reads, in TBE argument order (``ARGUMENT_STAGES``)."""
    stages = {t.op.name: t for t in _graph_tensors(output)}
    found: list[te.Tensor] = []
    for readers in ARGUMENT_STAGES.get(output.op.tag, ()):
        for stage in (stages[name] for name in readers if name in stages):
            for inp in stage.op.input_tensors:
                if isinstance(inp.op, te.PlaceholderOp) and not any(inp.same_as(f) for f in found):
                    found.append(inp)
    for t in stages.values():  # any others (a graph this package did not make): in walk order
        if isinstance(t.op, te.PlaceholderOp) and not any(t.same_as(f) for f in found):
            found.append(t)
    return found


def _graph_tensors(output: te.Tensor) -> list[te.Tensor]:
    tensors, stack, seen = [], [output], set()
    while stack:
        t = stack.pop()
        if hash(t.op) in seen:
            continue
        seen.add(hash(t.op))
        tensors.append(t)
        stack.extend(t.op.input_tensors)
    return tensors


def _arguments(tensors: te.Tensor | Sequence[te.Tensor]) -> tuple[list[te.Tensor], ConvGradParams | None]:
    """``(arguments in order, params)`` for a result tensor or an explicit argument list."""
    if isinstance(tensors, te.Tensor):
        info = result_info(tensors)
        if info is not None:
            return [*info[1], tensors], info[0]
        output, inputs = tensors, _placeholders(tensors)
    else:
        if not isinstance(tensors, (list, tuple)) or not tensors or not all(isinstance(t, te.Tensor) for t in tensors):
            raise ConvGradError("build", "tensors", tensors, "must be a result te.Tensor or a list [inputs..., result]")
        *inputs, output = tensors
        needed = _placeholders(output)
        missing = [t.op.name for t in needed if not any(t.same_as(i) for i in inputs)]
        extra = [t.op.name for t in inputs if not any(t.same_as(n) for n in needed)]
        if missing or extra:
            raise ConvGradError(
                "build", "tensors", [t.op.name for t in tensors],
                f"the inputs must be exactly the placeholders the result reads: missing {missing}, not read {extra}",
            )  # fmt: skip
    if "kernel_name" not in output.op.attrs:
        raise ConvGradError("build", "tensors", output.op.name, "the result must come from tvm_convgrad.dsl (or a frontend)")
    info = result_info(output)
    return [*inputs, output], (info[0] if info else None)


def _prim_func(args: list[te.Tensor], kernel_name: str, target: Target) -> tirx.PrimFunc:
    """64-bit indices on CPUs (address arithmetic without sign extensions), 32-bit on GPUs where
    every tensor allows it."""
    largest = max(math.prod(int(d) for d in t.shape) for t in _graph_tensors(args[-1]))
    wide = target.kind.name == "llvm" or largest >= _INT32_LIMIT
    func = te.create_prim_func(args, index_dtype_override="int64" if wide else None)
    return func.with_attr("global_symbol", kernel_name)


@pass_instrument
class KeepIndexWidth:
    """Skips TVM's ``NarrowDataType(32)``, which would turn the 64-bit indices of CPU kernels back
    into 32-bit ones: LLVM then sign-extends every address in the hot loops (and vectorizes that
    arithmetic), costing dX up to a third of its speed."""

    def should_run(self, mod, info) -> bool:
        return info.name != "tirx.NarrowDataType"


def pass_context(target: str | dict | Target = "llvm") -> tvm.transform.PassContext:
    """The ``PassContext`` the package compiles in; use it around your own ``tvm.compile`` of
    :func:`lower`'s module for the same code."""
    target = resolve_target(target)
    return tvm.transform.PassContext(instruments=[KeepIndexWidth()] if target.kind.name == "llvm" else [])


def lower(tensors: te.Tensor | Sequence[te.Tensor], target: str | dict | Target = "llvm") -> tvm.IRModule:
    """The scheduled ``IRModule`` of a gradient, ready for your own ``tvm.compile(mod, target)``
    (compile it inside :func:`pass_context` to get the package's code).

    Its one function is named by the ``kernel_name``.
    """
    target = resolve_target(target)
    args, _ = _arguments(tensors)
    name = str(args[-1].op.attrs["kernel_name"])
    sch = schedule.apply(_prim_func(args, name, target), target)
    return tvm.IRModule({name: sch.mod["main"]})


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------


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

    def __init__(
        self, executable, mod: tvm.IRModule, args: list[te.Tensor], params: ConvGradParams | None, target: Target, schedule: str = "default"
    ):
        self.executable = executable
        self.name = str(args[-1].op.attrs["kernel_name"])
        self.schedule = schedule
        """``"default"`` (the rule's deterministic schedule), ``"tuned:<database>"``, or
        ``"emulated:<cuda target>"`` (:func:`emulate_cuda`)."""
        self.units = cuda_units(mod[self.name])
        """What the CUDA schedule runs the mads on: ``"tensor-core"`` or ``"simt"`` (None on LLVM)."""
        self.mod = mod
        self.target = target
        self.params = params
        self.args = tuple(ArgSpec(t.op.name, tuple(int(d) for d in t.shape), str(t.dtype)) for t in args)
        self.call = framework_call(args[-1])
        """The framework operator's call (:class:`~tvm_convgrad.params.framework.FrameworkCall`) the
        kernel computes, or None for the TBE DSL's (whose inputs are 5HD / FracZ, see ``params``)."""
        self.flops = int(args[-1].op.attrs["flops"])
        self.formulation = formulation(t.op.name for t in _graph_tensors(args[-1]))
        """Which compute the gradient uses: ``"cube"`` (16x16 blocks), ``"cout-lanes"`` (dW with
        Cout on the lanes), ``"pixel-lanes"`` (dX with output columns on the lanes)."""
        self._ptx: str | None = None

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
        return tvm.runtime.tensor(np.ascontiguousarray(value), self.device)

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
        self.executable[self.name](*tensors, result)
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
        evaluator = self.executable.mod.time_evaluator(
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
        """PTX of a CUDA kernel, compiled with nvcc from the generated CUDA source."""
        if self.target.kind.name != "cuda":
            raise ValueError(f"{self.name} is an LLVM kernel: it has no PTX")
        if self._ptx is None:
            built = self.executable.mod.imports[0].inspect_source("ptx")
            if not built:
                if shutil.which("nvcc") is None:
                    raise RuntimeError("PTX needs nvcc (no CUDA runtime here to compile it) and nvcc is not on PATH")
                from tvm.support import nvcc

                arch = str(self.target.attrs.get("arch", "sm_80"))
                with self.target:
                    built = nvcc.compile_cuda(self.source, target_format="ptx", arch=arch, compiler="nvcc").decode()
            self._ptx = built
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


# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------

CACHED_KERNELS = 256
"""How many compiled kernels :func:`build` keeps (the least recently built or reused are dropped
first): a notebook or a bench never compiles twice, and a long sweep does not hold every
executable it ever built."""
_CACHE: OrderedDict[tuple[int, str, str], list[tuple[tirx.PrimFunc, Kernel]]] = OrderedDict()


def _cached(key: tuple[int, str, str], func: tirx.PrimFunc) -> Kernel | None:
    for cached_func, kernel in _CACHE.get(key, []):
        if tvm_ffi.structural_equal(cached_func, func):
            _CACHE.move_to_end(key)
            return kernel
    return None


def _cache(key: tuple[int, str, str], func: tirx.PrimFunc, kernel: Kernel):
    _CACHE.setdefault(key, []).append((func, kernel))
    _CACHE.move_to_end(key)
    while sum(len(v) for v in _CACHE.values()) > CACHED_KERNELS:
        _CACHE.popitem(last=False)


SHIPPED = "shipped"
"""``build(..., schedules=SHIPPED)``: the tuned records shipped for the target, if any."""


def schedule_key(target: Target) -> str:
    """The name of a target's shipped database: ``<kind>-<mcpu>-<plan>`` (``llvm-znver4-avx512``)."""
    if target.kind.name == "llvm":
        return f"llvm-{target.attrs.get('mcpu', 'generic')}-{isa_plan(target).name}"
    return f"{target.kind.name}-{target.attrs.get('arch', 'generic')}"


def shipped_schedules(target: Target) -> str | None:
    """The folder of the records shipped for ``target`` (``schedules/<schedule_key>``), or None."""
    from importlib import resources

    try:
        folder = resources.files("tvm_convgrad_schedules").joinpath(schedule_key(target))
    except ModuleNotFoundError:
        return None
    return str(folder) if folder.joinpath("database_workload.json").is_file() else None


def _schedule(func: tirx.PrimFunc, target: Target, schedules) -> tuple[Any, str]:
    """``(s_tir.Schedule, how)``: a tuned record's when the database has one, else the rule's."""
    path = shipped_schedules(target) if schedules == SHIPPED else schedules
    if path is not None:
        from .tune import tuned_schedule

        sch = tuned_schedule(func, target, path)
        if sch is not None:
            return sch, f"tuned:{os.path.basename(os.path.normpath(path))}"
    return schedule.apply(func, target), "default"


def build(tensors: te.Tensor | Sequence[te.Tensor], target: str | dict | Target = "llvm", schedules: str | os.PathLike | None = SHIPPED) -> Kernel:
    """Compile a gradient for ``target`` (``"llvm"``, ``"cuda"``, a dict or a Target).

    ``tensors`` is the result of ``tvm_convgrad.dsl`` (its inputs are known), or the argument
    list ``[inputs..., result]`` as for ``te.create_prim_func``. ``schedules``: the tuning
    records to look the workload up in — the ones shipped for this target (default), a database
    folder written by :func:`tvm_convgrad.tune`, or None for the rule's default schedule
    (``Kernel.schedule`` says which was used). Compiled kernels are cached by workload, target
    and schedules: building the same thing twice returns the same :class:`Kernel`.
    """
    target = resolve_target(target)
    args, params = _arguments(tensors)
    name = str(args[-1].op.attrs["kernel_name"])
    func = _prim_func(args, name, target)
    key = (tvm_ffi.structural_hash(func), str(target), str(schedules))
    kernel = _cached(key, func)
    if kernel is not None:
        return kernel
    sch, how = _schedule(func, target, schedules)
    mod = tvm.IRModule({name: sch.mod["main"]})
    with pass_context(target):
        executable = tvm.compile(mod, target=target)
    kernel = Kernel(executable, mod, args, params, target, how)
    if target.kind.name == "cuda" and not tvm.runtime.enabled("cuda") and shutil.which("nvcc"):
        kernel.ptx  # no CUDA runtime to JIT it: produce the PTX now, with nvcc
    _cache(key, func, kernel)
    return kernel


EMULATION_TARGET = Target({"kind": "llvm", "num-cores": 1})
"""Generic x86-64 code for :func:`emulate_cuda`, whatever the host: the emulation checks index math,
not speed. (With ``mcpu=znver3`` LLVM miscompiles the emulated SIMT kernel of a depthwise dW —
odd lanes wrong in ``tests/test_cuda.py``'s ``n2_c144-144_g144`` case — while the same TIR for a
generic CPU matches the reference.)"""


def emulate_cuda(tensors: te.Tensor | Sequence[te.Tensor], target: str | dict | Target = "cuda", schedules: str | os.PathLike | None = None,
                 seed: int | None = None) -> Kernel:  # fmt: skip
    """The CUDA schedule of a gradient, built for this CPU: the same tiling, shared-memory staging,
    padding and fragment layout as :func:`build` gives ``target``, with the thread bindings left as
    serial loops and each tensor-core intrinsic as the plain TIR that TVM registers as its
    description (see :mod:`.schedule.tensor_core`). It runs here like any LLVM kernel, so the CUDA
    schedule's index math is checked against the reference without a GPU; what it cannot check is
    TVM's intrinsics themselves and races between threads.

    The tiles are the rule's default, those of the tuned record for ``target`` in the database
    folder ``schedules`` (a :func:`tvm_convgrad.tune` result: the tuned kernel, checked here before
    it is shipped), or, with ``seed``, tiles drawn as a tuning run draws them."""
    cuda = resolve_target(target)
    if cuda.kind.name != "cuda":
        raise ConvGradError("emulate_cuda", "target", str(cuda.kind.name), "must be a cuda target")
    args, params = _arguments(tensors)
    name = str(args[-1].op.attrs["kernel_name"])
    func = _prim_func(args, name, cuda)
    rule, how = CudaRule(emulate=True), "emulated:" + schedule_key(cuda)
    sch, decisions = rule.apply(func, cuda, tunable=True), None
    if schedules is not None:
        from .tune import tuned_schedule

        tuned = tuned_schedule(func, cuda, schedules)
        if tuned is None:
            raise ConvGradError("emulate_cuda", "schedules", str(schedules), f"must hold a tuned record of {name} for {cuda}")
        if _pipelined(tuned.trace) != _pipelined(sch.trace):  # the tuned kernel is from the other design space
            sch = s_tir.Schedule(func, error_render_level="none")
            rule.schedule(sch, cuda, tunable=True, double_buffer="switched")
        decisions, how = _sample_decisions(tuned.trace), f"emulated:tuned:{os.path.basename(os.path.normpath(schedules))}"
    if decisions is not None or seed is not None:
        sch = _replay(sch.trace, func, decisions, seed)
    mod = tvm.IRModule({name: sch.mod["main"]})
    executable = tvm.compile(mod, target=EMULATION_TARGET)
    return Kernel(executable, mod, args, params, EMULATION_TARGET, how)


def _pipelined(trace: s_tir.Trace) -> bool:
    return "software_pipeline_stage" in str(trace)


def _sample_decisions(trace: s_tir.Trace) -> list:
    """The decisions of a trace's sampling instructions, in order."""
    return [trace.decisions[inst] for inst in trace.insts if inst in trace.decisions]


def _replay(trace: s_tir.Trace, func: tirx.PrimFunc, decisions: list | None, seed: int | None) -> s_tir.Schedule:
    """``trace`` on ``func`` with its samples' ``decisions`` (in order), or drawn anew (``seed``)."""
    samples = [inst for inst in trace.insts if inst in trace.decisions]
    if decisions is not None and len(decisions) != len(samples):
        raise ConvGradError("emulate_cuda", "schedules", f"{len(decisions)} sampled tiles", f"must match the rule's {len(samples)} samples")
    sch = s_tir.Schedule(func, seed=seed, error_render_level="none")
    s_tir.Trace(trace.insts, dict(zip(samples, decisions)) if decisions is not None else {}).apply_to_schedule(sch, remove_postproc=False)
    return sch
