"""CUDA schedule rule for the two gradients: tensor cores for every GEMM-shaped mad, SIMT elsewhere.

* With fp16 inputs, the packs are stored as fp16 (:func:`.tensor_core.narrow_packs`) and every mad
  that is a GEMM — each cube formulation: dW's ``dw_cc`` and ``dw_cc_t``, each stride phase of
  dX's ``dx_cc_*`` and ``dx_px_*`` — runs on tensor cores (:mod:`.tensor_core`): its packs are
  gathered into shared memory, its result stages are inlined into the copy of its tile to global
  memory.
* What is left is SIMT (:mod:`.simt`): depthwise mads (the channel is in both operands: no GEMM),
  the framework operators' fp32 and bf16 inputs (an f16 tensor core would round them), the result
  of several stride phases — a thread per output, the packs a thread block reads gathered into
  shared memory, or, for few outputs with long reductions, each sum split across threads.

``tunable=True``: the tensor cores' thread-block, warp and K-step tiles are MetaSchedule samples
(``sample_perfect_tile``) whose default decisions are this schedule (the SIMT tiles stay fixed).

``CudaRule().apply(func, target)`` schedules for the GPU; ``CudaRule(emulate=True)`` gives the same
schedule with serial loops and plain buffers, which LLVM builds and runs on a CPU (see
:mod:`.tensor_core`). :func:`units` says which units a scheduled function uses.
"""

from __future__ import annotations

from dataclasses import replace

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .common import PACK_STAGES, inline_layout_stages, stage_blocks
from .simt import schedule_simt
from .tensor_core import SHARED_BYTES, Config, Lowering, as_gemm, get_config, mad_gemm, narrow_packs, sm_count, tensorize_gemm

__all__ = ["CudaRule", "UNITS", "units", "with_limits"]

UNITS = "convgrad.units"
"""Annotation of the root block of a CUDA-scheduled function: ``"tensor-core"`` or ``"simt"``."""


class CudaRule(ScheduleRule):
    """Schedule rule for ``cuda`` targets (usable in ``dlight.ApplyDefaultSchedule``)."""

    def __init__(self, emulate: bool = False):
        self.lowering = Lowering(emulate)

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "cuda"

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule | None:
        """The rule's schedule of ``func``; ``tunable``: the tensor cores' tiles are MetaSchedule
        samples (see :func:`.tensor_core.tensorize_gemm`), their default decisions this schedule."""
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func, error_render_level="none")
        self.schedule(sch, target, tunable)
        return sch

    def design_spaces(self, sch: s_tir.Schedule, target: Target) -> list[s_tir.Schedule]:
        """MetaSchedule's design spaces for ``sch`` (an unscheduled traced schedule): the tunable
        schedule, and the same with the operand tiles' double buffering switched (where the
        rule's choice has an alternative: whether a pipeline pays is for the GPU to say)."""
        other = sch.copy()
        self.schedule(sch, target, tunable=True)
        try:
            self.schedule(other, target, tunable=True, double_buffer="switched")
        except NoAlternative:
            return [sch]
        return [sch, other]

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False, double_buffer: str = "rule") -> None:
        """Schedule the TE function in ``sch`` in place (MetaSchedule's design space runs this on
        its own traced schedule). ``double_buffer="switched"``: each GEMM with the other choice
        than :func:`.tensor_core.get_config`'s (:class:`NoAlternative` where it has none)."""
        inline_layout_stages(sch)
        packs = [b for b in stage_blocks(sch) if sch.get(b).name_hint in PACK_STAGES]
        gemms = []  # (mad, Config) of the mads that run on tensor cores
        half = all(region.source.dtype == "float16" for b in packs for region in sch.get(b).reads)
        if half:
            for mad in stage_blocks(sch):
                gemm = mad_gemm(sch, mad) if _is_reduction(sch.get(mad)) else None
                if gemm is not None:
                    gemms.append((mad, _double_buffer(get_config(gemm, target), double_buffer)))
            narrow_packs(sch, packs)  # exact; the tensor cores' operands, half the shared memory of a SIMT gather
        if double_buffer != "rule" and not gemms:
            raise NoAlternative("no tensor-core GEMM: nothing is double-buffered")
        for mad, config in gemms:  # every mad re-indexed before any is tiled (they share packs)
            as_gemm(sch, mad, config)
        on_tensor_cores = {sch.get(mad).name_hint for mad, _ in gemms}
        others = [sch.get(b).name_hint for b in stage_blocks(sch) if sch.get(b).name_hint not in on_tensor_cores]
        for mad, config in gemms:
            others += tensorize_gemm(sch, mad, config, self.lowering, tunable)
        schedule_simt(sch, others, self.lowering, sm_count(target))
        self.lowering.finish(sch)
        sch.annotate(sch.get_sblock("root"), UNITS, "tensor-core" if gemms else "simt")


class NoAlternative(ValueError):
    """The schedule has no other choice to switch to."""


def _double_buffer(config: Config, choice: str) -> Config:
    if choice == "rule":
        return config
    switched = replace(config, double_buffer=not config.double_buffer)
    if switched.shared_bytes() > SHARED_BYTES:
        raise NoAlternative("double-buffered operand tiles exceed the shared-memory budget")
    return switched


def _is_reduction(block: tirx.SBlock) -> bool:
    return any(it.iter_type == tirx.IterVar.CommReduce for it in block.iter_vars)


def units(func: tirx.PrimFunc) -> str | None:
    """``"tensor-core"`` or ``"simt"``: what :class:`CudaRule` ran the mads of ``func`` on (None
    for a function it did not schedule)."""
    return func.body.block.annotations.get(UNITS) if isinstance(func.body, s_tir.SBlockRealize) else None


def with_limits(target: Target) -> Target:
    """``target`` with the per-block limits TVM's GPU verification (MetaSchedule's
    ``VerifyGPUCode``) checks: 1024 threads, 64K registers, and the rule's shared-memory budget
    (:data:`.tensor_core.SHARED_BYTES`, what any arch gives without an opt-in)."""
    config = dict(target.export())
    config.update(max_threads_per_block=1024, max_shared_memory_per_block=SHARED_BYTES, registers_per_block=65536)
    return Target({k: v for k, v in config.items() if k not in ("tag", "keys", "features")})
