"""LLVM (CPU) schedule rule for the two gradients.

The default rule: every stage runs parallel over its outer spatial loops and vectorized over
C0 (its innermost axis, 16 lanes = one AVX-512 fp32 register); reduction stages keep their
reduction loops between the two, so each C0 vector accumulates in place.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .common import split_loop_kinds, stage_blocks

__all__ = ["CpuRule"]


class CpuRule(ScheduleRule):
    """Schedule rule for ``llvm`` targets (usable in ``dlight.ApplyDefaultSchedule``)."""

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "llvm"

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        for block in stage_blocks(sch):
            spatial, reduce = split_loop_kinds(sch, block)
            *outer, lanes = spatial
            sch.reorder(*outer, *reduce, lanes)
            if outer:
                sch.parallel(sch.fuse(*outer))
            sch.vectorize(lanes)
            if reduce:
                init = sch.decompose_reduction(block, reduce[0])
                sch.vectorize(sch.get_loops(init)[-1])
        return sch
