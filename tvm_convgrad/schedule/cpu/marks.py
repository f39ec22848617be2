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
from tvm import s_tir

from ..common import rewrite_prim_funcs
from .prefetch import lower_prefetches

__all__ = ["OVERWRITES", "drop_overwritten_inits", "lower_marks"]

OVERWRITES = "convgrad.overwrites"
"""Annotation of a tensorized stage whose intrinsic writes every element of its output region."""


def drop_overwritten_inits(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the ``init`` of every stage marked :data:`OVERWRITES` removed (a module without
    such a stage is returned as it is)."""
    return rewrite_prim_funcs(mod, lambda stmt, _: _without_init(stmt) if isinstance(stmt, s_tir.SBlock) else stmt)


def _without_init(block: s_tir.SBlock) -> s_tir.SBlock:
    annotations = dict(block.annotations or {})
    if annotations.pop(OVERWRITES, None) is None:
        return block
    return s_tir.SBlock(list(block.iter_vars), list(block.reads), list(block.writes), block.name_hint, block.body, None,
                        list(block.alloc_buffers), list(block.match_buffers), annotations)  # fmt: skip


def lower_marks(mod: tvm.IRModule) -> tvm.IRModule:
    """Every mark of the scheduled ``mod`` lowered (see the module docstring)."""
    return drop_overwritten_inits(lower_prefetches(mod))
