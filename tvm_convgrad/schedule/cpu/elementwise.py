"""The schedules of the stages around a mad that run as passes of their own: packs and layout
changes elementwise (the source walked as it lies in memory, parallel over the fewest outer loops
that make :data:`PARALLEL_TASKS` tasks, vectorized innermost), 5HD -> channel-plane packs, and a
dW result gathered from the sums of several live-tap regions.
"""

from __future__ import annotations

import re

from tvm import s_tir, sym, tirx

from ...dsl.compute.stages import DW_CC
from ...layout import C0
from ..common import loop_extent, nbytes

__all__ = ["BLOCK_ROWS_IN_L1", "PARALLEL_TASKS", "REGION_SUMS_TAPS", "channel_blocks_outside", "elementwise", "in_source_order",
           "planar_pack", "region_sums_result"]

PARALLEL_TASKS = 64  # a pack's parallel loop: the fewest outer loops that make this many tasks (:func:`elementwise`)
BLOCK_ROWS_IN_L1 = 32 * 1024
"""Bytes of one 16-channel block's rows of an image (all of a result's reads) that stay in L1 while its
16 channels are written in turn, whatever the loop order: above them :func:`channel_blocks_outside`
walks the result block by block. The NCX dX of a 3x3 at stride 2 (four phases' sums), N=8, Zen 4, cold:
128 -> 128 on 56x56 (200 KB a block) 11.0 -> 10.6 ms, 256 -> 256 on 28x28 (50 KB) 9.65 -> 9.38;
on 14x14 (12.5 KB) the block order was slower (512 -> 512, N=8: 10.9 -> 11.4; 128 -> 256,
N=32: 4.9 -> 5.4)."""


def elementwise(sch: s_tir.Schedule, block, shared: int = 0):
    """Parallel over the outer loops, vectorized over the innermost (C0, or 16 of a longer row);
    the first ``shared`` loops (that other stages run under too) are left as they are. Trailing
    loops of extent 1 (a 1x1 weight's taps) join the loop above them, which gives the lanes.

    The outer loops walk the source in its memory order (:func:`in_source_order`), and only the
    fewest of them that make :data:`PARALLEL_TASKS` tasks run parallel: the loops below stay
    serial, so their index math is a pointer's increment, not a fused index's divisions and
    remainders per row (the forward's XIO -> FracZ weight pack of a 512 -> 512 3x3 layer: 9.4 MB
    in 1.8 ms became one in ~0.6 ms; res5a_branch2b N=1 3.5 -> 1.8 ms)."""
    loops = sch.get_loops(block)[shared:]
    units = 0
    while units + 1 < len(loops) and loop_extent(sch, loops[-1 - units]) == 1:
        units += 1
    if units:
        loops = [*loops[: -units - 1], sch.fuse(*loops[-units - 1 :])]
    *outer, lanes = loops
    if not sch.get(block).reads:  # a constant (a dX no tap reaches): LLVM fills it; a vectorized bf16 cast of it does not legalize
        outer.append(lanes)
        lanes = None
    elif loop_extent(sch, lanes) > 16:
        if loop_extent(sch, lanes) % 16:  # a ragged row: a serial loop under the parallel ones, its index
            if not outer:  # math kept in the row's own terms (LLVM vectorizes what it can)
                outer.append(lanes)
            lanes = None
        else:
            row, lanes = sch.split(lanes, [None, 16])
            outer.append(row)
    if outer:
        outer = channel_blocks_outside(sch, block, outer) or in_source_order(sch, block, outer)
        tasks, parallel = 1, 0
        while parallel < len(outer) and tasks < PARALLEL_TASKS:
            tasks *= loop_extent(sch, outer[parallel])
            parallel += 1
        sch.parallel(sch.fuse(*outer[:parallel]))
    if lanes is not None:
        sch.vectorize(lanes)


