"""CUDA schedule rule for the two gradients: tensor cores for every GEMM-shaped mad, SIMT elsewhere.

* With fp16 inputs, the packs are stored as fp16 (:func:`.tensor_core.narrow_packs`) and every mad
  that is a GEMM — each cube formulation: dW's ``dw_cc`` and ``dw_cc_t``, each stride phase of
  dX's ``dx_cc_*`` and ``dx_px_*`` — runs on tensor cores (:mod:`.tensor_core`): its packs are
  gathered into shared memory, its result stages are inlined into the copy of its tile to global
  memory.
* What is left is SIMT: depthwise mads (the channel is in both operands: no GEMM), the framework
  operators' fp32 and bf16 inputs (an f16 tensor core would round them), the result of several
  stride phases. The remaining packs are inlined, and every stage maps its fused spatial loops onto
  ``blockIdx.x`` x ``threadIdx.x`` (consecutive threads on consecutive outputs: coalesced stores),
  a thread running its output's reduction.

``CudaRule().apply(func, target)`` schedules for the GPU; ``CudaRule(emulate=True)`` gives the same
schedule with serial loops and plain buffers, which LLVM builds and runs on a CPU (see
:mod:`.tensor_core`). :func:`units` says which units a scheduled function uses.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .common import PACK_STAGES, inline_layout_stages, split_loop_kinds, stage_blocks
from .tensor_core import Lowering, as_gemm, get_config, mad_gemm, narrow_packs, tensorize_gemm

__all__ = ["CudaRule", "THREADS_PER_BLOCK", "UNITS", "units"]

THREADS_PER_BLOCK = 256
UNITS = "convgrad.units"
"""Annotation of the root block of a CUDA-scheduled function: ``"tensor-core"`` or ``"simt"``."""


class CudaRule(ScheduleRule):
    """Schedule rule for ``cuda`` targets (usable in ``dlight.ApplyDefaultSchedule``)."""

    def __init__(self, emulate: bool = False):
        self.lowering = Lowering(emulate)

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "cuda"

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule | None:
        """The rule's schedule of ``func`` (``tunable`` is accepted for the rule interface: the CUDA
        tiles are not MetaSchedule samples yet, so it gives the same schedule)."""
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func, error_render_level="none")
        self.schedule(sch, target)
        return sch

    def schedule(self, sch: s_tir.Schedule, target: Target) -> None:
        """Schedule the TE function in ``sch`` in place."""
        inline_layout_stages(sch)
        packs = [b for b in stage_blocks(sch) if sch.get(b).name_hint in PACK_STAGES]
        gemms = []  # (mad, Config) of the mads that run on tensor cores
        if all(region.source.dtype == "float16" for b in packs for region in sch.get(b).reads):
            for mad in stage_blocks(sch):
                gemm = mad_gemm(sch, mad) if _is_reduction(sch.get(mad)) else None
                if gemm is not None:
                    gemms.append((mad, get_config(gemm, target)))
        if gemms:
            narrow_packs(sch, packs)
        for mad, config in gemms:  # every mad re-indexed before any is tiled (they share packs)
            as_gemm(sch, mad, config)
        on_tensor_cores = {sch.get(mad).name_hint for mad, _ in gemms}
        others = [sch.get(b).name_hint for b in stage_blocks(sch) if sch.get(b).name_hint not in on_tensor_cores]
        for mad, config in gemms:
            tensorize_gemm(sch, mad, config, self.lowering)
        self._simt(sch, others)
        self.lowering.finish(sch)
        sch.annotate(sch.get_sblock("root"), UNITS, "tensor-core" if gemms else "simt")

    def _simt(self, sch: s_tir.Schedule, names: list[str]) -> None:
        """One thread per output element for the stages (still there) the tensor cores did not take."""
        blocks = [b for b in stage_blocks(sch) if sch.get(b).name_hint in names]
        is_pack = [sch.get(b).name_hint in PACK_STAGES for b in blocks]
        for block, pack in zip(blocks, is_pack):
            if pack:
                sch.compute_inline(block)
        for block in (b for b, pack in zip(blocks, is_pack) if not pack):
            spatial, reduce = split_loop_kinds(sch, block)
            sch.reorder(*spatial, *reduce)
            bx, tx = sch.split(sch.fuse(*spatial), [None, THREADS_PER_BLOCK])
            self.lowering.bind(sch, bx, "blockIdx.x")
            self.lowering.bind(sch, tx, "threadIdx.x")
            if reduce:
                sch.decompose_reduction(block, reduce[0])


def _is_reduction(block: tirx.SBlock) -> bool:
    return any(it.iter_type == tirx.IterVar.CommReduce for it in block.iter_vars)


def units(func: tirx.PrimFunc) -> str | None:
    """``"tensor-core"`` or ``"simt"``: what :class:`CudaRule` ran the mads of ``func`` on (None
    for a function it did not schedule)."""
    return func.body.block.annotations.get(UNITS) if isinstance(func.body, s_tir.SBlockRealize) else None
