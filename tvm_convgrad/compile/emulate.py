"""Kernels for hardware this machine lacks, run on this CPU: the CUDA schedule of a gradient
(:func:`emulate_cuda`: its index math checked against the reference without a GPU) and a bf16
gradient's ``vdpbf16ps`` kernel (:func:`emulate_bf16_dot`: the instruction's arithmetic without
AVX512-BF16)."""

from __future__ import annotations

import os
from typing import Sequence

import tvm
from tvm import s_tir, te, tirx
from tvm.target import Target

from ..schedule.cpu.marks import lower_marks
from .. import schedule
from ..errors import ConvGradError
from ..isa import has_amx_bf16, has_bf16_dot, host_can_run
from ..schedule.cpu.amx import request_amx
from ..schedule.cuda import CudaRule
from .kernel import Kernel
from .records import database_folder, schedule_key, tuned_schedule
from .target import pass_context, resolve_target
from .workload import Workload

__all__ = ["EMULATION_TARGET", "emulate_bf16_dot", "emulate_cuda"]


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
    workload = Workload.of(tensors)
    name = workload.name
    func = workload.prim_func(cuda)
    rule, how = CudaRule(emulate=True), "emulated:" + schedule_key(cuda)
    sch, decisions = rule.apply(func, cuda, tunable=True), None
    if schedules is not None:
        schedules = database_folder(schedules)  # a tune() work_dir: its kept records
        tuned = tuned_schedule(func, cuda, schedules)
        if tuned is None:
            raise ConvGradError("emulate_cuda", "schedules", str(schedules), f"must hold a tuned record of {name} for {cuda}")
        if _pipelined(tuned.trace) != _pipelined(sch.trace):  # the tuned kernel is from the other design space
            sch = rule.schedule(s_tir.Schedule(func, error_render_level="none"), cuda, tunable=True, config=rule.switched(cuda))
        decisions, how = _sample_decisions(tuned.trace), f"emulated:tuned:{os.path.basename(os.path.normpath(schedules))}"
    if decisions is not None or seed is not None:
        sch = _replay(sch.trace, func, decisions, seed)
    mod = tvm.IRModule({name: sch.mod["main"]})
    executable = tvm.compile(mod, target=EMULATION_TARGET)
    return Kernel(executable, mod, workload, EMULATION_TARGET, how)


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


def emulate_bf16_dot(tensors: te.Tensor | Sequence[te.Tensor], target: str | dict | Target = "llvm", amx: bool = False) -> Kernel:
    """The kernel a ``vdpbf16ps`` target builds for a bf16 gradient (its bf16-pair form, the same
    tiles), compiled for ``target`` (default: this machine), which must be an LLVM target this
    machine runs. Where ``target`` has AVX512-BF16 it runs ``vdpbf16ps`` (:func:`~tvm_convgrad.build`'s
    kernel where that pays, :attr:`~tvm_convgrad.isa.IsaPlan.bf16_dot_pays`); elsewhere each ``vdpbf16ps`` is its arithmetic in portable code
    (:data:`~tvm_convgrad.schedule.cpu.bf16.DPBF16_EMULATED_LLVM`: DAZ inputs, two FTZ FMAs per
    pair, odd before even), so the results are the instruction's, on any CPU. ``Kernel.schedule``
    says ``emulated:bf16-dot`` then.

    ``amx``: the kernel an AMX-BF16 target builds (a 2-D dW or dX in AMX tiles,
    :mod:`tvm_convgrad.schedule.cpu.amx`), its ``tdpbf16ps`` tiles emulated where ``target`` lacks
    them (:data:`~tvm_convgrad.schedule.cpu.amx_llvm.AMX_EMULATED_LLVM`: even before odd, DAZ,
    FTZ); ``Kernel.schedule`` says ``emulated:amx-bf16`` then."""
    host = resolve_target(target)
    if host.kind.name != "llvm" or not host_can_run(host):
        raise ConvGradError("emulate_bf16_dot", "target", str(host), "must be an llvm target this machine runs")
    workload = Workload.of(tensors)
    if workload.bf16_pairs is None:
        raise ConvGradError("emulate_bf16_dot", "tensors", workload.name, "must be a bf16 result of a tvm_convgrad.frontends operator")
    paired = workload.paired(amx)
    mod = lower_marks(tvm.IRModule({paired.name: schedule.apply(paired.prim_func(host), host).mod["main"]}))
    with pass_context(host):
        executable = tvm.compile(mod, target=host)
    if amx:
        native = has_amx_bf16(host) and request_amx()
        return Kernel(executable, mod, paired, host, "default" if native else "emulated:amx-bf16")
    return Kernel(executable, mod, paired, host, "default" if has_bf16_dot(host) else "emulated:bf16-dot")
