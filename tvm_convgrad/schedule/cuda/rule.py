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
:mod:`.lowering`). :func:`units` says which units a scheduled function uses. The rule's
:class:`CudaConfig` (from :meth:`CudaRule.get_config`) holds the SM count the grids fill and whether
each GEMM takes the other double-buffering choice than its own tiling's (the second design space
that tuning explores).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tvm import s_tir, tirx
from tvm.target import Target

from ...dsl.compute.stages import PACK_STAGES, Formulation
from ...errors import ConvGradError
from ..base import Config, Rule, mads
from ..common import inline_layout_stages, stage_blocks
from .gemm import SHARED_BYTES, SM_COUNT, GemmConfig, gemm_config
from .lowering import Lowering
from .simt import schedule_simt
from .tensor_core import as_gemm, mad_gemm, narrow_packs, tensorize_gemm

__all__ = ["UNITS", "CudaConfig", "CudaRule", "NoAlternative", "sm_count", "units", "with_limits"]

UNITS = "convgrad.units"
"""Annotation of the root block of a CUDA-scheduled function: ``"tensor-core"`` or ``"simt"``."""


def sm_count(target: Target) -> int:
    """The streaming multiprocessors a grid for ``target`` should fill (:data:`.gemm.SM_COUNT`, by arch)."""
    return SM_COUNT.get(str(target.attrs.get("arch", "sm_80")), 108)


@dataclass(frozen=True)
class CudaConfig(Config):
    """The CUDA rule's choices for a target: the SMs its grids fill, and whether every GEMM takes
    the other double-buffering choice than :func:`.gemm.gemm_config` gives it."""

    sm_count: int
    switch_double_buffering: bool = False


class CudaRule(Rule):
    """Schedule rule for ``cuda`` targets (usable in ``dlight.ApplyDefaultSchedule``)."""

    kind = "cuda"

    def __init__(self, emulate: bool = False):
        self.lowering = Lowering(emulate)

    def get_config(self, target: Target, func: tirx.PrimFunc | None = None) -> CudaConfig:
        return CudaConfig(sm_count(target))

    def design_spaces(self, sch: s_tir.Schedule, target: Target) -> list[s_tir.Schedule]:
        """MetaSchedule's design spaces for ``sch`` (an unscheduled traced schedule): the tunable
        schedule, and the same with the operand tiles' double buffering switched (where the
        rule's choice has an alternative: whether a pipeline pays is for the GPU to say)."""
        other = sch.copy()
        self.schedule(sch, target, tunable=True)
        try:
            self.schedule(other, target, tunable=True, config=self.switched(target))
        except NoAlternative:
            return [sch]
        return [sch, other]

    def switched(self, target: Target) -> CudaConfig:
        """The config of the second design space: every GEMM with the other double-buffering choice."""
        return replace(self.get_config(target), switch_double_buffering=True)

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False, config: CudaConfig | None = None) -> s_tir.Schedule:
        """Schedule the TE function in ``sch`` in place; with ``config.switch_double_buffering``,
        raises :class:`NoAlternative` where no GEMM has another choice."""
        config = config or self.get_config(target)
        if any(kind in (Formulation.WINOGRAD, Formulation.WINOGRAD_DW) for _, kind in mads(sch)):
            raise ConvGradError("build", "algorithm", "winograd", "has a CPU (llvm) schedule only: build the cuda kernel with algorithm='direct'")
        inline_layout_stages(sch)
        packs = [b for b in stage_blocks(sch) if sch.get(b).name_hint in PACK_STAGES]
        gemms = []  # (mad, GemmConfig) of the mads that run on tensor cores
        half = all(region.source.dtype == "float16" for b in packs for region in sch.get(b).reads)
        if half:
            for mad in stage_blocks(sch):
                gemm = mad_gemm(sch, mad) if _is_reduction(sch.get(mad)) else None
                if gemm is not None:
                    gemms.append((mad, _double_buffer(gemm_config(gemm, config.sm_count), config.switch_double_buffering)))
            narrow_packs(sch, packs)  # exact; the tensor cores' operands, half the shared memory of a SIMT gather
        if config.switch_double_buffering and not gemms:
            raise NoAlternative("no tensor-core GEMM: nothing is double-buffered")
        for mad, tiling in gemms:  # every mad re-indexed before any is tiled (they share packs)
            as_gemm(sch, mad, tiling)
        on_tensor_cores = {sch.get(mad).name_hint for mad, _ in gemms}
        others = [sch.get(b).name_hint for b in stage_blocks(sch) if sch.get(b).name_hint not in on_tensor_cores]
        for mad, tiling in gemms:
            others += tensorize_gemm(sch, mad, tiling, self.lowering, tunable)
        schedule_simt(sch, others, self.lowering, config.sm_count)
        self.lowering.finish(sch)
        sch.annotate(sch.get_sblock("root"), UNITS, "tensor-core" if gemms else "simt")
        return sch


class NoAlternative(ValueError):
    """The schedule has no other choice to switch to."""


def _double_buffer(tiling: GemmConfig, switch: bool) -> GemmConfig:
    if not switch:
        return tiling
    switched = replace(tiling, double_buffer=not tiling.double_buffer)
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
    (:data:`.gemm.SHARED_BYTES`, what any arch gives without an opt-in)."""
    config = dict(target.export())
    config.update(max_threads_per_block=1024, max_shared_memory_per_block=SHARED_BYTES, registers_per_block=65536)
    return Target({k: v for k, v in config.items() if k not in ("tag", "keys", "features")})
