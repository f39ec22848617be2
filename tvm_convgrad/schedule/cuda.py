"""CUDA schedule rule for the two gradients.

The default rule: the cast / padding / zero-filling stages are inlined into their consumers,
and every remaining stage maps its fused spatial loops onto ``blockIdx.x`` x ``threadIdx.x``;
a thread runs the whole reduction of its output element.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .common import PACK_STAGES, inline_layout_stages, split_loop_kinds, stage_blocks

__all__ = ["CudaRule"]

THREADS_PER_BLOCK = 256


class CudaRule(ScheduleRule):
    """Schedule rule for ``cuda`` targets (usable in ``dlight.ApplyDefaultSchedule``)."""

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "cuda"

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func, error_render_level="none")
        inline_layout_stages(sch)
        for block in stage_blocks(sch):
            if sch.get(block).name_hint in PACK_STAGES:
                sch.compute_inline(block)
        for block in stage_blocks(sch):
            spatial, reduce = split_loop_kinds(sch, block)
            sch.reorder(*spatial, *reduce)
            bx, tx = sch.split(sch.fuse(*spatial), [None, THREADS_PER_BLOCK])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            if reduce:
                sch.decompose_reduction(block, reduce[0])
        return sch
