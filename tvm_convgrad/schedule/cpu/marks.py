"""The CPU schedules' marks, lowered on the scheduled module before ``tvm.compile``.

A schedule marks what TVM's schedule primitives cannot say, and :func:`lower_marks` rewrites it:

* a loop that streams a tensor in place prefetches it ahead (:mod:`.prefetch`, ``PREFETCH``);
* a stage whose tensor intrinsic writes the whole of its output (the AMX helpers: ``tilezero``,
  then ``tilestored`` of every tile, :mod:`.amx_llvm`) carries :data:`OVERWRITES`: its ``init``
  (the zeros a reduction starts from, which ``tensorize`` keeps as a pass over the output before
  the call) is dropped (:func:`drop_overwritten_inits`).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from .prefetch import lower_prefetches

__all__ = ["OVERWRITES", "drop_overwritten_inits", "lower_marks"]

OVERWRITES = "convgrad.overwrites"
"""Annotation of a tensorized stage whose intrinsic writes every element of its output region."""


def drop_overwritten_inits(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the ``init`` of every stage marked :data:`OVERWRITES` removed (a module without
    such a stage is returned as it is)."""
    funcs, changed = {}, False
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            body = _drop(func.body)
            if not body.same_as(func.body):
                func, changed = func.with_body(body), True
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs) if changed else mod


def _drop(stmt):
    """``stmt`` rebuilt where a marked stage lies below it (the rest shared, not copied)."""
    if isinstance(stmt, tirx.For):
        body = _drop(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                                                             stmt.annotations, stmt.step, stmt.span)  # fmt: skip
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_drop(s) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        block = _drop(stmt.block)
        return stmt if block.same_as(stmt.block) else s_tir.SBlockRealize(list(stmt.iter_values), stmt.predicate, block)
    if isinstance(stmt, s_tir.SBlock):
        annotations = dict(stmt.annotations or {})
        marked = annotations.pop(OVERWRITES, None) is not None
        body = _drop(stmt.body)
        if body.same_as(stmt.body) and not marked:
            return stmt
        return s_tir.SBlock(list(stmt.iter_vars), list(stmt.reads), list(stmt.writes), stmt.name_hint, body, None if marked else stmt.init,
                            list(stmt.alloc_buffers), list(stmt.match_buffers), annotations)  # fmt: skip
    if isinstance(stmt, tirx.IfThenElse):
        then = _drop(stmt.then_case)
        other = None if stmt.else_case is None else _drop(stmt.else_case)
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    return stmt


def lower_marks(mod: tvm.IRModule) -> tvm.IRModule:
    """Every mark of the scheduled ``mod`` lowered (see the module docstring)."""
    return drop_overwritten_inits(lower_prefetches(mod))
