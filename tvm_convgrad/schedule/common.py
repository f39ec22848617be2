"""Small helpers shared by the schedule rules."""

from __future__ import annotations

from tvm import s_tir, tirx

__all__ = ["CONVGRAD_STAGES", "stage_blocks", "split_loop_kinds", "is_convgrad_func"]

CONVGRAD_STAGES = {
    "conv2d_backprop_filter": ("grads_2_matrix", "fmap_l1", "dw_cc", "dw_ddr"),
    "conv2d_backprop_input": ("dy_filling", "w_col", "dx_cc", "c_ddr"),
}
"""The named stages of each gradient's compute, producers first (``dsl.compute``)."""


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


def is_convgrad_func(func: tirx.PrimFunc) -> str | None:
    """Which gradient a PrimFunc computes (``"conv2d_backprop_filter"``/``"..._input"``), if any."""
    sch = s_tir.Schedule(func)
    names = {sch.get(b).name_hint for b in stage_blocks(sch)}
    for op, stages in CONVGRAD_STAGES.items():
        if set(stages) <= names:
            return op
    return None
