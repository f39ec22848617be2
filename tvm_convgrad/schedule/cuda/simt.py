"""SIMT schedule of the stages the tensor cores do not take: depthwise mads (the channel is in both
operands: no GEMM), the framework operators' fp32 / bf16 mads (an f16 tensor core would round
them), and the result of several stride phases.

Two shapes, chosen per stage from its extents:

===================  ==========================================  ======================================
shape                when                                        how
===================  ==========================================  ======================================
one thread per       the outputs fill the GPU, or the            a thread block = 256 outputs: for 5HD
output               reduction is short (dX depthwise: 9 taps)   pixels (dX) a 4x4 pixel x 16 ``c0``
                                                                 tile (consecutive threads on the
                                                                 contiguous ``c0`` axis: coalesced),
                                                                 each pack the stage alone reads
                                                                 gathered once per thread block into
                                                                 shared memory by all its threads
                                                                 (dX 3x3: 6x6 dy pixels for 16x9
                                                                 taps) when the block's part fits
                                                                 :data:`PACK_BYTES` (else inlined),
                                                                 the result's cast and layout in the
                                                                 same thread; else 256 consecutive
                                                                 outputs
split reduction      few outputs (< 2 thread blocks per SM),     16 outputs (``c0``) on ``threadIdx.x``
                     a long reduction (dW depthwise:             x 16 slices of the reduction on
                     ``N*Ho*Wo`` per output)                     ``threadIdx.y``, summed across the
                                                                 threads (TVM's cross-thread
                                                                 reduction); a warp reads 2 x 16
                                                                 contiguous halves
===================  ==========================================  ======================================

In the CPU emulation (:class:`.lowering.Lowering`) the thread bindings are serial loops and the
cross-thread sum an ordinary reduction loop: the tiles and the shared-memory gathers run as on the
GPU.
"""

from __future__ import annotations

import math

import tvm
from tvm import ir, s_tir, sym

from ...dsl.compute.stages import PACK_STAGES
from ...layout import C0
from ..common import covers, loop_position, split_loop_kinds
from .lowering import Lowering

__all__ = ["OUTPUT_THREADS", "PACK_BYTES", "REDUCE_THREADS", "THREADS_PER_BLOCK", "schedule_simt"]

THREADS_PER_BLOCK = 256
OUTPUT_THREADS = 16  # split reduction: outputs per thread block (the c0 axis), on threadIdx.x ...
REDUCE_THREADS = THREADS_PER_BLOCK // OUTPUT_THREADS  # ... and slices of the reduction, on threadIdx.y
TILE_ROWS = TILE_COLS = 4  # x c0: 256 outputs, a 3x3 dX's 6x6 x c0 input pixels
MIN_SPLIT_REDUCTION = 256  # reduction length worth summing across threads
PACK_BYTES = 16 * 1024
"""Shared memory one gathered pack may take per thread block (two per stage: within the 48 KB that
any arch gives a thread block without an opt-in)."""


def schedule_simt(sch: s_tir.Schedule, names: list[str], lowering: Lowering, sm_count: int) -> None:
    """Schedule the stages named ``names`` (still under the root: packs and result stages the
    tensor cores did not take) on SIMT threads."""
    stages = [b for b in _blocks(sch, names) if sch.get(b).name_hint not in PACK_STAGES]
    taken = set()  # packs gathered and result stages fused by a stage before
    for stage in stages:
        if sch.get(stage).name_hint in taken:
            continue
        spatial, reduce = split_loop_kinds(sch, stage)
        outputs, length = _product(sch, spatial), _product(sch, reduce)
        if length >= MIN_SPLIT_REDUCTION and outputs < 2 * sm_count * THREADS_PER_BLOCK and outputs % OUTPUT_THREADS == 0:
            _split_reduction(sch, stage, spatial, reduce, lowering)
        else:
            taken |= _thread_per_output(sch, stage, spatial, reduce, lowering)
    for pack in _blocks(sch, names):  # the packs no stage gathered into shared memory
        if sch.get(pack).name_hint in PACK_STAGES and sch.get(pack).name_hint not in taken:
            sch.compute_inline(pack)


def _probe(sch: s_tir.Schedule) -> s_tir.Schedule:
    """A schedule of ``sch``'s function as it stands, to try a step on (untraced; ``sch.copy()``
    fails in TVM 0.27 once tensorization has replaced blocks that random variables referred to)."""
    return s_tir.Schedule(sch.mod, error_render_level="none")


def _blocks(sch: s_tir.Schedule, names: list[str]) -> list:
    return [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint in names]


def _product(sch: s_tir.Schedule, loops) -> int:
    return math.prod(int(sch.get(loop).extent) for loop in loops)