def channel_blocks_outside(sch: s_tir.Schedule, block, loops: list) -> list | None:
    """``loops`` with the channel loop split into 16-channel blocks, in its place, and their lanes
    inside all of them, where the block reads several buffers of 16-lane rows (a strided dX's
    stride phases, written to NCX) and one step of that loop moves each read by one lane: every
    row of a block's sums is then read by its 16 channels in turn while it is in cache, instead of
    one lane of it per channel pass over all the rows. Only where a block's rows of an image (all
    the reads) outgrow :data:`BLOCK_ROWS_IN_L1`; None where any of that does not hold."""
    stmt = sch.get(block)
    ranks = {len(r.region) for r in stmt.reads}
    if len(stmt.reads) < 2 or len(ranks) > 1 or any(int(r.source.shape[-1]) != C0 for r in stmt.reads):
        return None
    # (the sums are (N, C1, ..., 16): a block's rows of an image, all the reads)
    block_rows = sum(nbytes(r.source) // int(r.source.shape[0]) // int(r.source.shape[1]) for r in stmt.reads)
    if block_rows <= BLOCK_ROWS_IN_L1:
        return None
    steps = _read_steps(sch, block, stmt.reads[0], loops)
    lanes = [k for k, step in enumerate(steps or []) if step == 1]
    if len(lanes) != 1 or loop_extent(sch, loops[lanes[0]]) % C0:
        return None
    c1, c0 = sch.split(loops[lanes[0]], [None, C0])
    ordered = [c1 if k == lanes[0] else lp for k, lp in enumerate(loops)] + [c0]
    sch.reorder(*ordered)
    return ordered


def _read_steps(sch: s_tir.Schedule, block, read, loops: list) -> list[int] | None:
    """How far one step of each of ``loops`` (each bound to one of the block's iterators) moves
    ``read`` in its buffer (elements), or None where a loop's iterator is not its own or an offset
    does not fold to a number."""
    stmt = sch.get(block)
    realize = sch.get(sch.get_loops(block)[-1]).body
    bound = {value: iv.var for value, iv in zip(realize.iter_values, stmt.iter_vars) if isinstance(value, tirx.Var)}
    iterators = []
    for loop in loops:
        var = sch.get(loop).loop_var
        match = [iv for value, iv in bound.items() if value.same_as(var)]
        if not match:
            return None
        iterators.append(match[0])
    strides, size = [], 1
    for extent in reversed(read.source.shape):
        strides.insert(0, size)
        size *= int(extent)
    offset = sum(r.min * stride for r, stride in zip(read.region, strides))

    def offset_at(one) -> int:  # the read's offset with every iterator 0 but ``one`` (1)
        analyzer = sym.Analyzer()
        for iv in stmt.iter_vars:
            analyzer.bind(iv.var, tirx.const(int(one is not None and iv.var.same_as(one)), iv.var.ty.dtype))
        return int(analyzer.simplify(offset))

    try:
        base = offset_at(None)
        return [abs(offset_at(iv) - base) for iv in iterators]
    except (TypeError, ValueError):
        return None


def in_source_order(sch: s_tir.Schedule, block, loops: list) -> list:
    """``loops`` (the block's, each bound to one of its iterators) reordered by how far one step
    of each moves the block's one read in its buffer, farthest first: a pack reads its source as
    it lies in memory, and its writes scatter instead (stores drain from the store buffer; a
    strided read waits for its line: an XIO weight read with a 2 KB stride per 64-byte row was a
    cache miss per row). Unchanged where the block reads more than one buffer or a loop's
    iterator is not its own."""
    stmt = sch.get(block)
    if len(stmt.reads) != 1:
        return loops
    steps = _read_steps(sch, block, stmt.reads[0], loops)
    if steps is None:
        return loops
    order = sorted(range(len(loops)), key=lambda k: -steps[k])
    if order == list(range(len(loops))):
        return loops
    ordered = [loops[k] for k in order]
    sch.reorder(*ordered)
    return ordered


def planar_pack(sch: s_tir.Schedule, block, shared: int = 0):
    """A 5HD -> channel-plane pack (``dy_rows``, the transposed dW's ``fmap_l1``): walked in the
    source's order (channels innermost), so every read is contiguous; 16 planes are written.
    With ``shared`` = 1 the batch loop is one that other stages run under too (one image)."""
    *n, c, i, j = sch.get_loops(block)[shared:]
    c1, c0 = sch.split(c, [None, 16])
    sch.reorder(*n, c1, i, j, c0)
    sch.parallel(sch.fuse(*n, c1, i))
    sch.unroll(c0)


REGION_SUMS_TAPS = True  # a dW result read from several live-tap regions' sums: by taps (:func:`region_sums_result`)


def region_sums_result(sch: s_tir.Schedule, block) -> bool:
    """An OIX dW result ``(O, I, KH, KW)`` (any group's channels) read from the sums of several
    live-tap regions (``dw_cc_<kh>_<kw>``, each ``(.., Cin/16 x its taps, Cout, 16)``; each tap's
    region picked by a chain of conditions, :func:`..dsl.compute.filter_regions.from_tap_regions`):
    parallel over Cout, each run of 16 input channels walked channel by channel with the taps
    unrolled inside, so that each copy's conditions fold to the one region it reads, its 16 channels
    read as they lie (LLVM vectorizes them; on AVX-512 the stores scatter at the taps' stride).
    Left to :func:`elementwise`, the taps (3) were the lanes and LLVM vectorized the channels outside
    them into gathers over every region: DeepLab's ASPP rate 6 (N=4, 2048 -> 256 on 14x14, NCX)
    spent about a third of its dW's samples there under ``perf``; its dW 33.5-52.1 -> 24.7-40.9 ms,
    rate 12 16.3-23.4 -> 12.9-13.9, bitwise the same (Zen 4, 2026-12-03; the taps innermost, or the
    channels vectorized under the taps, read the same). An OXI result (channels innermost, stores
    contiguous) read 7% slower so and keeps :func:`elementwise`. False (nothing done) for another block."""
    stmt = sch.get(block)
    regions = [r for r in stmt.reads if re.fullmatch(rf"{DW_CC}_\d+_\d+", r.source.name)]  # (phase_name's; not dw_cc_t)
    loops = sch.get_loops(block)
    oix = stmt.annotations.get("weights_format") == "OIX"  # the frontend's attribute on its result stage
    if not REGION_SUMS_TAPS or len(regions) < 2 or not oix or len(loops) != 4:
        return False
    co, ci, kh, kw = loops
    sch.split(ci, [None, 16])  # (the sums' blocks: a partial last one guarded)
    sch.parallel(co)
    sch.unroll(kh)
    sch.unroll(kw)
    return True
