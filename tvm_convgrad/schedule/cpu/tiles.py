"""Register-tile sizes of the CPU formulations: pure functions of the block sizes and the ISA plan.

Every tile holds its accumulators in registers for a whole reduction (chunk): the sizes here keep
``accumulators + operands`` within the plan's register file (:mod:`tvm_convgrad.isa`), so no tile
spills on any ISA; the dX cube's tile comes from a small cycle model (FMA throughput, the latency
of a dependent FMA chain, loads) per ISA.
"""

from __future__ import annotations

from ...isa import IsaPlan
from ...layout import C0, largest_divisor

__all__ = [
    "ALIASED_TILE_PIXELS", "CHUNK_STEPS", "FMA_LATENCY", "L1_SET_STRIDE", "L2_BYTES_PER_CYCLE", "MAX_TAP_TILE", "MAX_TILE_PIXELS", "MAX_WO_UNROLL", "block_tile", "chunk", "depthwise_dw_tile", "dw_blocks",
    "channel_tile", "depthwise_dx_tile", "divisors", "dx_tile", "flat_block_tile", "largest_divisor", "most_blocks_a_task", "planar_tile", "step_cycles", "tap_rows", "tap_tile", "winograd_dw_tile", "winograd_tile",
]  # fmt: skip

MAX_TILE_PIXELS = 16  # dX pixels per tile: 16 rows of accumulators at most (AVX-512: 16 zmm of 32)
L1_SET_STRIDE = 4096  # bytes between two addresses in the same L1 set (32 KB, 8 ways: every x86 core these kernels target)
ALIASED_TILE_PIXELS = 7
"""Pixels per tile where the broadcast operand's pixel rows lie a multiple of :data:`L1_SET_STRIDE`
apart (an NXC input of 1024 or 2048 fp32 channels read in place): each step reads one line per
pixel, all in one L1 set, and more lines than its 8 ways (one kept for the weights' line) evict
each other every step. A 1x1 forward of 1024 -> 512 channels on 14x14, N=8 (AVX-512): 1 x 14
pixels 15.8 ms, 1 x 7 8.6."""
MAX_TAP_TILE = 7  # transposed dW: taps per tile
MAX_WO_UNROLL = 4  # depthwise dW: output columns per tile step
CHUNK_STEPS = 1600  # reduction steps (n, ho, wo) per dW chunk: ~1.6 MB of fmap per 16 Cin blocks


def divisors(n: int, most: int) -> list[int]:
    """The divisors of ``n`` up to ``most``."""
    return [d for d in range(1, min(n, most) + 1) if n % d == 0]


