"""A CPU schedule for the PrimFuncs around the convolutions: elementwise, broadcast, reductions.

A training module's other PrimFuncs (bias adds, ReLU and their gradients, batch statistics,
pooling, softmax and the loss, the optimizer's updates), legalized by Relax, are serial loop
nests. :class:`LoopsRule` (a ``dlight`` rule) gives each block under the root:

* a spatial block: its outer loops fused into one parallel loop of at least :data:`TASKS`
  iterations (the fewest that make them), the inner loops serial inside (fused into one where the
  innermost is shorter than :data:`LANES`), the innermost :data:`LANES` iterations vectorized
  where that loop holds a multiple of them (else left to LLVM);
* a reduction block: its spatial loops (which legalization puts outside the reduction) the same
  way, the inner ones nested, the reduction serial inside (each output summed by one thread, in order: the same result
  on any number of cores).

Blocks of fewer than :data:`PARALLEL_ABOVE` iterations stay serial (a thread team costs more than they
do), and so do reductions to one value (a loss: one thread sums it, in order). Functions already scheduled (``tirx.is_scheduled``, e.g. the package's kernels) are not
touched by ``dlight.ApplyDefaultSchedule``.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from ..common import loop_extent, split_loop_kinds, stage_blocks

__all__ = ["LANES", "PARALLEL_ABOVE", "TASKS", "LoopsRule"]

LANES = 8
"""Iterations vectorized at the innermost loop (8 fp32 lanes of AVX2; LLVM widens or splits for other ISAs)."""
PARALLEL_ABOVE = 4096
"""Iterations (outputs x reduction) of a block below which it stays serial."""
TASKS = 256
"""Iterations of the parallel loop: the outer loops fused until they make this many (a
ResNet-18's max pooling, N=32, 64 x 16 x 16 -> 8 x 8: one parallel loop over every element, each
dividing its four indices out of the fused one, took 1.1-1.6 ms; over the images' channels)."""


class LoopsRule(ScheduleRule):
    """Parallel outer, vectorized inner loops for every block of a PrimFunc on an ``llvm`` target."""

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "llvm"

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        scheduled = False
        for block in stage_blocks(sch):
            if not sch.get_loops(block):  # a scalar
                continue
            try:
                spatial, reduce = split_loop_kinds(sch, block)
            except (AssertionError, s_tir.ScheduleError):  # not one loop per iter var: left as it is
                continue
            if not spatial:
                continue
            outputs = work = 1
            for loop in spatial:
                outputs *= loop_extent(sch, loop)
            for loop in [*spatial, *reduce]:
                work *= loop_extent(sch, loop)
            outermost = all(sch.get(a).same_as(sch.get(b)) for a, b in zip(sch.get_loops(block), spatial))
            if work < PARALLEL_ABOVE or outputs < 2 or not outermost:
                continue
            scheduled |= _parallel(sch, spatial, vectorize=not reduce)
        return sch if scheduled else None


def _parallel(sch: s_tir.Schedule, spatial: list, vectorize: bool) -> bool:
    """The outermost of ``spatial`` (a block's outer loops) fused into one parallel loop of at
    least :data:`TASKS` iterations, the rest serial inside, nested (each index computed once per
    loop: a pooling window's reads, a padding copy; 0.88 -> 0.37 ms on ResNet-18's max pooling
    against the inner loops fused), except that a spatial block (``vectorize``) whose innermost
    loop is shorter than :data:`LANES` has its inner loops fused into one (a 3x3 weight's SGD
    update: its index stays the flat offset, which LLVM vectorizes; nested, 3-iteration loops
    made the ResNet-18 step 1.4x slower). The last :data:`LANES` iterations of the innermost
    loop are vectorized where it holds a multiple of them."""
    count, iterations = len(spatial), 1
    for at, loop in enumerate(spatial):
        iterations *= loop_extent(sch, loop)
        if iterations >= TASKS:
            count = at + 1
            break
    inner = spatial[count:]
    fused_inner = vectorize and inner and loop_extent(sch, inner[-1]) < LANES  # (too short to vectorize alone)
    loops = [_fused(sch, spatial[:count]), *([_fused(sch, inner)] if fused_inner else inner)]
    last = loops[-1]
    if vectorize and loop_extent(sch, last) % LANES == 0 and (fused_inner or loop_extent(sch, last) > LANES):
        loops[-1], lanes = sch.split(last, [None, LANES])
        sch.vectorize(lanes)
    sch.parallel(loops[0])
    return True


def _fused(sch: s_tir.Schedule, loops: list):
    """``loops`` (consecutive) as one loop."""
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]
