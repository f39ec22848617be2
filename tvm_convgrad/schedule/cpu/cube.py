"""The cube on the CPU: 16x16 blocks of fp32 accumulators in vector registers, fed by broadcast FMAs.

* dW: :mod:`.cube_dw` (the same tiles, ``R`` Cout rows x 16 Cin lanes).
* dX (:class:`CubeInputGrad`, ``dx_cc_<rh>_<rw>``, one per stride phase): a tile is ``TH x TW``
  output pixels of one 16-channel block (:func:`.tiles.dx_tile`; of several where its loads
  would outrun its FMAs, :func:`.tiles.block_tile`), the reduction ``(co1, taps, co0)`` inside,
  each step one w_col row per block times ``TH*TW`` broadcast dy values. The
  channel blocks are taken in groups whose weights fit a core's cache, the pixels streaming past
  once per group. Where a row would need a narrower edge tile (7 columns on AVX2: 5 + 2), an
  image's pixels are one axis and the tiles run on across its rows.
* the forward convolution (:class:`CubeForward`, ``conv_cc``): the same GEMM as a dX phase (pixel
  tiles x 16 output channels, the reduction ``(ci1, kh, kw, ci0)`` inside), its x read at
  ``j*stride + tap*dilation``: the broadcast operand, so a stride costs no vector shuffle.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ...dsl.compute.stages import FMAP_PAD, W_COL, W_CONV
from ...isa import IsaPlan
from ...layout import C0, ceil_div
from ..common import buffer_bytes, loop_extent, nbytes
from .loops import CpuMad, reads_of, whole_tiles_and_edge
from .prefetch import prefetch_stream, read_in_place
from .tiles import ALIASED_TILE_PIXELS, L1_SET_STRIDE, MAX_TILE_PIXELS, block_tile, divisors, dx_tile, flat_block_tile, largest_divisor

__all__ = ["BLOCK_TILES_MIN_REDUCTION", "FLAT_TASKS_PER_CORE", "PACK_X_PER_BAND", "WEIGHTS_IN_CACHE", "X_BAND_IN_CACHE",
           "X_CHUNK_IN_CACHE", "CubeForward", "CubeInputGrad", "weights_in_cache"]

WEIGHTS_IN_CACHE = 512 * 1024  # bytes of w_col kept in a core's L2 while dX walks the pixels
PACK_X_PER_BAND = True  # the forward's x packed per band of output rows, in the band's task (:meth:`CubeForward._band_tasks`)
X_BAND_IN_CACHE = 256 * 1024  # bytes of packed x per band
X_CHUNK_IN_CACHE = 256 * 1024  # bytes of a strided forward's x per image and group weights per reduction chunk (:meth:`CubeForward._reduction_chunks`)
BLOCK_TILES_MIN_REDUCTION = 4  # fewest reduction channel blocks of a tile over several result blocks (_blocks_per_tile)
IMAGE_BLOCK_TILES = True  # tiles across the images take several result blocks too (:meth:`CubeInputGrad._image_tiles`)
FLAT_TASKS_PER_CORE = 4  # flat pixel tiles (one image per task) where there are this many tasks per core


def weights_in_cache(plan: IsaPlan, taps: int) -> int:
    """Bytes of w_col a group of result channel blocks keeps in a core's cache while the pixels
    stream past (:meth:`CubeInputGrad.schedule`, the dX and the forward): :data:`WEIGHTS_IN_CACHE`,
    and for a mad of several ``taps`` half the core's L2 (:attr:`~tvm_convgrad.isa.IsaPlan.l2_bytes`)
    where that is more. On a 2 MB L2, 512 x 512 3x3 weights (295 KB a result block) then come two
    blocks a group, and a tile takes both (:func:`.tiles.block_tile`), not one. The Sapphire
    Rapids-class guest (2 cores, 2 MB of L2), dX ms at N=8, half the L2 against 512 KB: 512 on
    14x14 at stride 2 8.4-8.5 / 9.8-9.9, 512 on 7x7 6.8 / 7.0-7.2, 256 on 28x28 at stride 2 7.1 /
    7.4, 32 x 256 on 7x7 channels-last 7.4 / 7.7; their forwards level. A 1x1 keeps 512 KB:
    1024 -> 512 on 14x14 7.6 / 7.5, 2048 -> 512 on 7x7 channels-last 3.4 / 3.1."""
    return max(WEIGHTS_IN_CACHE, plan.l2_bytes // 2) if taps > 1 else WEIGHTS_IN_CACHE


class CubeInputGrad(CpuMad):
    """One stride phase of dX on the cube (``dx_cc_<rh>_<rw>``)."""

    edge_tiles = True  # columns in tiles of TW and a narrower edge tile (else TW divides them)
    weights = W_COL  # the pack of the weights (the vector operand)
    images_first_by_traffic = False  # the images outside the channel-block groups where that moves fewer bytes
    write_back_in_task = True  # the result stage computed inside the mad's parallel task (one mad, one consumer)
    block_tiles = True  # a tile takes several result channel blocks (:meth:`_blocks_per_tile`)
    flat_pixels = True  # where a row needs an edge tile: an image's pixels one axis, tiled across rows (:meth:`_flat_pixel_tiles`)

    def schedule(self, block):
        """dX phase: pixel tiles ``(j_i x i_i)`` x 16 lanes (or a part of them, :func:`dx_tile`;
        a tile x several channel blocks, :meth:`_blocks_per_tile`), reduction ``[co1, mh,
        mw, co0]`` inside.

        The channel blocks ``c1`` are taken in groups whose w_col fits a core's cache
        (:func:`weights_in_cache`): a group's weights stay in cache while the pixels stream past, once
        per group (all of them in one group when the weights fit, one block per group when a
        single block's panel is that large).
        """
        sch = self.sch
        if not self.tunable and self._batch_tiles(block):
            return
        weight_bytes = buffer_bytes(sch, self.weights)
        *_, n, c1, j, i, c0, co1, mh, mw, co0 = sch.get_loops(block)
        blocks, rows, cols = loop_extent(sch, c1), loop_extent(sch, j), loop_extent(sch, i)
        budget = weights_in_cache(self.plan, loop_extent(sch, mh) * loop_extent(sch, mw))
        group = largest_divisor(blocks, budget // max(1, weight_bytes // blocks))
        th, tw, v = dx_tile(rows, cols, self.plan, whole=not self.edge_tiles, max_pixels=self._max_tile_pixels(block))
        under = self.under_task(block)
        if not self.tunable and not under and self._image_tiles(block, group):
            return
        flat = self.flat_pixels and cols % tw and not self.tunable and not under and blocks // group * loop_extent(sch, n) >= FLAT_TASKS_PER_CORE * self.cores
        if flat and self._flat_pixel_tiles(block, group, weight_bytes):
            return
        outer, c1_i = self._channel_groups(block, n, c1, group, weight_bytes)
        most = min(MAX_TILE_PIXELS, self.plan.accumulators // v)
        j_o, j_i = self.split(j, th, most)
        lane_groups, c0 = sch.split(c0, [None, v * self.plan.lanes])
        reduction = [co1, mh, mw, co0]
        task, inside, packs = self._band_tasks(block, n, outer, j_o, th, under)
        if cols % tw == 0 or self.tunable:
            i_o, i_i = self.split(i, tw, most)
            b = self._blocks_per_tile(th * tw, v, loop_extent(sch, c1_i), [loop_extent(sch, lp) for lp in reduction])
            c1_i, c1_b = self.split_blocks(c1_i, b)  # (a tile's blocks innermost: one broadcast register feeds them all)
            sch.reorder(*task, *inside, i_o, c1_i, lane_groups, *reduction, j_i, i_i, *c1_b, c0)
            self._tasks(block, sch.fuse(*task), under, packs)  # (first: a tensorized tile's block is replaced)
            self._prefetch(block, i_o, th)  # (likewise before the tile)
            self.register_tile(block, [j_i, i_i, *c1_b], c0, co1)
            return
        # The columns in tiles of TW and one narrower tile at the end: two copies of the mad.
        sch.reorder(*task, *inside, i, c1_i, lane_groups, *reduction, j_i, c0)
        self._tasks(block, sch.fuse(*task), under, packs)
        for copy, tiles, i_i, below in whole_tiles_and_edge(sch, i, cols, tw):
            c1_i, lane_groups, co1, mh, mw, co0, j_i, c0 = below
            sch.reorder(*tiles, c1_i, lane_groups, co1, mh, mw, co0, j_i, i_i, c0)
            if tiles:
                self._prefetch(copy, tiles[-1], th)
            self.register_tile(copy, [j_i, i_i], c0, co1)

    def _blocks_per_tile(self, pixels: int, v: int, blocks: int, reduction: list[int]) -> int:
        """Result channel blocks per tile of ``pixels x v`` registers (:func:`.tiles.block_tile`,
        of the ``blocks`` a task's group has) where :meth:`_block_tiles_apply` (``reduction``:
        the extents of the mad's ``[co1, mh, mw, co0]``); else 1."""
        return block_tile(pixels, v, blocks, self.plan) if self._block_tiles_apply(reduction) else 1

    def _block_tiles_apply(self, reduction: list[int]) -> bool:
        """Whether a tile may take several result blocks (:meth:`_blocks_per_tile`): a mad
        (``reduction``: its ``[co1, mh, mw, co0]`` extents) over at least
        :data:`BLOCK_TILES_MIN_REDUCTION` channel blocks, not tuned; any taps. The Sapphire
        Rapids-class guest (2 cores), dX ms NCHW / channels-last, several blocks a tile against
        one: ResNet-50's stride-2 3x3 of 256 on 28x28 (phases 14x14), N=8, 7.2 / 7.1 against
        8.4 / 8.2, 128 on 56x56 7.5 / 7.1 against 8.6 / 8.1; 512 on 14x14 level (7x7 phases);
        stride 1 (the cube's): 32 x 128 on 28x28 26.3 / 25.9 against 30.1 / 29.7, 8 x 64 on
        56x56 7.6 against 8.5, 32 x 256 on 7x7 channels-last 7.7 against 8.4, 8 x 256 on 14x14
        7.3 / 6.8 against 7.4 / 7.2, 8 x 512 on 7x7 level. The 1x1 dX of MobileNetV2's 24 -> 96
        on 56x56 (2 blocks of reduction, its tiles' stores as many as its loads) ran 0.8x."""
        steps, _, _, lanes = reduction  # (co1 x co0: whole blocks x 16 lanes, or runs of a Cout not whole blocks)
        return self.block_tiles and not self.tunable and ceil_div(steps * lanes, C0) >= BLOCK_TILES_MIN_REDUCTION

    def _band_tasks(self, block, n, outer: list, j_o, th: int, under: bool) -> tuple[list, list, list]:
        """``(the task's loops, the loops inside a task above its tiles, the packs made per
        task)`` (``j_o``: the tiles' rows, ``th`` pixel rows each): here the image and
        channel-group loops ``outer`` and the tile rows ``j_o`` make the tasks, and dX's packs
        stay stages of their own (the forward's row bands: :meth:`CubeForward._band_tasks`)."""
        return [*outer, j_o], [], []

    def _tasks(self, block, task, under: bool, packs: list = ()):
        """``task`` made the mad's parallel loop, the result written back in it where it can be,
        the ``packs`` made in it; left serial where the mad already runs ``under`` a task of its
        result's."""
        if not under:
            self.sch.parallel(task)
            self.write_back_in(block, task)
            for pack in packs:
                self.pack_at(pack, task)

    def _max_tile_pixels(self, block) -> int:
        """:data:`.tiles.ALIASED_TILE_PIXELS` where the broadcast operand (the mad's read other than
        its weights) is a framework activation read in place whose pixel rows lie a multiple of
        :data:`.tiles.L1_SET_STRIDE` apart, else :data:`.tiles.MAX_TILE_PIXELS`."""
        for read in self.sch.get(block).reads:
            buf = read.source
            if buf.name != self.weights and int(buf.shape[-1]) != C0:  # (packed: 16-lane rows, 64 bytes apart)
                if int(buf.shape[-1]) * tvm.DataType(buf.dtype).bits // 8 % L1_SET_STRIDE == 0:
                    return ALIASED_TILE_PIXELS
        return MAX_TILE_PIXELS

    def _channel_groups(self, block, n, c1, group: int, weight_bytes: int):
        """``([outer two loops], c1_i)``: the channel blocks split into groups of ``group``; the
        group loop and the image loop ``n`` are the outer two, the groups outside unless the
        images outside read fewer bytes (:meth:`_images_first`); they make the parallel tasks."""
        sch = self.sch
        blocks = loop_extent(sch, c1)
        c1_o, c1_i = self.split(c1, group, blocks)
        if self.images_first_by_traffic and not self.tunable and self._images_first(block, weight_bytes, blocks // group, loop_extent(sch, n)):
            return [n, c1_o], c1_i
        return [c1_o, n], c1_i

    def _flat_pixel_tiles(self, block, group: int, weight_bytes: int):
        """Each task one image (of a channel-block group), its ``rows x cols`` pixels one axis
        (the block's ``(j, i)`` made one iterator ``p = j*cols + i``), tiled by :func:`dx_tile`
        across the rows (a brgemm's M): on a short row (7 columns) a row tile and its narrow edge
        tile leave the FMA pipes half idle; here only an image's last tile is narrower. A tile's
        pixels' x offsets are invariant in the reduction, so its hot loop is a row tile's. False
        (nothing changed) where the block's iterators cannot take the new layout."""
        sch = self.sch
        spatial = len(sch.get(block).iter_vars) - 4  # (..., n, c1, j, i, c0 | co1, mh, mw, co0)
        *_, j, i, _, _, _, _, _ = loops = sch.get_loops(block)
        bound = sch.get(loops[-1]).body.iter_values  # (the block's iterators, each bound to its own loop)
        if not (bound[spatial - 3].same_as(sch.get(j).loop_var) and bound[spatial - 2].same_as(sch.get(i).loop_var)):
            return False
        cols = loop_extent(sch, i)
        try:  # (a phase under an image's loop, :func:`.loops.phases_image_by_image`, is bound to it: no new layout; before any change)
            sch.transform_block_layout(block, tirx.IndexMap.from_func(
                lambda *v: (*v[: spatial - 3], v[spatial - 3] * cols + v[spatial - 2], *v[spatial - 1 :]), ndim=spatial + 4))
        except s_tir.ScheduleError:
            return False
        *_, n, c1, p, c0, co1, mh, mw, co0 = sch.get_loops(block)
        images, pixels, group_weight_bytes = loop_extent(sch, n), loop_extent(sch, p), weight_bytes * group // loop_extent(sch, c1)
        outer, c1_i = self._channel_groups(block, n, c1, group, weight_bytes)
        most = self._max_tile_pixels(block)
        _, tw, v = dx_tile(1, pixels, self.plan, whole=False, max_pixels=most)
        b = 1
        if v == self.plan.registers_per_row and self._block_tiles_apply([loop_extent(sch, lp) for lp in (co1, mh, mw, co0)]):
            tw, b = flat_block_tile(pixels, v, loop_extent(sch, c1_i), self.plan, most)
        c1_i, c1_b = self.split_blocks(c1_i, b)
        lane_groups, c0 = sch.split(c0, [None, v * self.plan.lanes])
        sch.reorder(*outer, p, c1_i, *c1_b, lane_groups, co1, mh, mw, co0, c0)
        task = sch.fuse(*outer)
        sch.parallel(task)
        self.write_back_in(block, task)  # (a task's pixels are whole images: its dst region is a box)
        chunks = self._reduction_chunks(block, loop_extent(sch, co1), images, group_weight_bytes)
        for copy, tiles, p_i, below in whole_tiles_and_edge(sch, p, pixels, tw):
            c1_i, *c1_b, lane_groups, co1, mh, mw, co0, c0 = below
            chunk = []
            if chunks > 1 and tiles:  # (the edge: one tile, its whole reduction in registers)
                *chunk, co1 = sch.split(co1, [chunks, None])
            sch.reorder(*chunk, *tiles, c1_i, lane_groups, co1, mh, mw, co0, p_i, *c1_b, c0)
            if tiles and chunks == 1:
                self._prefetch(copy, tiles[-1], 1)
            self.register_tile(copy, [p_i, *c1_b], c0, (chunk or [co1])[0])
        return True

    def _blocks_across(self, pixels: int, tw: int, v: int, blocks: int, reduction: list, most: int) -> tuple[int, int]:
        """``(TW, B)`` of a tile across a batch's images (:meth:`_image_tiles`, :meth:`_batch_tiles`):
        ``tw`` pixels x ``v`` registers of one block, or several of the ``blocks`` result blocks
        where :meth:`_block_tiles_apply` (``reduction``: the mad's ``[co1, mh, mw, co0]`` loops)
        and a register holds a block's row (:func:`.tiles.flat_block_tile`, the tiles dividing the
        ``pixels``)."""
        extents = [loop_extent(self.sch, lp) for lp in reduction]
        if IMAGE_BLOCK_TILES and v == self.plan.registers_per_row and self._block_tiles_apply(extents):
            return flat_block_tile(pixels, v, blocks, self.plan, most, whole=True)
        return tw, 1

    def _batch_tiles(self, block) -> bool:
        """A mad under a task of channel blocks over the whole batch (a live-tap region's, its
        pixels one iterator ``p = (n*rows + j)*cols + i``: :func:`.regions.regions_one_by_one`),
        tiled across the images and the task's blocks as :meth:`_image_tiles` tiles (tiles that
        divide the pixels). False (nothing changed) for any other mad."""
        sch = self.sch
        stmt = sch.get(block)
        flat = len(stmt.iter_vars) == 7 and len(stmt.writes[0].source.shape) == 3  # (its sums re-laid (C1, N*rows*cols, 16))
        if not flat or not self.under_task(block):
            return False
        *_, c1, p, c0, co1, mh, mw, co0 = sch.get_loops(block)
        pixels, most = loop_extent(sch, p), self._max_tile_pixels(block)
        _, tw, v = dx_tile(1, pixels, self.plan, whole=True, max_pixels=most)
        tw, b = self._blocks_across(pixels, tw, v, loop_extent(sch, c1), [co1, mh, mw, co0], most)
        c1_i, c1_b = self.split_blocks(c1, b)
        p_o, p_i = sch.split(p, [None, tw])
        lane_groups, c0 = sch.split(c0, [None, v * self.plan.lanes])
        sch.reorder(c1_i, p_o, lane_groups, co1, mh, mw, co0, p_i, *c1_b, c0)
        self.register_tile(block, [p_i, *c1_b], c0, co1)
        return True

    def _prefetch(self, block, tile_loop, tile_rows: int):
        """The tiles of ``tile_loop`` made to prefetch the broadcast operand ahead of them
        (:mod:`.prefetch`) where it is a framework tensor read in place (a parameter of the
        function: a stream from memory) and a tile's part of it is contiguous (one pixel row)."""
        streamed = [name for name in read_in_place(self.sch, block) if name != self.weights]
        if streamed and tile_rows == 1:
            prefetch_stream(self.sch, tile_loop, streamed[0])

    def _image_tiles(self, block, group: int) -> bool:
        """Images smaller than a tile (a 1x1 map: ResNet's last layers on 32x32 images, whose tile
        would be one pixel, one accumulator waiting on its own FMA chain): the images' pixels one
        axis ``p = (n*rows + j)*cols + i``, tiled by :func:`dx_tile` across the images (a tile
        divides them), the tasks channel-block groups x pixel tiles. On AVX-512 a tile takes
        several of its group's result blocks where :meth:`_block_tiles_apply` (as a flat task's,
        :func:`.tiles.flat_block_tile`, its pixels dividing the batch's): the border regions of
        a 3x3 on 7x7 maps (a row of 7 pixels, N=8: 14 x 2 blocks, not 14 x 1). The Sapphire
        Rapids-class guest, dX ms, N=8 unless named, several blocks / one: 512 on 7x7 7.3-7.4 /
        7.7-7.9 (channels-last 7.0-8.5 / 7.6-9.0), N=4 4.1 / 4.3-4.4; 32 x 512 on 4x4 10.5-10.7 /
        11.5-11.6; 256 on 7x7 channels-last 1.6 / 1.7-1.8, on 4x4 0.58-0.59 / 0.61-0.66; 512 on
        2x2 and the forwards level. False (nothing changed) where the batch is too small for a
        tile of two images, or the block's iterators cannot take the layout."""
        sch = self.sch
        if len(sch.get(block).iter_vars) != 9:  # (n, c1, j, i, c0 | co1, mh, mw, co0): 2-D, one image axis
            return False
        n, c1, j, i, *_ = sch.get_loops(block)
        images, rows, cols = loop_extent(sch, n), loop_extent(sch, j), loop_extent(sch, i)
        pixels, most = images * rows * cols, self._max_tile_pixels(block)
        _, tw, v = dx_tile(1, pixels, self.plan, whole=True, max_pixels=most)
        if tw < 2 * rows * cols:
            return False
        try:
            sch.transform_block_layout(block, tirx.IndexMap.from_func(lambda n, c1, j, i, *rest: (c1, (n * rows + j) * cols + i, *rest), ndim=9))
        except s_tir.ScheduleError:
            return False
        c1, p, c0, co1, mh, mw, co0 = sch.get_loops(block)
        c1_o, c1_i = self.split(c1, group, loop_extent(sch, c1))
        tw, b = self._blocks_across(pixels, tw, v, group, [co1, mh, mw, co0], most)
        c1_i, c1_b = self.split_blocks(c1_i, b)
        p_o, p_i = sch.split(p, [None, tw])
        lane_groups, c0 = sch.split(c0, [None, v * self.plan.lanes])
        sch.reorder(c1_o, p_o, c1_i, lane_groups, co1, mh, mw, co0, p_i, *c1_b, c0)
        task = sch.fuse(c1_o, p_o)
        sch.parallel(task)
        self.write_back_in(block, task)
        self.register_tile(block, [p_i, *c1_b], c0, co1)
        return True

    def _reduction_chunks(self, block, blocks: int, images: int, group_weight_bytes: int) -> int:
        """In how many chunks of its ``blocks`` reduction channel blocks (runs of channels where the
        mad sums real channels only, :func:`~tvm_convgrad.dsl.compute.common.real_channel_run`) a
        flat task walks the reduction, each chunk over all the task's tiles (their sums kept in
        memory between chunks): 1, the whole reduction per tile in registers."""
        return 1

    def _images_first(self, block, weight_bytes: int, groups: int, images: int) -> bool:
        """Whether walking the images outside the channel-block groups reads fewer bytes: every
        group streams all of the input past its weights (``groups x input``), every image all the
        weights past its input (``images x weights``, its input staying in cache)."""
        reads = [r.source for r in self.sch.get(block).reads]
        input_bytes = nbytes(*reads) - weight_bytes
        return groups > 1 and images > 1 and images * weight_bytes < groups * input_bytes


class CubeForward(CubeInputGrad):
    """The forward convolution on the cube (``conv_cc``): a dX phase's schedule over its
    ``(n, co1, ho, wo, co0)`` outputs and ``(ci1, kh, kw, ci0)`` reduction; the images outside the
    weight groups where the input is the larger stream (a strided layer's)."""

    weights = W_CONV
    images_first_by_traffic = True

    def _band_tasks(self, block, n, outer: list, j_o, th: int, under: bool) -> tuple[list, list, list]:
        """Where a 2-D forward packs x (padding, stride phases) and walks the images outside its
        channel groups (or has one group): each task a band of an image's output rows, every
        group inside it, and the x the band's windows read packed in the task (``fmap_pad``
        computed at the task, into a buffer of one band: written to and read from the core's
        cache, instead of the whole batch's x packed in a pass of its own and read back from
        memory; ResNet-50's 3x3 stride-2 res3a_branch2b, N=8, Zen 4: 11.5 -> 10.2 ms, the 7x7
        stem 11.7 -> 10.2). The bands: the most tile rows whose x fits :data:`X_BAND_IN_CACHE`
        while the tasks stay at least four per core (rows a band's windows share with the next
        band's are packed by both)."""
        sch = self.sch
        images_outside = loop_extent(sch, outer[0]) == 1 or sch.get(outer[0]).same_as(sch.get(n))
        packs = [p for p in sch.get_producers(block) if sch.get(p).name_hint == FMAP_PAD]
        if not PACK_X_PER_BAND or self.tunable or under or not images_outside or not packs or reads_of(sch, FMAP_PAD) != {sch.get(block).name_hint}:
            return super()._band_tasks(block, n, outer, j_o, th, under)  # (the last: the mad the one block that reads x's pack)
        (x,) = [r.source for r in sch.get(block).reads if r.source.name == FMAP_PAD]
        if len(x.shape) != 7:  # (3-D: a plane's windows read several planes, each packed again by every plane's band)
            return super()._band_tasks(block, n, outer, j_o, th, under)
        images, tile_rows, phase_rows = loop_extent(sch, n), loop_extent(sch, j_o), int(x.shape[4])
        image_bytes = nbytes(x) // images
        halo = phase_rows - tile_rows * th  # the rows of each stride phase past a band's own (the taps' reach)

        def band_bytes(band: int) -> int:
            return image_bytes * (band * th + halo) // phase_rows

        fits = [b for b in divisors(tile_rows, tile_rows) if band_bytes(b) <= X_BAND_IN_CACHE and images * tile_rows // b >= 4 * self.cores]
        bands, band_rows = sch.split(j_o, [None, max(fits, default=1)])
        groups = [lp for lp in outer if not sch.get(lp).same_as(sch.get(n))]
        return [n, bands], [*groups, band_rows], packs

    def _reduction_chunks(self, block, blocks: int, images: int, group_weight_bytes: int) -> int:
        """A strided forward reads each image's x by stride phase, four planes (2x2) whose
        whole input-channel range a tile sweeps: an image's x outgrows the core's cache, and
        each tile read its x from L3. In chunks of input-channel blocks whose x per image and
        weights of the task's channel group fit :data:`X_CHUNK_IN_CACHE` together, every tile of
        the task runs on a chunk before the next (the stride-2 3x3 layers of ResNet-50, N=8:
        res3a_branch2b 21-23 -> 17-20 ms); a stride-1 forward's x is read by nine taps per load
        and keeps the whole reduction per tile."""
        sch = self.sch
        (x,) = [r.source for r in sch.get(block).reads if r.source.name == FMAP_PAD] or [None]
        if x is None or len(x.shape) != 7 or int(x.shape[2]) * int(x.shape[3]) == 1:
            return 1
        working = nbytes(x) // max(1, images) + group_weight_bytes
        return min(d for d in range(1, blocks + 1) if blocks % d == 0 and (working // d <= X_CHUNK_IN_CACHE or d == blocks))