def most_blocks_a_task(blocks: int, images: int, min_tasks: int, most: int | None = None) -> int:
    """The most of an image's ``blocks`` channel blocks one task takes (a divisor of ``blocks``, at
    most ``most``) that still leaves ``min_tasks`` tasks over ``images`` images; 1 at least."""
    return max([1] + [g for g in divisors(blocks, most or blocks) if images * (blocks // g) >= min_tasks])


FMA_LATENCY = 5  # cycles of a dependent FMA chain (4 on recent cores, 5 on Haswell / Zen 1)


def step_cycles(pixels: int, vectors: int, plan: IsaPlan) -> float:
    """Cycles of one reduction step of a dX tile of ``pixels x vectors`` accumulators, on a core
    with two FMA pipes: the FMAs, or one chain's latency, or the loads (``pixels`` broadcasts and
    ``vectors`` weight rows; two per cycle where the FMA takes the broadcast itself, 1.5 where a
    ``vbroadcastss`` needs a shuffle too), whichever is longest, plus one for the loop."""
    loads_per_cycle = 2 if plan.broadcast_operand else 1.5
    return max(pixels * vectors / 2, FMA_LATENCY, (pixels + vectors) / loads_per_cycle) + 1


def dx_tile(rows: int, cols: int, plan: IsaPlan, whole: bool = False, max_pixels: int = MAX_TILE_PIXELS) -> tuple[int, int, int]:
    """dX register tile ``(TH, TW, V)`` for a phase of ``rows x cols`` pixels: ``TH x TW`` pixels
    by ``V`` vector registers of each pixel's 16-lane row (``V`` divides the registers a row
    takes; ``TH*TW*V`` accumulators within the plan's budget). ``TH`` divides the rows; where
    ``TW`` does not divide the columns, the last ``cols % TW`` columns of each row band are a
    tile of their own (the schedule partitions the loop: no predicated FMA).

    The tile with the fewest estimated cycles per row (:func:`_step_cycles` over the row's
    tiles: enough accumulators to hide the FMA latency, few loads per FMA, few tiles per row);
    within 5% of the fewest, single-row tiles without an edge first. E.g. AVX-512 16 pixels
    (2 x 8 at 56 columns, 1 x 14 at 14), AVX2 1 x 6 x 2 ymm (and a 1 x 2 edge at 56 columns),
    1 x 5 x 2 on 7x7 phases. ``whole``: only tiles whose ``TW`` divides the columns (no edge);
    ``max_pixels``: at most that many pixels (see :data:`ALIASED_TILE_PIXELS`)."""
    per_row = plan.registers_per_row

    def cost(th: int, tw: int, v: int) -> float:
        whole, edge = divmod(cols, tw)
        cycles = whole * step_cycles(th * tw, v, plan) + (step_cycles(th * edge, v, plan) if edge else 0)
        return cycles * (per_row // v) / th

    options = [
        (cost(th, tw, v), th, tw, v)
        for v in plan.row_parts
        for th in divisors(rows, max_pixels)
        for tw in range(1, min(cols, max_pixels // th) + 1)
        if th * tw * v <= plan.accumulators and (cols % tw == 0 or not whole)
    ]  # fmt: skip
    fewest = min(option[0] for option in options)
    near = [o for o in options if o[0] <= 1.05 * fewest]
    _, th, tw, v = max(near, key=lambda o: (cols % o[2] == 0, o[1] == 1, -o[0], o[1] * o[2] * o[3]))
    return th, tw, v


def block_tile(pixels: int, v: int, blocks: int, plan: IsaPlan) -> int:
    """How many of the ``blocks`` 16-channel result blocks a dX (or forward) tile of ``pixels x
    v`` registers takes (a divisor of ``blocks``): each step's broadcasts then feed one FMA per
    block, so the loads per FMA fall (``pixels + blocks`` per ``pixels x blocks``). Only where a
    register holds the whole 16-lane row (``v == registers_per_row``: AVX-512; AVX2's row parts
    already share the broadcast); the accumulators, the blocks' weight rows and one broadcast
    within the registers; the fewest estimated cycles per FMA (:func:`step_cycles`), then the
    fewest blocks. AVX-512, 14 pixels: 2 blocks (28 accumulators, 16 loads a step for 28 FMAs
    instead of 15 for 14; a Sapphire Rapids-class core, the 1x1 dX of 256 <-> 1024 channels on
    14x14, N=8: 240-280 -> 286-363 GFLOP/s)."""
    if v != plan.registers_per_row:
        return 1
    options = [b for b in divisors(blocks, plan.accumulators) if pixels * v * b <= plan.accumulators and pixels * v * b + v * b + 1 <= plan.registers]
    return min(options, key=lambda b: (step_cycles(pixels, v * b, plan) / (pixels * b), b), default=1)


def flat_block_tile(pixels: int, v: int, blocks: int, plan: IsaPlan, max_pixels: int = MAX_TILE_PIXELS, whole: bool = False) -> tuple[int, int]:  # fmt: skip
    """``(TW, B)`` of a 1x1 dX (or forward) tile over an image's ``pixels`` as one axis: ``TW``
    pixels (where they do not divide the image, its last pixels one narrower tile) x ``B`` of the
    ``blocks`` 16-channel result blocks (a divisor) x ``v`` registers of each block's row; the
    accumulators, the blocks' weight rows and a broadcast within the registers; the fewest
    estimated cycles per block over the image (:func:`step_cycles`), then the fewest blocks, then
    the fewest pixels. A 7x7 image (49 pixels) of 4 blocks, AVX-512: 13 x 2 (15 loads a step for
    26 FMAs; 13 x 1 took 14 for 13; 7 x 4 would take the 32nd register); a Sapphire Rapids-class
    core, the 1x1 dX of 2048 -> 512 channels on 7x7, N=8, NCHW 3.3 -> 2.6-2.7 ms, 512 -> 2048
    3.7 -> 3.0-3.1. ``whole``: only ``TW`` that divide the pixels (tiles across a batch's images,
    whose flat axis a partition would not keep affine)."""
    options = []
    for b in divisors(blocks, plan.accumulators // v):
        for tw in range(1, min(pixels, max_pixels, plan.accumulators // (v * b)) + 1):
            if (tw + 1) * v * b + 1 > plan.registers or (whole and pixels % tw):
                continue
            tiles, edge = divmod(pixels, tw)
            cycles = tiles * step_cycles(tw, v * b, plan) + (step_cycles(edge, v * b, plan) if edge else 0)
            options.append((cycles / b, b, tw))
    _, b, tw = min(options)
    return tw, b


def dw_blocks(blocks: int, plan: IsaPlan) -> int:
    """Cin blocks per dW cube tile (of the ``blocks`` a task walks): 2 where one register holds a
    16-lane row (AVX-512) and the blocks pair up, the tile then ``rows(C0) / 2`` Cout rows x 2
    Cin blocks (8 broadcasts and 2 fmap rows a step for 16 FMAs, not 16 and 1: the loads, not
    the FMAs, bound the 16 x 1 tile); else 1. A Sapphire Rapids-class core, against 16 x 1:
    3x3 dW of 128 channels on 14x14 N=32 6.2-6.3 -> 5.3 ms, 256 on 7x7 N=32 6.1-6.4 -> 4.7-5.3,
    64 on 28x28 N=32 6.8-7.4 -> 5.7-6.1, the 1x1 of 256 -> 1024 on 14x14 N=8 2.6-2.8 -> 2.4-2.5;
    4 x 4 and 6 x 4 tiles no better, 12 x 2 and 16 x 2 (spilling) far worse."""
    return 2 if plan.registers_per_row == 1 and plan.rows(C0) % 2 == 0 and blocks % 2 == 0 else 1


def planar_tile(channels: int, pixels: int, plan: IsaPlan) -> tuple[int, int]:
    """Register tile ``(R, V)`` of a pixel-lane dX over channel-planar tensors (an image's
    ``pixels`` one axis, a multiple of the lanes): ``R`` output channels (a divisor of
    ``channels``, one broadcast weight each) x ``V`` vector registers of consecutive pixels (one dy
    load each per step): ``R*V`` accumulators within the plan's budget, and with the ``V`` loads
    and a broadcast within its registers. Where ``V`` vectors do not divide the plane, its last
    pixels are one narrower tile. The tile with the fewest estimated cycles per channel over the
    plane (:func:`step_cycles`), then the fewest loads per step (AVX-512 on 56x56: 4 x 6)."""
    vectors = pixels // plan.lanes
    options = []
    for v in range(1, min(vectors, plan.accumulators) + 1):
        whole, edge = divmod(vectors, v)
        for r in divisors(channels, plan.accumulators // v):
            if r * v + v + 1 > plan.registers:
                continue
            cycles = whole * step_cycles(r, v, plan) + (step_cycles(r, edge, plan) if edge else 0)
            options.append((cycles / r, r + v, r, v))
    *_, r, v = min(options)
    return r, v


def channel_tile(channels: int, vectors: int, plan: IsaPlan) -> tuple[int, int]:
    """Register tile ``(R, V)`` of a Cout-on-lanes dW over many input channels (a planar 1x1):
    ``R`` input channels (one broadcast x value each per step, a divisor of ``channels``) x ``V``
    of the ``vectors`` Cout vectors (one dy load each, a divisor), within the accumulators and,
    with the loads and a broadcast, the registers; the fewest estimated cycles per FMA
    (:func:`step_cycles`), then the most accumulators, then the fewest loads."""
    options = [(step_cycles(r, v, plan) / (r * v), -r * v, r + v, r, v)
               for v in divisors(vectors, plan.accumulators) for r in divisors(channels, plan.accumulators // v) if r * v + v + 1 <= plan.registers]  # fmt: skip
    *_, r, v = min(options)
    return r, v


def winograd_tile(tiles: int, rows: int, plan: IsaPlan, whole: bool = False) -> tuple[int, int]:
    """Register tile ``(R, V)`` of a Winograd GEMM (:mod:`.winograd`): ``R`` of a row's ``tiles``
    (one broadcast transformed input each per step; where ``R`` does not divide them, the row's last
    tiles are one narrower tile; ``whole``: a divisor of them, the tiles a fused loop that a
    partition cannot cut) x ``V`` of the ``rows`` 16-lane Cout rows (a divisor; one load of
    each of its registers per step): ``R*V`` rows' registers within the accumulators and, with the
    loads and a broadcast, within the registers. The fewest estimated cycles per Cout row over the
    tile row (:func:`step_cycles`), then the fewest loads (AVX-512 on 28 tiles of 64 channels: 14 x 2)."""
    per_row = plan.registers_per_row
    options = []
    for v in divisors(rows, plan.accumulators // per_row):
        registers = v * per_row
        for r in range(1, min(tiles, plan.accumulators // registers) + 1):
            if r * registers + registers + 1 > plan.registers or (whole and tiles % r):
                continue
            count, edge = divmod(tiles, r)
            cycles = count * step_cycles(r, registers, plan) + (step_cycles(edge, registers, plan) if edge else 0)
            options.append((cycles / v, r + v, r, v))
    *_, r, v = min(options)
    return r, v


def winograd_dw_tile(channels: int, rows: int, plan: IsaPlan) -> tuple[int, int]:
    """Register tile ``(R, V)`` of a Winograd dW GEMM (:mod:`.winograd`): ``R`` input channels (a
    divisor of ``channels``; one broadcast transformed x value each per step) x ``V`` of the
    ``rows`` 16-lane Cout rows (a divisor; one load of each of its registers per step), within the
    accumulators and, with the loads and a broadcast, the registers; the fewest estimated cycles
    per accumulator (:func:`step_cycles`), then the most accumulators."""
    per_row = plan.registers_per_row
    options = [(step_cycles(r, v * per_row, plan) / (r * v), -r * v, r, v)
               for v in divisors(rows, plan.accumulators // per_row) for r in divisors(channels, plan.accumulators // (v * per_row))
               if (r + 1) * v * per_row + 1 <= plan.registers]  # fmt: skip
    *_, r, v = min(options)
    return r, v


def depthwise_dw_tile(kernel_h: int, kernel_w: int, plan: IsaPlan) -> tuple[int, int, int]:
    """Depthwise dW tile ``(kernel rows, V, U)``: every tap of the kernel (or of one kernel row)
    x ``V`` vector registers of a channel row, ``wo`` unrolled by up to ``U``. The tile's
    accumulators, the ``U`` dy vectors and the ``U + KW - 1`` x vectors its taps share fit the
    registers with room to spare; the widest ``V`` that still unrolls ``wo`` by 2, else the
    widest that fits at all."""
    spare = 1 if plan.memory_operands else 4  # x86 FMAs read one operand from memory
    options = []
    for rows in (kernel_h, 1):
        for v in plan.row_parts:
            for u in range(1, MAX_WO_UNROLL + 1):
                live = (rows * kernel_w + 2 * u + kernel_w - 1) * v
                if rows * kernel_w * v <= plan.accumulators and live <= plan.registers - spare:
                    options.append((rows == kernel_h, min(u, 2), v, u, rows))
    if not options:
        return 1, 1, 1
    _, _, v, u, rows = max(options)
    return rows, v, u


def depthwise_dx_tile(rows: int, cols: int, taps_h: int, taps_w: int, plan: IsaPlan) -> tuple[int, int, int]:
    """Depthwise dX tile ``(TH, TW, V)``: the most accumulators ``TH*TW*V`` whose registers fit
    next to the phase's ``taps_h*taps_w`` weight vectors (``V`` registers each, held across the
    pixel tiles) and the ``TH*(TW + taps_w - 1)`` dy vectors one kernel row of the tile reads;
    whole tiles only."""
    options = [(1, 1, 1, 1)]
    for v in plan.row_parts:
        for th in divisors(rows, MAX_TILE_PIXELS):
            for tw in divisors(cols, MAX_TILE_PIXELS):
                if (taps_h * taps_w + th * tw + th * (tw + taps_w - 1)) * v < plan.registers and th * tw <= MAX_TILE_PIXELS:
                    options.append((th * tw * v, v, th, tw))
    _, v, th, tw = max(options)
    return th, tw, v



def tap_tile(kernel_w: int, cout_blocks: int, plan: IsaPlan) -> tuple[int, int, int]:
    """``(taps, vectors, registers)`` of a Cout-on-lanes dW tile: ``taps`` (a divisor of the
    kernel's width) x ``vectors`` Cout blocks of 16 lanes, or x ``registers`` of one block's row
    (AVX2: one ymm, 8 lanes; ``vectors`` is then 1). Per step ``(ho, wo)`` a tile loads one dy
    vector per register (from L2: an image's dy does not stay in L1) and broadcasts one x value
    per tap; of the tiles whose accumulators and operands fit the registers, the one with the
    most FMAs per estimated cycle (:func:`_tap_step_cycles`), then the most accumulators. E.g.
    a 7x7 stem of 64 channels: AVX-512 7 taps x 2 zmm; AVX2 7 taps x 1 ymm (not 1 tap x 8 ymm,
    whose dy stream from L2 outruns the FMAs)."""
    per_row = plan.registers_per_row
    options = []
    for taps in divisors(kernel_w, MAX_TAP_TILE):
        for part in plan.row_parts:
            for vectors in divisors(cout_blocks, cout_blocks) if part == per_row else [1]:
                dy = vectors * part
                accumulators = taps * dy
                if _tap_tile_fits(taps, dy, plan):
                    options.append((accumulators / _tap_step_cycles(taps, dy, plan), accumulators, taps, vectors, part))
    _, _, taps, vectors, part = max(options, default=(0, 1, 1, 1, per_row))
    return taps, vectors, part


def tap_rows(kernel_h: int, taps: int, dy: int, plan: IsaPlan) -> int:
    """Kernel rows per Cout-on-lanes dW tile of ``taps`` x ``dy`` registers (a divisor of the
    kernel's height): each row's taps broadcast their own x value and share the step's dy loads,
    so a few taps (a 3x3 stem of 32 channels: 3 taps x 2 zmm, six accumulators waiting on the
    FMA latency) take more rows where the accumulators, the dy registers and a broadcast fit; the
    most FMAs per estimated cycle (:func:`_tap_step_cycles`), then the fewest rows. E.g. AVX-512
    that 3x3 stem: 3 rows (18 accumulators, 11 loads a step for 18 FMAs instead of 5 for 6); a
    7x7 stem's 7 taps x 2 zmm: 1."""
    options = [r for r in divisors(kernel_h, kernel_h) if _tap_tile_fits(r * taps, dy, plan)]
    return max(options, key=lambda r: (r * taps * dy / _tap_step_cycles(r * taps, dy, plan), -r), default=1)


def _tap_tile_fits(taps: int, dy: int, plan: IsaPlan) -> bool:
    """Whether a Cout-on-lanes dW tile of ``taps`` x ``dy`` registers fits: its accumulators within
    the plan's budget, and with the dy registers (held while several taps use them) and a
    broadcast register (where the FMA cannot take it from memory) within the register file."""
    broadcast = 0 if plan.broadcast_operand else 1
    return taps * dy <= plan.accumulators and taps * dy + (dy if taps > 1 else 0) + broadcast < plan.registers


L2_BYTES_PER_CYCLE = 32  # what a core's L2 delivers to its L1 (Zen, Skylake and later: 32-64 B)


def _tap_step_cycles(taps: int, dy: int, plan: IsaPlan) -> float:
    """Cycles of one step of a Cout-on-lanes dW tile of ``taps`` x ``dy`` registers: the FMAs on
    two pipes, a chain's latency, the loads (``taps`` broadcasts and ``dy`` vectors), or the dy
    bytes from L2, whichever is longest, plus one for the loop."""
    loads_per_cycle = 2 if plan.broadcast_operand else 1.5
    dy_bytes = dy * plan.vector_bits // 8
    return max(taps * dy / 2, FMA_LATENCY, (taps + dy) / loads_per_cycle, dy_bytes / L2_BYTES_PER_CYCLE) + 1


def chunk(batch: int, rows: int, cols: int, steps: int = CHUNK_STEPS) -> tuple[int, int]:
    """``(images, rows)`` of a dW reduction chunk: whole images while they fit ``steps``,
    else bands of rows of one image."""
    if rows * cols <= steps:
        return largest_divisor(batch, steps // (rows * cols)), rows
    return 1, largest_divisor(rows, max(1, steps // cols))

