"""LLVM (CPU) schedule rule: 16-lane fp32 rows held in vector registers, fed by broadcast FMAs.

Both gradients are GEMMs whose N axis is a block of 16 lanes (a C0 row); every mad runs as
register tiles of accumulator rows, each reduction step one row load and one broadcast FMA per
accumulator row. How many rows a tile holds comes from the target's vector ISA
(:func:`~tvm_convgrad.schedule.isa.isa_plan`): a C0 row is one zmm on AVX-512 (tiles of 16 rows,
FMAs with a ``{1to16}`` broadcast operand), two ymm on AVX2 (tiles of 4-6 rows, 8-12
accumulators of the 16 registers), four 128-bit registers on SSE / NEON. The cube structure
(C0 blocks, stride phases, chunks) is the same on every ISA; only the tiles change.

* dW cube (``dw_cc``): a tile is ``R`` Cout rows of one ``(co1, c1, kh, kw)`` block x 16 Cin
  lanes (R = 16 on AVX-512), each step one fmap row (constant offset per tap) times ``R``
  broadcast dy values. Each core owns
  a group of Cout (or Cin) blocks and walks the reduction ``(n, ho, wo)`` in chunks of whole
  images or row bands, running all its tiles on a chunk before the next (``_chunk``). With
  fewer tiles than cores, each core sums its own part of the reduction (``rfactor``) and the
  parts are added in a fixed order, so results do not vary from run to run.
* dX cube (``dx_cc_<rh>_<rw>``, one per stride phase): a tile is ``TH x TW`` output pixels of one
  16-channel block (``dx_tile``, at most 16 pixels on AVX-512, 6 on AVX2), the reduction ``(co1, taps, co0)`` inside, each step one
  w_col row times ``TH*TW`` broadcast dy values. The channel blocks are taken in groups whose
  weights fit a core's cache, the pixels streaming past once per group.
* few input channels (``dw_cc_t``: Cout on the lanes; ``dx_px_*``: output columns on the lanes):
  tiles of taps x Cout vectors, or rows x channels, see their methods.
* depthwise (``dw_dw``, ``dx_dw_*``): channels on the lanes, elementwise FMAs; tiles of taps x a
  channel row (dW) or pixels x a channel row (dX), see their methods.

The fp16 -> fp32 conversion happens once: in the packing stages (``fmap_l1``, ``grads_2_matrix``,
``dy_pad``, ``w_col``, ``dy_rows``, ``w_t``; parallel, vectorized or walked in source order), or
as vector operands load (``vcvtph2ps``) where a pack would only have converted. With
``tunable=True`` the sizes become MetaSchedule samples (``sample_perfect_tile``, the default a
divisor among them): the dW cube's Cout rows per tile and its reduction chunk (images x row
bands), the dX cube's pixel tiles and channel-block groups, the transposed dW's taps x Cout
vectors, the pixel-lane dX's rows, the depthwise tiles' lanes, pixels and unrolled columns.

A strided dX of a batch whose dy outgrows the cache runs image by image: every phase (and the
dy pack) under the result's batch loop (:func:`_phases_image_by_image`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from ..dsl.compute.common import CONVERT_IN_PLACE
from .common import inline_layout_stages, stage_blocks, target_cores
from .isa import C0, IsaPlan, isa_plan

__all__ = ["CpuRule", "depthwise_dw_tile", "depthwise_dx_tile", "dx_tile"]

MAX_TILE_PIXELS = 16  # dX pixels per tile: 16 rows of accumulators at most (AVX-512: 16 zmm of 32)
MAX_TAP_TILE = 7  # transposed dW: taps per tile
MAX_WO_UNROLL = 4  # depthwise dW: output columns per tile step
WEIGHTS_IN_CACHE = 512 * 1024  # bytes of w_col kept in a core's L2 while dX walks the pixels
PACK_PER_CHUNK = True  # dW: pack each chunk's dy inside the chunk loop when it fits PACK_IN_CACHE
PACK_IN_CACHE = 768 * 1024
PHASES_PER_IMAGE = True  # strided dX of a batch: the phases image by image (_phases_image_by_image)
PER_IMAGE_ABOVE = 2 * 1024 * 1024  # ... when the batch's fp32 dy is larger than this (bytes)
CHUNK_STEPS = 1600  # reduction steps (n, ho, wo) per dW chunk: ~1.6 MB of fmap per 16 Cin blocks


def _extent(sch: s_tir.Schedule, loop) -> int:
    return int(sch.get(loop).extent)


def _divisors(n: int, most: int) -> list[int]:
    """The divisors of ``n`` up to ``most``."""
    return [d for d in range(1, min(n, most) + 1) if n % d == 0]


FMA_LATENCY = 5  # cycles of a dependent FMA chain (4 on recent cores, 5 on Haswell / Zen 1)


def _step_cycles(pixels: int, vectors: int, plan: IsaPlan) -> float:
    """Cycles of one reduction step of a dX tile of ``pixels x vectors`` accumulators, on a core
    with two FMA pipes: the FMAs, or one chain's latency, or the loads (``pixels`` broadcasts and
    ``vectors`` weight rows; two per cycle where the FMA takes the broadcast itself, 1.5 where a
    ``vbroadcastss`` needs a shuffle too), whichever is longest, plus one for the loop."""
    loads_per_cycle = 2 if plan.broadcast_operand else 1.5
    return max(pixels * vectors / 2, FMA_LATENCY, (pixels + vectors) / loads_per_cycle) + 1


def dx_tile(rows: int, cols: int, plan: IsaPlan) -> tuple[int, int, int]:
    """dX register tile ``(TH, TW, V)`` for a phase of ``rows x cols`` pixels: ``TH x TW`` pixels
    by ``V`` vector registers of each pixel's 16-lane row (``V`` divides the registers a row
    takes; ``TH*TW*V`` accumulators within the plan's budget). ``TH`` divides the rows; where
    ``TW`` does not divide the columns, the last ``cols % TW`` columns of each row band are a
    tile of their own (the schedule partitions the loop: no predicated FMA).

    The tile with the fewest estimated cycles per row (:func:`_step_cycles` over the row's
    tiles: enough accumulators to hide the FMA latency, few loads per FMA, few tiles per row);
    within 5% of the fewest, single-row tiles without an edge first. E.g. AVX-512 16 pixels
    (2 x 8 at 56 columns, 1 x 14 at 14), AVX2 1 x 6 x 2 ymm (and a 1 x 2 edge at 56 columns),
    1 x 5 x 2 on 7x7 phases."""
    per_row = plan.registers_per_row

    def cost(th: int, tw: int, v: int) -> float:
        whole, edge = divmod(cols, tw)
        cycles = whole * _step_cycles(th * tw, v, plan) + (_step_cycles(th * edge, v, plan) if edge else 0)
        return cycles * (per_row // v) / th

    options = [
        (cost(th, tw, v), th, tw, v)
        for v in plan.row_parts
        for th in _divisors(rows, MAX_TILE_PIXELS)
        for tw in range(1, min(cols, MAX_TILE_PIXELS // th) + 1)
        if th * tw * v <= plan.accumulators
    ]  # fmt: skip
    fewest = min(option[0] for option in options)
    near = [o for o in options if o[0] <= 1.05 * fewest]
    _, th, tw, v = max(near, key=lambda o: (cols % o[2] == 0, o[1] == 1, -o[0], o[1] * o[2] * o[3]))
    return th, tw, v


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
        for th in _divisors(rows, MAX_TILE_PIXELS):
            for tw in _divisors(cols, MAX_TILE_PIXELS):
                if (taps_h * taps_w + th * tw + th * (tw + taps_w - 1)) * v < plan.registers and th * tw <= MAX_TILE_PIXELS:
                    options.append((th * tw * v, v, th, tw))
    _, v, th, tw = max(options)
    return th, tw, v


def _elementwise(sch: s_tir.Schedule, block, shared: int = 0):
    """Parallel over the outer loops, vectorized over the innermost (C0, or 16 of a longer row);
    the first ``shared`` loops (that other stages run under too) are left as they are."""
    *outer, lanes = sch.get_loops(block)[shared:]
    if _extent(sch, lanes) > 16:
        if _extent(sch, lanes) % 16:
            outer.append(lanes)  # a ragged row: parallel only, LLVM vectorizes what it can
            lanes = None
        else:
            row, lanes = sch.split(lanes, [None, 16])
            outer.append(row)
    if outer:
        sch.parallel(sch.fuse(*outer))
    if lanes is not None:
        sch.vectorize(lanes)


def _planar_pack(sch: s_tir.Schedule, block, shared: int = 0):
    """A 5HD -> channel-plane pack (``dy_rows``, the transposed dW's ``fmap_l1``): walked in the
    source's order (channels innermost), so every read is contiguous; 16 planes are written.
    With ``shared`` = 1 the batch loop is one that other stages run under too (one image)."""
    *n, c, i, j = sch.get_loops(block)[shared:]
    c1, c0 = sch.split(c, [None, 16])
    sch.reorder(*n, c1, i, j, c0)
    sch.parallel(sch.fuse(*n, c1, i))
    sch.unroll(c0)


@dataclass
class _Cube:
    sch: s_tir.Schedule
    cores: int
    tunable: bool
    plan: IsaPlan
    placed: set = field(default_factory=set)  # stages a mad moved into its own loops
    per_image: bool = False  # dX phases run under the result's batch loop (:func:`_phases_image_by_image`)

    def batch(self, n) -> list:
        """``[n]``, or ``[]`` where the batch loop is the result's, shared by every phase."""
        return [] if self.per_image else [n]

    def split(self, loop, inner: int, max_inner: int):
        """``(outer, inner)``: ``inner`` fixed, or a MetaSchedule sample (a divisor of the
        extent, at most ``max_inner``) when tunable."""
        if self.tunable:  # the design space's own decision is the default
            extent = _extent(self.sch, loop)
            decision = [extent // inner, inner] if extent % inner == 0 and inner <= max_inner else None
            factors = self.sch.sample_perfect_tile(loop, n=2, max_innermost_factor=max_inner, decision=decision)
            return self.sch.split(loop, factors)
        return self.sch.split(loop, [None, inner])

    def filter_grad(self, block, kh: int, kw: int):
        """dW: ``(co1, c1, kh, kw)`` tiles x ``[n, ho, wo]`` x (co0 unrolled, c0 vectorized).

        Each core owns a group of Cout blocks (or of Cin blocks) and walks the reduction in
        chunks of whole images (or row bands), running all its tiles on one chunk before the
        next: the chunk's dy and fmap stay in cache while they are reused, and each core streams
        fmap once. The tile's 16 accumulators stay in registers within a chunk.
        """
        sch = self.sch
        g, fkk, co, c0, n, ho, wo = sch.get_loops(block)
        c1, tap_h, tap_w = sch.split(fkk, [None, kh, kw])
        co1, co0 = sch.split(co, [None, 16])
        groups, blocks_out, blocks_in = _extent(sch, g), _extent(sch, co1), _extent(sch, c1)
        batch, rows, cols = _extent(sch, n), _extent(sch, ho), _extent(sch, wo)
        cores = self.cores
        longest = max((n, ho, wo), key=lambda lp: _extent(sch, lp))
        if groups * blocks_out * blocks_in < cores and _extent(sch, longest) >= 2 * cores:
            self._split_reduction(block, [g, co1, c1, tap_h, tap_w], [n, ho, wo], longest, co0, c0)
            return
        cores_own_out = (groups * blocks_out) % cores == 0  # else Cin blocks, else whole tiles
        owned_out = groups * blocks_out // (cores if cores_own_out else 1)
        limit = CHUNK_STEPS
        if PACK_PER_CHUNK:  # small enough that a chunk's fp32 dy stays in the core's cache
            limit = min(limit, max(cols, PACK_IN_CACHE // (owned_out * C0 * 4)))
        images, bands = _chunk(batch, rows, cols, limit)
        n_o, n_i = self.split(n, images, batch)
        ho_o, ho_i = self.split(ho, bands, rows)
        chunk, steps = [n_o, ho_o], [n_i, ho_i, wo]
        # Cout rows per tile: all 16 where the registers hold them (AVX-512); else the most that
        # fit, the last tile predicated (AVX2: 6 + 6 + 4 rows, not 4 x 4). LLVM unswitches the
        # predicate, so each tile's hot loop has only its own rows' FMAs; a loop_partition would
        # do the same but put each tile in a scope that cannot zero its accumulators before
        # chunks outside it.
        most = self.plan.rows(C0)
        rows_o, co0 = self.split(co0, self.plan.rows(C0, divides=C0) if self.tunable else most, most)
        chunk_first = cores_own_out or blocks_in % cores == 0
        if cores_own_out:
            sch.reorder(g, co1, c1)
            core, owned = sch.split(sch.fuse(g, co1), [cores, None])
            sch.reorder(core, *chunk, owned, c1, tap_h, tap_w, rows_o, *steps, co0, c0)
        elif blocks_in % cores == 0:
            core, owned = sch.split(c1, [cores, None])
            sch.reorder(core, *chunk, g, co1, owned, tap_h, tap_w, rows_o, *steps, co0, c0)
        else:  # no even split: every tile a task, its whole reduction inside
            sch.reorder(g, co1, c1, tap_h, tap_w, rows_o, *chunk, *steps, co0, c0)
            core = sch.fuse(g, co1, c1)
        sch.parallel(core)
        chunk_bytes = images * bands * cols * owned_out * C0 * 4  # the fp32 dy one chunk of a core reads
        if PACK_PER_CHUNK and chunk_first and chunk_bytes <= PACK_IN_CACHE:
            self._pack_per_chunk("grads_2_matrix", chunk[-1])
        self._tile_body(block, n_o)

    def _pack_per_chunk(self, stage: str, loop):
        """Pack what one chunk of the reduction reads, inside the chunk loop: the fp32 copy is
        written to and read from the core's cache instead of memory."""
        sch = self.sch
        try:
            pack = sch.get_sblock(stage)
        except Exception:  # read in place (inlined): nothing to move
            return
        sch.compute_at(pack, loop)
        if not self.tunable:  # (tunable: the loops compute_at makes depend on the sampled chunk, and
            *_, lanes = sch.get_loops(pack)  # a trace must give the same loops on every replay;
            sch.vectorize(lanes)  # LLVM vectorizes the contiguous 16-lane conversion by itself)
        self.placed.add(stage)

    def _split_reduction(self, block, tiles, reduce, longest, co0, c0):
        """Too few tiles for the cores: each core sums a part of the reduction (``rfactor``);
        the parts are added in a fixed order afterwards, so results do not vary run to run."""
        sch = self.sch
        i = reduce.index(longest)
        part, reduce[i] = sch.split(longest, [self.cores, None])
        rows_o, co0 = self.split(co0, self.plan.rows(C0, divides=C0), self.plan.rows(C0))
        sch.reorder(part, *tiles, rows_o, *reduce, co0, c0)
        rf = sch.rfactor(part, 0)
        loops = sch.get_loops(rf)  # part, the tile loops, the row groups, the reduction loops, co0, c0
        sch.parallel(loops[0])
        self._tile_body(rf, loops[2 + len(tiles)])
        _sum_parts(sch, block)

    def _tile_body(self, block, first_reduce):
        """The 16x16 register tile: C0 rows unrolled, C0 lanes vectorized; init before the reduction."""
        *_, rows, lanes = self.sch.get_loops(block)
        self._register_tile(block, [rows], lanes, first_reduce)

    def _register_tile(self, block, unrolled, lanes, first_reduce):
        """A tile's accumulators in registers: its loops unrolled, the lanes vectorized, the
        accumulators set to 0 before ``first_reduce``."""
        for loop in unrolled:
            self.sch.unroll(loop)
        self.sch.vectorize(lanes)
        self.sch.decompose_reduction(block, first_reduce)

    def input_grad(self, block, weight_bytes: int):
        """dX phase: pixel tiles ``(j_i x i_i)`` x 16 lanes (or a part of them, :func:`dx_tile`),
        reduction ``[co1, mh, mw, co0]`` inside.

        The channel blocks ``c1`` are taken in groups whose w_col fits a core's cache
        (WEIGHTS_IN_CACHE): a group's weights stay in cache while the pixels stream past, once
        per group (all of them in one group when the weights fit, one block per group when a
        single block's panel is that large).
        """
        sch = self.sch
        n, c1, j, i, c0, co1, mh, mw, co0 = sch.get_loops(block)
        blocks = _extent(sch, c1)
        group = _largest_divisor(blocks, WEIGHTS_IN_CACHE // max(1, weight_bytes // blocks))
        c1_o, c1_i = self.split(c1, group, blocks)
        cols = _extent(sch, i)
        th, tw, v = dx_tile(_extent(sch, j), cols, self.plan)
        most = min(MAX_TILE_PIXELS, self.plan.accumulators // v)
        j_o, j_i = self.split(j, th, most)
        lane_groups, c0 = sch.split(c0, [None, v * self.plan.lanes])
        reduction = [co1, mh, mw, co0]
        if cols % tw == 0 or self.tunable:
            i_o, i_i = self.split(i, tw, most)
            sch.reorder(c1_o, *self.batch(n), j_o, i_o, c1_i, lane_groups, *reduction, j_i, i_i, c0)
            sch.parallel(sch.fuse(c1_o, *self.batch(n), j_o))
            self._register_tile(block, [j_i, i_i], c0, co1)
            return
        # The columns in tiles of TW and one narrower tile at the end: two copies of the mad.
        sch.reorder(c1_o, *self.batch(n), j_o, i, c1_i, lane_groups, *reduction, j_i, c0)
        sch.parallel(sch.fuse(c1_o, *self.batch(n), j_o))
        for copy, tiles, i_i, below in _whole_tiles_and_edge(sch, i, cols, tw):
            c1_i, lane_groups, co1, mh, mw, co0, j_i, c0 = below
            sch.reorder(*tiles, c1_i, lane_groups, co1, mh, mw, co0, j_i, i_i, c0)
            self._register_tile(copy, [j_i, i_i], c0, co1)

    def transposed_filter_grad(self, block):
        """dW with Cout on the lanes (``dw_cc_t[c, kh, kw, co]``): a tile is ``kw_i`` taps x
        ``co1_i`` Cout vectors (:meth:`_tap_tile`) of one ``(c, kh)``, fed by one broadcast x
        value per tap and one dy vector per Cout block, summing ``(ho, wo)`` in registers.

        With a batch, each image is a separate partial dW (``rfactor`` over ``n``): the images
        run one after another with every tile reading that image's dy while it is in cache, and
        the partials (``N`` small dWs: this layout is for few input channels) are summed after.
        """
        sch = self.sch
        c, kh, kw, co, n, ho, wo = sch.get_loops(block)
        co1, co0 = sch.split(co, [None, 16])
        taps, vectors = self._tap_tile(_extent(sch, kw), _extent(sch, co1))
        kw_o, kw_i = self.split(kw, taps, taps)
        co1_o, co1_i = self.split(co1, vectors, vectors)
        batched = _extent(sch, n) > 1
        if batched:
            sch.reorder(n, c, kh, kw_o, co1_o, ho, wo, kw_i, co1_i, co0)
            mad = sch.rfactor(n, 0)
            n, c, kh, kw_o, co1_o, ho, wo, kw_i, co1_i, co0 = sch.get_loops(mad)
        else:
            sch.reorder(c, kh, kw_o, co1_o, n, ho, wo, kw_i, co1_i, co0)
            mad = block
        sch.parallel(sch.fuse(c, kh, kw_o, co1_o))
        sch.unroll(kw_i)
        sch.unroll(co1_i)
        sch.vectorize(co0)
        sch.decompose_reduction(mad, ho if batched else n)
        if batched:
            _sum_parts(sch, block)

    def _tap_tile(self, kernel_w: int, cout_blocks: int) -> tuple[int, int]:
        """``(taps, vectors)`` of a Cout-on-lanes dW tile: the most accumulators whose registers
        fit with their operands: ``taps * vectors`` accumulator rows, the ``vectors`` dy rows
        (kept in registers when more than one tap reuses them) and the broadcast x value."""
        per_row, plan = self.plan.registers_per_row, self.plan

        def registers(taps: int, vectors: int) -> int:
            reused = vectors * per_row if taps > 1 else 0
            return taps * vectors * per_row + reused + (0 if plan.broadcast_operand else 1)

        fits = [
            (taps * vectors, taps, vectors)
            for taps in range(1, min(kernel_w, MAX_TAP_TILE) + 1) if kernel_w % taps == 0
            for vectors in range(1, cout_blocks + 1) if cout_blocks % vectors == 0
            if taps * vectors * per_row <= plan.accumulators and registers(taps, vectors) < plan.registers
        ]  # fmt: skip
        _, taps, vectors = max(fits, default=(1, 1, 1))
        return taps, vectors

    def pixel_lane_input_grad(self, block):
        """dX with output columns on the lanes (``dx_px``): a tile is 16 columns (fewer where a
        row of every channel would not fit the registers) x ``j_i`` rows x every input channel;
        per ``(co, mh, mw)`` one dy vector per row, used at once by every channel's broadcast
        weight (so one dy vector is live at a time, the channels' weights for the whole tile)."""
        sch, plan = self.sch, self.plan
        n, ci, j, i, co, mh, mw = sch.get_loops(block)
        width, channels = _extent(sch, i), _extent(sch, ci)
        room = max(1, plan.accumulators - channels + 1)  # each channel's weight stays live
        vectors = _largest_divisor(plan.registers_per_row, room // channels)
        columns = vectors * plan.lanes
        i_o, i_i = sch.split(i, [None, columns]) if width > columns else (None, i)
        budget = max(1, room // (channels * vectors))
        rows = _largest_divisor(_extent(sch, j), budget)
        j_o, j_i = self.split(j, rows, budget)
        outer = [*self.batch(n), j_o] + ([i_o] if i_o is not None else [])
        sch.reorder(*outer, co, mh, mw, j_i, ci, i_i)
        sch.parallel(sch.fuse(*outer))
        sch.unroll(ci)
        sch.unroll(j_i)
        if width <= columns or width % columns == 0:  # a ragged last vector stays scalar
            sch.vectorize(i_i)
        sch.decompose_reduction(block, co)

    def depthwise_filter_grad(self, block):
        """Depthwise dW (``dw_dw[q, c1, kh, kw, c0]``): a tile is every tap of one channel row (16
        lanes, or part of them where the taps would not fit the registers), each reduction step
        ``(n, ho, wo)`` one dy vector times the taps' x vectors, elementwise. ``wo`` is unrolled
        by up to 4 inside the tile, so that taps reading the same x vector share its load.

        The cores take the channel blocks; where they do not split evenly (MobileNetV2's 144
        channels are 9 blocks), each core sums a part of the rows of every block (``rfactor``)
        and the parts are added afterwards in a fixed order.
        """
        sch, plan = self.sch, self.plan
        q, c1, kh, kw, c0, n, ho, wo = sch.get_loops(block)
        rows, vectors, unroll = depthwise_dw_tile(_extent(sch, kh), _extent(sch, kw), plan)
        lane_groups, c0 = self.split(c0, vectors * plan.lanes, C0)
        tiled = [kh, kw] if rows > 1 or _extent(sch, kh) == 1 else [kw]
        tasks = [q, c1, lane_groups] + ([kh] if tiled == [kw] else [])
        wo_o, wo_i = self.split(wo, _largest_divisor(_extent(sch, wo), unroll), MAX_WO_UNROLL)
        count = 1
        for loop in tasks:
            count *= _extent(sch, loop)
        longest = max((n, ho), key=lambda lp: _extent(sch, lp))
        if count % self.cores and count < 8 * self.cores and _extent(sch, longest) >= 2 * self.cores:
            part, inner = sch.split(longest, [self.cores, None])
            reduce = [part, inner, ho] if longest is n else [n, part, inner]
            reduce.remove(part)
            sch.reorder(part, *tasks, *reduce, wo_o, wo_i, *tiled, c0)
            rf = sch.rfactor(part, 0)
            loops = sch.get_loops(rf)  # part, tasks, reduce (2), wo_o, wo_i, tiled, c0
            sch.parallel(loops[0])
            self._register_tile(rf, [loops[-2 - len(tiled)], *loops[-1 - len(tiled) : -1]], loops[-1], loops[1 + len(tasks)])
            _sum_parts(sch, block)
            return
        sch.reorder(*tasks, n, ho, wo_o, wo_i, *tiled, c0)
        sch.parallel(sch.fuse(*tasks))
        self._register_tile(block, [wo_i, *tiled], c0, n)

    def depthwise_input_grad(self, block):
        """Depthwise dX phase (``dx_dw``): a tile is ``TH x TW`` pixels x a channel row (or part of
        it, :func:`depthwise_dx_tile`), the reduction ``(q, mh, mw)`` inside (LLVM unrolls the
        taps, sharing dy loads between neighbouring pixels and taps, and keeps the tile's weight
        vectors in registers across the pixel tiles)."""
        sch, plan = self.sch, self.plan
        n, c1, j, i, c0, q, mh, mw = sch.get_loops(block)
        th, tw, v = depthwise_dx_tile(_extent(sch, j), _extent(sch, i), _extent(sch, mh), _extent(sch, mw), plan)
        most = min(MAX_TILE_PIXELS, plan.accumulators // v)
        j_o, j_i = self.split(j, th, most)
        i_o, i_i = self.split(i, tw, most)
        lane_groups, c0 = self.split(c0, v * plan.lanes, C0)
        sch.reorder(*self.batch(n), c1, lane_groups, j_o, i_o, q, mh, mw, j_i, i_i, c0)  # a lane group's weights stay in registers
        sch.parallel(sch.fuse(*self.batch(n), c1, lane_groups, j_o))
        self._register_tile(block, [j_i, i_i], c0, q)


def _whole_tiles_and_edge(sch: s_tir.Schedule, loop, extent: int, tile: int):
    """Partition ``loop`` (``extent`` iterations) into whole tiles of ``tile`` and one edge of
    ``extent % tile`` (``loop_partition``: a copy of the block under each part, so no iteration
    needs a predicate). Yields per copy ``(block, [the tile loop] or [] on the edge, the loop
    inside a tile, the loops below it)``. Each copy is a scope block of its own, out of reach of
    the loops outside the partition: the whole reduction must be below ``loop``."""
    whole, edge = sch.loop_partition(loop, [extent - extent % tile, None])
    for part in (whole, edge):
        (copy,) = sch.get_child_blocks(part)
        loops = sch.get_loops(copy)
        at = [sch.get(lp).same_as(sch.get(part)) for lp in loops].index(True)
        if part is whole:
            tiles, inner = sch.split(part, [None, tile])
            yield copy, [tiles], inner, loops[at + 1 :]
        else:  # the edge: one tile
            yield copy, [], part, loops[at + 1 :]


DX_PHASES = ("dx_cc_", "dx_px_", "dx_dw_")
DY_PACKS = ("dy_pad", "dy_rows", "dy_dw")


def _phases_image_by_image(sch: s_tir.Schedule) -> set[str]:
    """A strided dX of a batch, image by image: every stride phase reads all of dy, so phases run
    one after another over the whole batch read dy from memory once per phase, and a channel-
    planar pack (``dy_rows``: a tile reads as many rows as there are channels) from memory at
    the latency of one stream per plane. Under the batch loop of the result stage instead, each
    image's dy is packed and read by every phase while it is in cache (and TVM allocates the
    packed dy and the phases' outputs for one image). Returns the stages moved under that loop."""
    blocks = stage_blocks(sch)
    phases = [b for b in blocks if sch.get(b).name_hint.startswith(DX_PHASES)]
    if len(phases) < 2:
        return set()
    (result,) = {sch.get(c).name_hint for c in sch.get_consumers(phases[0])}
    batch = sch.get_loops(sch.get_sblock(result))[0]
    images = _extent(sch, batch)
    dy_elements = max(_elements(r.source) for r in sch.get(phases[0]).reads if int(r.source.shape[0]) == images)
    if images < 2 or dy_elements * 4 <= PER_IMAGE_ABOVE:
        return set()
    moved = {result}
    for phase in phases:
        sch.compute_at(phase, batch)
        _restore_unit_loops(sch, phase)
        moved.add(sch.get(phase).name_hint)
    for pack in blocks:
        if sch.get(pack).name_hint in DY_PACKS:
            sch.compute_at(pack, batch)
            moved.add(sch.get(pack).name_hint)
    return moved


def _elements(buffer) -> int:
    size = 1
    for d in buffer.shape:
        size *= int(d)
    return size


def _restore_unit_loops(sch: s_tir.Schedule, block):
    """One loop per iter var again after a ``compute_at`` (which makes none for an extent of 1,
    e.g. a stride phase with a single tap), so the block's loops unpack as before."""
    iters = sch.get(block).iter_vars
    loops = list(sch.get_loops(block))
    if len(loops) == len(iters):
        return
    kept = iter(loops)
    pending = next(kept, None)
    missing = 0
    for it in iters:
        if pending is not None and int(sch.get(pending).extent) == int(it.dom.extent):
            for _ in range(missing):
                sch.add_unit_loop(pending)
            missing, pending = 0, next(kept, None)
        else:
            missing += 1
    for _ in range(missing):
        sch.add_unit_loop(block)


def _sum_parts(sch: s_tir.Schedule, block):
    """The write-back of an rfactor: ``dW = part_0 + part_1 + ...`` in a fixed order, vectorized."""
    part, *spatial = sch.get_loops(block)
    *outer, lanes = spatial
    sch.reorder(*outer, part, lanes)
    sch.parallel(sch.fuse(*outer))
    sch.vectorize(lanes)
    init = sch.decompose_reduction(block, part)
    sch.vectorize(sch.get_loops(init)[-1])


def _chunk(batch: int, rows: int, cols: int, steps: int = CHUNK_STEPS) -> tuple[int, int]:
    """``(images, rows)`` of a dW reduction chunk: whole images while they fit ``steps``,
    else bands of rows of one image."""
    if rows * cols <= steps:
        return _largest_divisor(batch, steps // (rows * cols)), rows
    return 1, _largest_divisor(rows, max(1, steps // cols))


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0)


def _buffer_bytes(sch: s_tir.Schedule, stage: str) -> int:
    """Bytes of the buffer a stage writes."""
    (buffer,) = [w.source for w in sch.get(sch.get_sblock(stage)).writes]
    return _elements(buffer) * tvm.DataType(buffer.dtype).bits // 8


class CpuRule(ScheduleRule):
    """Schedule rule for ``llvm`` targets (usable in ``dlight.ApplyDefaultSchedule``)."""

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "llvm"

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        return self.schedule(s_tir.Schedule(func, error_render_level="none"), target, tunable)

    def design_spaces(self, sch: s_tir.Schedule, target: Target) -> list[s_tir.Schedule]:
        """MetaSchedule's design space for ``sch`` (an unscheduled traced schedule): the tunable schedule."""
        return [self.schedule(sch, target, tunable=True)]

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False) -> s_tir.Schedule:
        """Schedule the gradient held by ``sch`` in place (MetaSchedule's ``ScheduleFn`` calls
        this on its own traced schedule: with ``tunable`` the tile sizes are its samples)."""
        plan = isa_plan(target)
        cube = _Cube(sch, target_cores(target), tunable, plan)
        inline_layout_stages(sch)
        if plan.converts_fp16:  # the mads read those inputs in place, converting as they load
            for block in stage_blocks(sch):
                if CONVERT_IN_PLACE in sch.get(block).annotations:
                    sch.compute_inline(block)
        per_image = _phases_image_by_image(sch) if PHASES_PER_IMAGE else set()
        cube.per_image = bool(per_image)
        packs = []
        for block in stage_blocks(sch):
            name = sch.get(block).name_hint
            if name == "dw_cc":
                attrs = sch.get(block).annotations
                cube.filter_grad(block, int(attrs["kernel_h"]), int(attrs["kernel_w"]))
            elif name == "dw_cc_t":
                cube.transposed_filter_grad(block)
            elif name.startswith("dx_cc_"):
                cube.input_grad(block, _buffer_bytes(sch, "w_col"))
            elif name.startswith("dx_px_"):
                cube.pixel_lane_input_grad(block)
            elif name == "dw_dw":
                cube.depthwise_filter_grad(block)
            elif name.startswith("dx_dw_"):
                cube.depthwise_input_grad(block)
            else:
                packs.append(name)
        for name in packs:  # the stages the mads did not place inside their loops
            if name in cube.placed:
                continue
            block = sch.get_sblock(name)
            shared = int(name in per_image)
            if name == "dy_rows" or (name == "fmap_l1" and len(sch.get_loops(block)) == 4):
                _planar_pack(sch, block, shared)
            else:
                _elementwise(sch, block, shared)
        return sch
