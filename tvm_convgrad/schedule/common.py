"""Small helpers shared by the schedule rules."""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx
from tvm.target import Target

from ..dsl.compute.stages import LAYOUT_ADAPTER
from ..machine import usable_cores

__all__ = ["buffer_bytes", "covers", "elements", "inline_layout_stages", "loop_extent", "loop_position", "nbytes", "rewrite_prim_funcs", "stage_blocks", "split_loop_kinds",
           "target_cores"]  # fmt: skip


def loop_extent(sch: s_tir.Schedule, loop) -> int:
    """The (static) extent of a loop."""
    return int(sch.get(loop).extent)


def loop_position(sch: s_tir.Schedule, loops: list, loop) -> int:
    """Where ``loop`` is in ``loops`` (a stage's loops, outermost first)."""
    return [sch.get(lp).same_as(sch.get(loop)) for lp in loops].index(True)


def elements(buffer) -> int:
    """Elements of a buffer of static shape."""
    size = 1
    for d in buffer.shape:
        size *= int(d)
    return size


def nbytes(*buffers) -> int:
    """Bytes of buffers of static shape, together."""
    return sum(elements(b) * tvm.DataType(b.dtype).bits // 8 for b in buffers)


def covers(sch: s_tir.Schedule, producer, consumer) -> bool:
    """Whether ``producer``'s spatial domain has as many points as ``consumer``'s, so that running
    ``consumer`` inside it (``reverse_compute_inline``, ``reverse_compute_at``) keeps every output.
    TVM allows both where the consumer also writes elements the producer has no point for (a TBE
    result's zeros: channel pads, a stride phase without taps) and then drops those writes."""

    def points(block) -> int:
        spatial = (it for it in sch.get(block).iter_vars if it.iter_type == tirx.IterVar.DataPar)
        return math.prod(int(it.dom.extent) for it in spatial)

    return points(consumer) <= points(producer)


def buffer_bytes(sch: s_tir.Schedule, stage: str) -> int:
    """Bytes of the buffer a stage writes."""
    (buffer,) = [w.source for w in sch.get(sch.get_sblock(stage)).writes]
    return nbytes(buffer)


def stage_blocks(sch: s_tir.Schedule) -> list[s_tir.schedule.SBlockRV]:
    """The blocks directly under the root block, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def inline_layout_stages(sch: s_tir.Schedule):
    """Fold a frontend's layout stages into the compute: an input's (framework layout -> 5HD) into
    the packing stage that reads it, and the result stage in front of the output's (TBE result ->
    framework weight layout) into that output, so that each tensor is still read once."""
    for block in stage_blocks(sch):
        side = sch.get(block).annotations.get(LAYOUT_ADAPTER)
        if side == "in" and sch.get_consumers(block):  # (an input no stage reads: a forward whose taps all read padding)
            sch.compute_inline(block)
        elif side == "out":
            for producer in sch.get_producers(block):
                sch.compute_inline(producer)


def split_loop_kinds(sch: s_tir.Schedule, block) -> tuple[list, list]:
    """``(spatial loops, reduction loops)`` of an unscheduled block (one loop per iter var, each
    bound to its own loop, in any order: ``rfactor``'s sum of the slices has its reduction first)."""
    loops = sch.get_loops(block)
    iters = sch.get(block).iter_vars
    realize = sch.get(loops[-1]).body
    assert len(loops) == len(iters) and isinstance(realize, s_tir.SBlockRealize), "split_loop_kinds expects an unscheduled block"
    reduce_vars = [value for it, value in zip(iters, realize.iter_values) if it.iter_type == tirx.IterVar.CommReduce]
    is_reduce = [any(sch.get(lp).loop_var.same_as(var) for var in reduce_vars) for lp in loops]
    return [lp for lp, r in zip(loops, is_reduce) if not r], [lp for lp, r in zip(loops, is_reduce) if r]


def target_cores(target: Target) -> int:
    """The threads a kernel for ``target`` runs on: its ``num-cores``, else this machine's usable cores."""
    return int(target.attrs.get("num-cores", 0)) or usable_cores()


def rewrite_prim_funcs(mod: tvm.IRModule, post) -> tvm.IRModule:
    """``mod`` with ``post`` applied to every ``For`` and ``SBlock`` of its PrimFuncs, bottom up: each
    node's children are rebuilt first, then ``post(node, func)`` returns it or its replacement (the
    rest shared, not copied). A module ``post`` changes nothing in is returned as it is."""
    funcs, changed = {}, False
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            body = _rebuild(func.body, lambda stmt, f=func: post(stmt, f))
            if not body.same_as(func.body):
                func, changed = func.with_body(body), True
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs) if changed else mod


def _rebuild(stmt, post):
    if isinstance(stmt, tirx.For):
        body = _rebuild(stmt.body, post)
        if not body.same_as(stmt.body):
            stmt = tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations, stmt.step, stmt.span)
        return post(stmt)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_rebuild(s, post) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        block = _rebuild(stmt.block, post)
        return stmt if block.same_as(stmt.block) else s_tir.SBlockRealize(list(stmt.iter_values), stmt.predicate, block)
    if isinstance(stmt, s_tir.SBlock):
        body = _rebuild(stmt.body, post)
        if not body.same_as(stmt.body):
            stmt = s_tir.SBlock(list(stmt.iter_vars), list(stmt.reads), list(stmt.writes), stmt.name_hint, body, stmt.init,
                                list(stmt.alloc_buffers), list(stmt.match_buffers), dict(stmt.annotations or {}))  # fmt: skip
        return post(stmt)
    if isinstance(stmt, tirx.IfThenElse):
        then = _rebuild(stmt.then_case, post)
        other = None if stmt.else_case is None else _rebuild(stmt.else_case, post)
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    return stmt
