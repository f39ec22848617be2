"""Depthwise gradients (and the forward of one output channel per group) on the CPU: 16 channels on
the lanes, elementwise FMAs, each input streamed once, instead of multiplying FracZ_g blocks that
are 15/16 zeros.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ...dsl.compute.stages import DX_DW, DX_PHASE_PREFIXES, DY_DW, FMAP_DW, FMAP_PAD, GRADS_DW
from ...layout import C0
from ..common import elements, loop_extent, loop_position, stage_blocks
from .loops import (
    CpuMad,
    channel_block_task,
    channels_innermost,
    channels_last_result,
    pack_in_source_axes,
    pack_under,
    producers_named,
    restore_unit_loops,
    sum_parts,
)
from .tiles import (
    MAX_TILE_PIXELS,
    MAX_WO_UNROLL,
    depthwise_dw_tile,
    depthwise_dx_tile,
    divisors,
    largest_divisor,
    most_blocks_a_task,
)

__all__ = ["BAND_BYTES", "NXC_BANDS", "PACKS_PER_IMAGE", "PLANES_PER_CORE", "PLANE_MIN_PIXELS", "TILE_WRITE_BACK", "TILE_WRITE_BACK_LANES",
           "DepthwiseFilterGrad", "DepthwiseForward", "DepthwiseInputGrad", "phases_plane_by_plane"]  # fmt: skip

PACKS_PER_IMAGE = True  # depthwise dW: x and dy packed image by image inside the tasks
IMAGES_PER_CORE = True  # depthwise dW: each core sums its own images, every channel block of each (DepthwiseFilterGrad._in_parts)
PLANES_PER_CORE = 4  # a one-phase dX runs plane by plane where there are this many planes per core
PLANE_MIN_PIXELS = 400
"""... and its planes this many pixels or more (an NCX result's; an NXC one runs by bands of rows,
:data:`BAND_BYTES`, where it makes enough tasks): a smaller plane's task is too short for its pack and
write-back to pay, and the tasks are the tiles' rows, the packs a pass of their own. Zen 4 (2 cores,
NXC, fp32, ms, plane by plane against by rows; PyTorch's beside): the forward of 960 channels on 4x4
at N=32 0.335 / 0.223 (0.189), 384 on 7x7 0.360 / 0.226 (0.265), 144 on 16x16 at N=8 0.115 / 0.099
(0.136), 384 on 4x4 0.044 / 0.023 (0.098); the dX 0.559 / 0.404 on 7x7, 0.109 / 0.087 on 16x16. On 28x28
the planes win: 144 channels at N=32, forward 2.72 / 4.38, dX 2.53 / 4.44."""


TILE_WRITE_BACK = True  # a one-phase dX / forward: each tile's sums written to the result as the tile ends
TILE_WRITE_BACK_LANES = 16
"""A one-phase dX's (or forward's) result is written tile by tile (:meth:`DepthwiseInputGrad._write_back_per_tile`)
on ISAs of this many fp32 lanes or more (AVX-512: 32 registers, a tile pixel's 16 channels in one)."""

NXC_BANDS = True  # NXC depthwise: dX / forward tasks and dW packs by bands of an image's rows, every channel block inside
BAND_BYTES = 512 * 1024
"""An NXC one-phase dX's (or forward's) task: the band of an image's rows whose pack and sums take
at most this many bytes (fp32), every channel block of the band inside the task, so its pack reads
whole pixels (each pixel's channels one contiguous run) and its result writes them. Planes (or the
packs' own passes on small maps) read and wrote one line of each pixel per 16 channels. Zen 4, 2
cores, N=32, ms, planes / bands (oneDNN's), one process, rotating: dX of 32 channels on 56x56 2.17
/ 1.80 (2.01), 144 on 28x28 2.99 / 2.89 (3.20), 192 on 14x14 1.00 / 0.68 (0.87), 576 on 7x7 0.89 /
0.48 (0.63), 960 on 4x4 0.24 / 0.19 (0.30); the forward 2.72 / 2.04 (1.88), 3.00 / 2.79 (2.77),
1.38 / 1.02 (1.10), 0.71 / 0.43 (0.46), 0.24 / 0.19 (0.17); N=8, 576 on 4x4: dX 0.110 / 0.070,
forward 0.084 / 0.066."""


class DepthwiseFilterGrad(CpuMad):
    """Depthwise dW (``dw_dw``)."""

    def schedule(self, block):
        """Depthwise dW (``dw_dw[q, c1, kh, kw, c0]``): a tile is every tap of one channel row (16
        lanes, or part of them where the taps would not fit the registers), each reduction step
        ``(n, ho, wo)`` one dy vector times the taps' x vectors, elementwise. ``wo`` is unrolled
        by up to 4 inside the tile, so that taps reading the same x vector share its load.

        Where the images split evenly, each core sums the dW of its own images, every channel
        block of an image before the next (:meth:`_in_parts`). Else the cores take the
        channel blocks; where those do not split evenly (MobileNetV2's 144 channels are 9
        blocks), each core sums a part of the rows of every block (``rfactor``); parts are added
        afterwards in a fixed order.

        Image by image (:data:`PACKS_PER_IMAGE`, where a tile takes every tap): a task packs one
        image's x and dy planes of its lanes and runs its tile on them while they are in cache,
        instead of the whole batch packed to memory and read back (MobileNetV2's 144-channel
        28x28 layer, N=32: 5.5 -> 1.9 ms). NXC inputs on large maps are packed by bands of an
        image's rows instead, every channel block of the band at once (:meth:`_band_rows`).
        """
        sch, plan = self.sch, self.plan
        q, c1, kh, kw, c0, n, ho, wo = sch.get_loops(block)
        rows, vectors, unroll = depthwise_dw_tile(loop_extent(sch, kh), loop_extent(sch, kw), plan)
        lane_groups, c0 = self.split(c0, vectors * plan.lanes, C0)
        tiled = [kh, kw] if rows > 1 or loop_extent(sch, kh) == 1 else [kw]
        per_image = PACKS_PER_IMAGE and not self.tunable and tiled != [kw] and bool(self._packs(block))
        tasks = [q, c1, lane_groups] + ([kh] if tiled == [kw] else [])
        large = loop_extent(sch, ho) * loop_extent(sch, wo) >= PLANE_MIN_PIXELS  # (dy's plane)
        wo_o, wo_i = self.split(wo, largest_divisor(loop_extent(sch, wo), unroll), MAX_WO_UNROLL)
        count = 1
        for loop in tasks:
            count *= loop_extent(sch, loop)
        steps = [wo_o, wo_i, *tiled, c0]  # (below the rows)
        if IMAGES_PER_CORE and loop_extent(sch, n) % self.cores == 0:
            # each core its own images, every channel block of an image before the next (see _in_parts)
            part, images = sch.split(n, [self.cores, None])
            band = self._band_rows(block, loop_extent(sch, ho)) if per_image and large else None
            if band is not None:  # NXC: a band of an image's rows packed whole, every block of it before the next band
                bands, ho = sch.split(ho, [None, band])
                order = [part, images, bands, *tasks, ho, *steps]
                self._in_parts(block, order, len(tiled), first_reduce=1, image=2, per_image=True)
                return
            order = [part, images, *tasks, ho, *steps]
            self._in_parts(block, order, len(tiled), first_reduce=1, image=1 + len(tasks), per_image=per_image)
            return
        longest = max((n, ho), key=lambda lp: loop_extent(sch, lp))
        if count % self.cores and count < 8 * self.cores and loop_extent(sch, longest) >= 2 * self.cores:
            part, inner = sch.split(longest, [self.cores, None])
            reduce = [inner, ho] if longest is n else [n, inner]
            order = [part, *tasks, *reduce, *steps]
            self._in_parts(block, order, len(tiled), first_reduce=1 + len(tasks), image=1 + len(tasks), per_image=per_image)
            return
        sch.reorder(*tasks, n, ho, wo_o, wo_i, *tiled, c0)
        sch.parallel(sch.fuse(*tasks))
        self.register_tile(block, [wo_i, *tiled], c0, n)
        if per_image:
            self._pack_per_image(block, n)

    def _in_parts(self, block, order: list, taps: int, first_reduce: int, image: int, per_image: bool):
        """The cores sum parts of the reduction (``rfactor`` over ``order[0]``, the part, its
        loops in ``order``; the parts added afterwards in a fixed order): the tile (the last
        ``taps`` loops above the lanes, and ``wo_i``) set to 0 before the rf block's loop at
        ``first_reduce``, the packs made per image under its loop at ``image``. With each core's
        images as the parts, every channel block of an image before the next, a core reads its
        images' rows whole, once, where owning channel blocks had both cores read every row of
        the batch for their own 64 bytes of it (channels-last; MobileNetV2's NHWC 96-channel
        stride-2 layer at N=32, operands streamed from memory: 4.3 -> 3.5 ms)."""
        sch = self.sch
        sch.reorder(*order)
        rf = sch.rfactor(order[0], 0)
        loops = sch.get_loops(rf)  # (as order)
        sch.parallel(loops[0])
        self.register_tile(rf, [loops[-2 - taps], *loops[-1 - taps : -1]], loops[-1], loops[first_reduce])
        sum_parts(sch, block)
        if per_image:
            self._pack_per_image(rf, loops[image])

    def _packs(self, mad) -> list:
        """The mad's x and dy packs (none where it reads its inputs in place, converting)."""
        return producers_named(self.sch, mad, (FMAP_DW, GRADS_DW))

    def _pack_per_image(self, mad, image):
        """The x and dy packs of what the mad reads under its ``image`` loop, computed there, each
        walking its tensor in the tensor's order."""
        for pack in self._packs(mad):
            self.pack_at(pack, image)
            pack_in_source_axes(self.sch, pack, image)

    def _band_rows(self, block, rows: int):
        """dy rows per band where x and dy are NXC (:func:`.loops.channels_innermost`): the most,
        a divisor of ``rows``, whose packs (every channel block of the band's rows) fit
        :data:`BAND_BYTES`; None for NCX inputs. (Taken on planes of :data:`PLANE_MIN_PIXELS` or
        more: a smaller plane's packs stay in L1 for its tile, a band's in L2. Zen 4, N=32, ms,
        planes / bands: 32 channels on 56x56 2.31 / 1.75, 144 on 28x28 2.72 / 2.09, the stride-2
        96 on 56x56 3.84 / 3.64; but 192 on 14x14 0.37 / 0.42, 576 on 7x7 0.30 / 0.34.)"""
        packs = self._packs(block)
        if not NXC_BANDS or not packs or not all(channels_innermost(self.sch, p) for p in packs):
            return None
        buffers = [self.sch.get(p).writes[0].source for p in packs]
        image_bytes = sum(elements(b) // int(b.shape[0]) * 4 for b in buffers)  # (fp32)
        return max(d for d in divisors(rows, rows) if d == 1 or image_bytes * d <= BAND_BYTES * rows)


class DepthwiseInputGrad(CpuMad):
    """One stride phase of depthwise dX (``dx_dw_<rh>_<rw>``)."""

    write_back_in_task = True  # a one-phase dX: pack, mad and result per channel-block plane
    packs = (DY_DW,)  # the stage of the input each task packs

    def schedule(self, block):
        """Depthwise dX phase (``dx_dw``): a tile is ``TH x TW`` pixels x a channel row (or part of
        it, :func:`depthwise_dx_tile`), the reduction ``(q, mh, mw)`` inside (LLVM unrolls the
        taps, sharing dy loads between neighbouring pixels and taps, and keeps the tile's weight
        vectors in registers across the pixel tiles).

        A one-phase dX (stride 1) runs its dy pack, its tiles and its result (the relayout to the
        caller's layout) inside each parallel task, so each part of dy and dX passes through
        memory once (a depthwise layer does 9 FMAs per element: the three whole-tensor passes
        of pack, mad and result were most of its time). An NXC result's task is a band of an
        image's rows with every channel block inside (:data:`BAND_BYTES`); an NCX one's is one
        image's block of 16 channels, a plane. Where there are too few bands or planes for the
        cores, or the planes are small (:data:`PLANE_MIN_PIXELS`), the tasks are the tiles' rows."""
        sch, plan = self.sch, self.plan
        *outer, n, c1, j, i, c0, q, mh, mw = sch.get_loops(block)
        rows, cols, taps = loop_extent(sch, j), loop_extent(sch, i), (loop_extent(sch, mh), loop_extent(sch, mw))
        th, tw, v = depthwise_dx_tile(rows, cols, *taps, plan)
        most = min(MAX_TILE_PIXELS, plan.accumulators // v)
        j_o, j_i = self.split(j, th, most)
        i_o, i_i = self.split(i, tw, most)
        lane_groups, c0 = self.split(c0, v * plan.lanes, C0)
        band = None if outer or not NXC_BANDS else self._image_band(block, n, c1, j_o, (rows, cols), taps, th)
        if band is not None:  # an NXC result: tasks of an image's band of rows, every channel block inside
            band_loop, j_o = sch.split(j_o, [None, band])
            sch.reorder(n, band_loop, c1, lane_groups, j_o, i_o, q, mh, mw, j_i, i_i, c0)
            self._in_tasks(block, sch.fuse(n, band_loop), [j_i, i_i], c0, q)
            return
        sch.reorder(n, c1, lane_groups, j_o, i_o, q, mh, mw, j_i, i_i, c0)  # a lane group's weights stay in registers
        planes = loop_extent(sch, n) * loop_extent(sch, c1)
        big = planes >= PLANES_PER_CORE * self.cores and rows * cols >= PLANE_MIN_PIXELS
        if not outer and big and self._writes_back_per_task(block, lambda probe: probe.fuse(n, c1)):
            self._in_tasks(block, sch.fuse(n, c1), [j_i, i_i], c0, q)
            return
        if not any(sch.get(lp).kind == tirx.ForKind.PARALLEL for lp in outer):  # (under a plane's task: phases_plane_by_plane)
            sch.parallel(sch.fuse(n, c1, lane_groups, j_o))
        self.register_tile(block, [j_i, i_i], c0, q)
        if not outer:
            self._write_back_per_tile(block, i_o)

    def _in_tasks(self, block, task, unrolled, lanes, first_reduce):
        """The mad's tiles under the parallel ``task``, its pack made there, each tile's sums written
        to the result as the tile ends (:meth:`_write_back_per_tile`; else the task's once its
        tiles are done)."""
        sch = self.sch
        sch.parallel(task)
        loops = sch.get_loops(block)
        tile = loops[loop_position(sch, loops, first_reduce) - 1]
        self.register_tile(block, unrolled, lanes, first_reduce)
        if not self._write_back_per_tile(block, tile):
            self.write_back_in(block, task)
        for pack in producers_named(self.sch, block, self.packs):
            self.pack_at(pack, task)
            pack_in_source_axes(self.sch, pack, task)

    def _write_back_per_tile(self, block, tile) -> bool:
        """The result stage moved under the mad's ``tile`` loop: each tile's sums, still in registers,
        relaid into the caller's layout as it ends, the stage's loops there unrolled and its innermost
        vectorized, instead of the task's sums written to memory and read back (Zen 4, 2 cores, N=32,
        fp32, ms, per task / per tile, one process, interleaved, inputs in cache: NXC forward 32
        channels on 56x56 0.68 / 0.46, 144 on 28x28 0.86 / 0.59, 960 on 4x4 0.111 / 0.080; NXC dX
        0.91 / 0.81 on 56x56, 0.105 / 0.077 on 4x4; NCX dX 1.59 / 0.92 on 56x56, 1.97 / 1.32 on 28x28,
        192 on 14x14 0.46 / 0.36. Flushed from the caches before each call: NXC forward 1.41 / 1.23,
        1.72 / 1.53, 576 on 7x7 0.46 / 0.38; NXC dX 1.53 / 1.38 on 56x56, 192 on 14x14 0.67 / 0.47, 144
        on 28x28 level (0.93-1.10x); NCX dX 2.12 / 1.86, 2.22 / 1.65, 192 on 14x14 level).
        AVX-512 only (:data:`TILE_WRITE_BACK_LANES`): AVX2's 16 registers hold the 9 weight vectors
        across a task's tiles of one or two pixels, and a write-back in the tile loop cost them
        (the same Zen 4, AVX2 code: NCX dX 192 on 14x14 1.21 / 2.32, 576 on 7x7 0.37 / 1.01, NXC
        576 on 7x7 0.20 / 0.36, though NCX 32 on 56x56 1.74 / 0.85); SSE's and NEON's 4-lane tiles
        spilled (``test_isa``). Tried on a copy first: False, unchanged, where TVM cannot bound the
        tile's part of the result."""
        consumer = self.write_back_stage(block)
        if consumer is None or not TILE_WRITE_BACK or self.plan.lanes < TILE_WRITE_BACK_LANES:
            return False
        for sch in (self.sch.copy(), self.sch):
            try:
                sch.reverse_compute_at(consumer, tile)
                loops = sch.get_loops(consumer)
                *rows, lanes = loops[loop_position(sch, loops, tile) + 1 :]
                for loop in rows:
                    sch.unroll(loop)
                sch.vectorize(lanes)
            except (s_tir.ScheduleError, ValueError):
                return False
        self.placed.add(self.sch.get(consumer).name_hint)
        return True

    def _image_band(self, block, n, c1, tile_rows, pixels, taps, th):
        """Tile rows per task where the result is NXC (channels innermost) and can be written per
        task: the most whose pack and result fit :data:`BAND_BYTES`, keeping :data:`PLANES_PER_CORE`
        tasks per core (None: no such band; the tasks are then planes or tiles' rows). Both are counted
        at the result's channels: a channel multiplier ``m`` makes the dy pack ``m`` times that, and
        counting it measured slower (Zen 4, N=32, 64 -> 256 channels on 28x28: whole images 2.26 ms,
        the 4-row bands that fit 3.05, each re-packing its 2 halo rows; 32 -> 128 on 56x56 5.49 / 5.73)."""
        sch = self.sch
        consumer = self.write_back_stage(block)
        if consumer is None or not channels_last_result(sch, consumer, sch.get(block).name_hint):
            return None
        (_, cols), images, tiles = pixels, loop_extent(sch, n), loop_extent(sch, tile_rows)
        row_bytes = loop_extent(sch, c1) * C0 * 4  # (fp32 sums and packs)
        bands = [d for d in divisors(tiles, tiles) if images * (tiles // d) >= PLANES_PER_CORE * self.cores]
        if not bands:
            return None
        fits = [d for d in bands if ((d * th + taps[0] - 1) * (cols + taps[1] - 1) + d * th * cols) * row_bytes <= BAND_BYTES]
        band = max(fits or [min(bands)])

        def band_task(probe):
            outer, _ = probe.split(tile_rows, [None, band])
            probe.reorder(n, outer, c1)
            return probe.fuse(n, outer)

        return band if self._writes_back_per_task(block, band_task) else None

    def _writes_back_per_task(self, block, task_of) -> bool:
        """Whether the result can be written inside the tasks ``task_of(probe)`` makes of a copy of
        the schedule (TVM cannot bound a partial last block's channels per plane task, nor a flat
        ``H*W`` result's rows per band)."""
        consumer = self.write_back_stage(block)
        if consumer is None:
            return False
        probe = self.sch.copy()
        try:
            probe.reverse_compute_at(consumer, task_of(probe))
        except (s_tir.ScheduleError, ValueError):
            return False
        return True


class DepthwiseForward(DepthwiseInputGrad):
    """The depthwise forward with the channels on the lanes (``conv_dw``,
    ``Formulation.DEPTHWISE_CHANNELS_FWD``): a one-phase dX's schedule, x's padded pack (``fmap_pad``)
    in place of dy's: plane by plane where there are enough planes, each task packing its plane of
    x, summing its tiles and writing its plane of the result."""

    packs = (FMAP_PAD,)


def phases_plane_by_plane(sch: s_tir.Schedule, cores: int) -> set[str]:
    """A strided depthwise dX plane by plane: each parallel task is one image's block of 16
    channels of the result, under which its dy plane is packed and every stride phase computes
    its part of the plane (:class:`DepthwiseInputGrad` tiles them without a parallel loop of
    their own), so the phases' outputs stay in the core's cache until the result interleaves
    them (MobileNetV2's 96-channel stride-2 layer on 56x56, N=32: the phases image by image,
    each a parallel loop, read and wrote 38 MB of phase outputs through memory).

    Where the result's channels are one loop (NCX or NXC) and there are :data:`PLANES_PER_CORE`
    planes per core; tried on a copy first (a partial last block of channels cannot be bounded
    per task). An NXC result's task takes several of an image's blocks, all where there are enough
    images (:func:`_nxc_group`; Zen 4, N=32, ms, one block / several: 192 channels 14x14 onto 7x7 0.54
    / 0.34, 576 on 7x7 onto 4x4 0.32 / 0.22). Returns the stages it placed (the dy pack, the
    result), none where it did not."""
    blocks = stage_blocks(sch)
    phases = [sch.get(b).name_hint for b in blocks if sch.get(b).name_hint.startswith(DX_DW)]
    if len(phases) < 2 or any(sch.get(b).name_hint.startswith(DX_PHASE_PREFIXES) and not sch.get(b).name_hint.startswith(DX_DW) for b in blocks):
        return set()
    consumers = {sch.get(c).name_hint for p in phases for c in sch.get_consumers(sch.get_sblock(p))}
    if len(consumers) != 1:
        return set()
    (result,) = consumers
    for group in dict.fromkeys((_nxc_group(sch, result, phases, cores), 1)):
        probe = sch.copy()
        try:
            if not _planes(probe, result, phases, cores, group):
                continue
        except (s_tir.ScheduleError, ValueError):
            continue
        _planes(sch, result, phases, cores, group)
        return {result, DY_DW}
    return set()


def _nxc_group(sch: s_tir.Schedule, result: str, phases: list[str], cores: int) -> int:
    """Channel blocks per task of an NXC result (:data:`NXC_BANDS`): the most, a divisor of the
    blocks, that keeps :data:`PLANES_PER_CORE` tasks per core, so each pixel's channels of a task
    are read and written as one run (1 for NCX). No byte budget: an image's every block in one task
    read fastest even where its dy pack and result outgrow L2 (Zen 4, ms, the most blocks that fit
    :data:`BAND_BYTES` / every block: N=32, 96 channels on 56x56 onto 28x28 3.26 / 2.26, 144 on 28x28
    0.89 / 0.62, 192 on 14x14 0.27 / 0.25; N=8, 32 channels on 224x224 (6.8 MB an image) 5.69 / 4.62)."""
    block = sch.get_sblock(result)
    if not NXC_BANDS or not channels_last_result(sch, block, phases[0]):
        return 1
    out = sch.get(sch.get_sblock(phases[0])).writes[0].source  # (N, C1, rows, cols, 16): one phase's sums
    images, count = int(out.shape[0]), int(out.shape[1])
    return most_blocks_a_task(count, images, PLANES_PER_CORE * cores)


def _planes(sch: s_tir.Schedule, result: str, phases: list[str], cores: int, group: int = 1) -> bool:
    """:func:`phases_plane_by_plane` on ``sch``, ``group`` channel blocks a task (False, unchanged,
    where it does not apply)."""
    block = sch.get_sblock(result)
    found = channel_block_task(sch, block, phases[0], PLANES_PER_CORE * cores, blocks=group)
    if found is None:
        return False
    task, _, _ = found
    for phase in phases:
        sch.compute_at(sch.get_sblock(phase), task)
        restore_unit_loops(sch, sch.get_sblock(phase))
    packs = {sch.get(p).name_hint for phase in phases for p in producers_named(sch, sch.get_sblock(phase), (DY_DW,))}
    for pack in packs:  # (none where the phases read dy in place, converting)
        pack_under(sch, sch.get_sblock(pack), task)
        pack_in_source_axes(sch, sch.get_sblock(pack), task)
    inner = sch.get_loops(block)[-1]
    if loop_extent(sch, inner) % 8 == 0:
        sch.vectorize(sch.split(inner, [None, 8])[1])
    return True
