"""Small helpers shared by the schedule rules."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .. import usable_cores

__all__ = ["PACK_STAGES", "stage_blocks", "split_loop_kinds", "target_cores"]

PACK_STAGES = ("grads_2_matrix", "fmap_l1", "dy_pad", "w_col", "dy_rows", "w_t", "grads_dw", "fmap_dw", "dy_dw", "w_dw")
"""The stages that cast (and pad) the inputs to fp32: elementwise, read by the mads."""


def stage_blocks(sch: s_tir.Schedule) -> list[s_tir.schedule.SBlockRV]:
    """The blocks directly under the root block, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def split_loop_kinds(sch: s_tir.Schedule, block) -> tuple[list, list]:
    """``(spatial loops, reduction loops)`` of an unscheduled TE block (one loop per iter var)."""
    loops = sch.get_loops(block)
    iters = sch.get(block).iter_vars
    assert len(loops) == len(iters), "split_loop_kinds expects an unscheduled block"
    spatial = [lp for lp, it in zip(loops, iters) if it.iter_type == tirx.IterVar.DataPar]
    reduce = [lp for lp, it in zip(loops, iters) if it.iter_type == tirx.IterVar.CommReduce]
    return spatial, reduce


def target_cores(target: Target) -> int:
    """The threads a kernel for ``target`` runs on: its ``num-cores``, else this machine's usable cores."""
    return int(target.attrs.get("num-cores", 0)) or usable_cores()