def _thread_per_output(sch: s_tir.Schedule, stage, spatial, reduce, lowering: Lowering) -> set[str]:
    """256 outputs per thread block, a thread per output; a stage that computes 5HD pixels (dX:
    ``(n, c1, h, w, c0)``) takes a :data:`TILE_ROWS` x :data:`TILE_COLS` x ``c0`` tile, whose
    inputs overlap (the taps of neighbouring pixels) and are gathered into shared memory once; its
    result stage, when it reads this stage element by element, runs in the same thread. Returns
    the names of the packs gathered and of the result stage fused."""
    sch.reorder(*spatial, *reduce)
    taken = set()
    pixels = bool(reduce) and len(spatial) == 5 and _is_5hd(sch, stage)  # dX: (n, c1, h, w, c0)
    # Whether every thread of every block has an output: a ragged tile puts a predicate on the stage,
    # and then its sum cannot stay in a register for its result stage (below).
    if pixels:
        exact = all(int(sch.get(lp).extent) % tile == 0 for lp, tile in zip(spatial[2:4], (TILE_ROWS, TILE_COLS)))
    else:
        exact = _product(sch, spatial) % THREADS_PER_BLOCK == 0
    if pixels:
        n, c1, rows, cols, c0 = spatial
        rows, rows_in = sch.split(rows, [None, TILE_ROWS])
        cols, cols_in = sch.split(cols, [None, TILE_COLS])
        sch.reorder(n, c1, rows, cols, rows_in, cols_in, c0)
        bx, tx = sch.fuse(n, c1, rows, cols), sch.fuse(rows_in, cols_in, c0)
    else:
        bx, tx = sch.split(sch.fuse(*spatial), [None, THREADS_PER_BLOCK])
    # A tile the outputs do not fill cannot keep its sums in registers for the result stage: TVM's
    # region of the idle threads' results falls back onto real outputs (clamped to the extents, or
    # the fused index taken modulo them), which they would write from registers they never summed
    # into. Then the result stage is a kernel of its own.
    if reduce and exact:  # before the gathers: TVM's checks on a fresh schedule do not see that they cover the reads
        taken |= _fuse_the_epilogue(sch, stage, tx)
    if pixels:
        taken |= {sch.get(pack).name_hint for pack in sch.get_producers(stage) if _gather_into_shared(sch, pack, stage, bx, lowering)}
    lowering.bind(sch, bx, "blockIdx.x")
    lowering.bind(sch, tx, "threadIdx.x")
    if reduce:
        sch.decompose_reduction(stage, reduce[0])
    return taken


def _is_5hd(sch: s_tir.Schedule, stage) -> bool:
    """Whether ``stage`` computes pixels: it writes a 5HD tensor ``(n, c1, h, w, c0)``."""
    written = sch.get(stage).writes[0].source
    return len(written.shape) == 5 and int(written.shape[-1]) == C0


def _fuse_the_epilogue(sch: s_tir.Schedule, stage, thread) -> set[str]:
    """Run the result stage reading ``stage`` (a cast, a layout) in the thread that computed its
    element, the sum kept in a register: one kernel, no fp32 round trip through global memory.
    Returns the name of the stage fused, if any."""
    consumers = sch.get_consumers(stage)
    if len(consumers) != 1 or len(sch.get_producers(consumers[0])) != 1 or not covers(sch, stage, consumers[0]):
        return set()  # (not covered: it writes zeros where stage has no element, e.g. a dW's channel pads)
    probe = _probe(sch)
    at = loop_position(sch, sch.get_loops(stage), thread)
    try:  # the same step on the probe, at the thread loop's position
        probe_stage = probe.get_sblock(sch.get(stage).name_hint)
        probe.reverse_compute_at(probe.get_sblock(sch.get(consumers[0]).name_hint), probe.get_loops(probe_stage)[at])
    except (s_tir.ScheduleError, ValueError, tvm.error.InternalError):  # it reads several of stage's elements per
        return set()  # output (a dW's FracZ diagonal; a layout whose one thread's region TVM cannot prove a point): a kernel of its own
    sch.reverse_compute_at(consumers[0], thread)
    sch.set_scope(stage, 0, "local")
    return {sch.get(consumers[0]).name_hint}


def _gather_into_shared(sch: s_tir.Schedule, pack, stage, block_loop, lowering: Lowering) -> bool:
    """Compute the part of ``pack`` a thread block of ``stage`` reads into shared memory, all
    threads copying (consecutive threads, consecutive elements); left alone (to be inlined) when
    other stages read it too or the part exceeds :data:`PACK_BYTES`."""
    name = sch.get(pack).name_hint
    if name not in PACK_STAGES or len(sch.get_consumers(pack)) != 1:
        return False
    probe = _probe(sch)
    probe_pack = probe.get_sblock(name)
    try:
        probe.compute_at(probe_pack, probe.get_loops(probe.get_sblock(sch.get(stage).name_hint))[0])
    except s_tir.ScheduleError:  # the pack's region is not a box per thread block
        return False
    outer, *inner = (probe.get(loop) for loop in probe.get_loops(probe_pack))
    analyzer = sym.Analyzer()  # the part's extents may depend on the thread block (a partial last block)
    analyzer.bind(outer.loop_var, ir.Range.from_min_extent(outer.min, outer.extent))
    elements = math.prod(analyzer.const_int_bound(loop.extent).max_value for loop in inner)
    if elements * probe.get(probe_pack).writes[0].source.dtype.bits // 8 > PACK_BYTES:
        return False
    sch.set_scope(pack, 0, "shared")
    sch.compute_at(pack, block_loop)
    copy = sch.fuse(*sch.get_loops(pack)[1:])
    _, tx = sch.split(copy, [None, THREADS_PER_BLOCK])
    lowering.bind(sch, tx, "threadIdx.x")
    return True


def _split_reduction(sch: s_tir.Schedule, stage, spatial, reduce, lowering: Lowering) -> None:
    sch.reorder(*spatial, *reduce)
    bx, tx = sch.split(sch.fuse(*spatial), [None, OUTPUT_THREADS])
    slices, ty = sch.split(sch.fuse(*reduce), [None, REDUCE_THREADS])
    sch.reorder(bx, tx, ty, slices)  # the reduction loops innermost: TVM sums across threadIdx.y
    lowering.bind(sch, bx, "blockIdx.x")
    lowering.bind(sch, ty, "threadIdx.y")
    lowering.bind(sch, tx, "threadIdx.x")
    if lowering.emulate:  # a serial sum: its initial value before the reduction loops
        sch.decompose_reduction(stage, ty)
