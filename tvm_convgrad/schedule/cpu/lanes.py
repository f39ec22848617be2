"""The lanes hold what is plentiful instead of 3 channels padded to 16, or instead of the channels
of channel-planar (NCX) tensors, whose pixels lie contiguous.

* dW (:class:`CoutLanesFilterGrad`, ``dw_cc_t``): Cout on the lanes; a tile is taps x Cout
  vectors (:func:`.tiles.tap_tile`), or, a planar 1x1 with fewer outputs than inputs, input
  channels x Cout vectors (:func:`.tiles.channel_tile`).
* dX (:class:`PixelLanesInputGrad`, ``dx_px_<rh>_<rw>``): output columns on the lanes; a tile is
  rows x every input channel, or, over channel-planar tensors with 16 channels or more (a 1x1 on
  NCX), a GEMM tile of channels x consecutive pixels of an image's plane (:func:`.tiles.planar_tile`);
  the planar forward's ``conv_px`` (the same loops: image, output channel, rows, columns | input
  channel, taps) likewise.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ...dsl.compute.stages import FMAP_L1, GRADS_2_MATRIX, W_T
from ...layout import C0
from ..common import loop_extent
from .loops import CpuMad, producers_named, sum_parts, whole_tiles_and_edge
from .tiles import channel_tile, largest_divisor, planar_tile, tap_rows, tap_tile

__all__ = ["DY_BAND_BYTES", "PACKS_PER_BAND", "PLANAR_TASKS_PER_CORE", "CoutLanesFilterGrad", "PixelLanesInputGrad"]

PLANAR_TASKS_PER_CORE = 4
"""Tasks per core of a planar pixel-lane dX: an image's channels split in groups until there are this many."""

PLANAR_RESULT_BYTES = 256 << 10
"""... and until a task's sums (its channels' planes, written back in the task) are no larger than
this or than the image's dy, which every task of the image reads again (from L3): ResNet-50's 256
-> 64 1x1 on 56x56, N=8 (a 3.2 MB result per image from 800 KB of dy), Zen 4: one task per image
7.1 ms, four 5.6; 64 -> 256 (3.2 MB of dy, 800 KB of sums): one 6.0, four 7.7."""

DY_BAND_BYTES = 256 << 10
"""dy read by the Cout-on-lanes dW tiles per band of rows: within any x86 core's L2 beside the x rows."""

PACKS_PER_BAND = True
"""Where each core runs its own images, a float32 Cout-on-lanes dW packs dy (``grads_2_matrix``) and x
(``fmap_l1``) band by band inside the image's task, instead of the whole batch packed to memory
and read back: the packs stay in the core's cache, and no whole-batch workspace is taken from
malloc per call (a stem's dy pack is 25.7 MB, which a call faulted back in wherever glibc had
trimmed its heap). An Emerald Rapids (2 cores), 2026-12-02, the stems' dW against the whole-batch
packs: 3 -> 64 7x7 / 2 on 224x224 N=8 15.2 -> 13.1 ms (PyTorch's 14.7), on 112x112 N=32 11.3 ->
7.8 (11.0); 3 -> 32 3x3 / 2 on 112x112 N=32 2.28 -> 1.47 (1.90); 64x64 N=8 0.82 -> 0.77 (1.12)."""


class CoutLanesFilterGrad(CpuMad):
    """dW with Cout on the lanes (``dw_cc_t``)."""

    packs_per_band = PACKS_PER_BAND  # (see PACKS_PER_BAND)

    def schedule(self, block):
        """dW with Cout on the lanes (``dw_cc_t[c, kh, kw, co]``): a tile is ``kw_i`` taps x
        ``co1_i`` Cout vectors, or x a part of one vector's registers (:func:`.tiles.tap_tile`), of
        one ``(c, kh)`` -- or of several kernel rows where the cores take the images and the taps
        are few (:func:`.tiles.tap_rows`: a 3x3 stem's 3 x 3 taps x 2 zmm, 1.5 -> 1.3 ms on
        112x112, N=32) -- fed by one broadcast x value per tap and one dy vector per register,
        summing ``(ho, wo)`` in registers. The tasks walk the Cout parts outermost: consecutive
        tasks (and each core's share of them) read the same slice of dy.

        With a batch, each image is a separate partial dW (``rfactor`` over ``n``): the images
        run one after another, and the partials (``N`` small dWs: this layout is for few input
        channels) are summed after. An image's dy is read by every tile, so it is read in bands
        of rows (:data:`DY_BAND_BYTES`, the tiles' partial sums kept in the result between bands)
        that stay in cache while all the tiles read them: a stem's 112x112x64 dy is 3 MB.
        A 1x1 over 16 input channels or more (:meth:`_channel_tiles`) tiles input channels instead
        of taps.
        """
        if self._channel_tiles(block):
            return
        sch = self.sch
        c, kh, kw, co, n, ho, wo = sch.get_loops(block)
        row_bytes = loop_extent(sch, wo) * loop_extent(sch, co) * 4
        co1, co0 = sch.split(co, [None, 16])
        taps, vectors, registers = tap_tile(loop_extent(sch, kw), loop_extent(sch, co1), self.plan)
        # Several kernel rows per tile where each core runs whole images (else they would be fewer tasks for the cores to share)
        rows = tap_rows(loop_extent(sch, kh), taps, vectors * registers, self.plan) if self._images_parallel(n) and not self.tunable else 1
        kh_o, kh_i = sch.split(kh, [None, rows]) if rows > 1 else (kh, None)
        kw_o, kw_i = self.split(kw, taps, taps)
        co1_o, co1_i = self.split(co1, vectors, vectors)
        parts, co0 = sch.split(co0, [None, 16 * registers // self.plan.registers_per_row])
        tile = [kw_i, co1_i] if kh_i is None else [kh_i, kw_i, co1_i]
        self._in_bands(block, n, ho, wo, row_bytes, [parts, co1_o, c, kh_o, kw_o], tile, co0)

    def _images_parallel(self, n) -> bool:
        """Whether the cores take the images (a batch that splits evenly over them, :meth:`_in_bands`)."""
        images = loop_extent(self.sch, n)
        return images > 1 and images % self.cores == 0

    def _channel_tiles(self, block) -> bool:
        """A 1x1 over 16 input channels or more (NCX, :func:`~tvm_convgrad.dsl.compute.backprop_filter.planar_filter_lanes`):
        a tile is ``R`` input channels x ``V`` Cout vectors (:func:`.tiles.channel_tile`), per step
        ``(ho, wo)`` one broadcast x value per channel (its plane, read where it lies) and one dy
        load per vector; as the tap tiles, the images are partial dWs summed after and dy is read
        in bands of rows that all the tiles read from cache. False (nothing changed) otherwise."""
        sch, plan = self.sch, self.plan
        c, kh, kw, co, n, ho, wo = sch.get_loops(block)
        channels, couts = loop_extent(sch, c), loop_extent(sch, co)
        if loop_extent(sch, kh) * loop_extent(sch, kw) != 1 or channels < C0 or couts % plan.lanes:
            return False
        r, v = channel_tile(channels, couts // plan.lanes, plan)
        row_bytes = loop_extent(sch, wo) * couts * 4
        vectors, lanes = sch.split(co, [None, plan.lanes])
        co_o, co_i = sch.split(vectors, [None, v])
        c_o, c_i = sch.split(c, [None, r])
        self._in_bands(block, n, ho, wo, row_bytes, [co_o, c_o, kh, kw], [c_i, co_i], lanes)
        return True

    def _in_bands(self, block, n, ho, wo, row_bytes: int, tasks: list, tile: list, lanes):
        """The reduction of either tile: dy read in bands of rows (:data:`DY_BAND_BYTES`; ``row_bytes``
        a row of dy), the tiles' partial sums kept in the result between bands; with a batch, each
        image a partial dW (``rfactor`` over ``n``) summed after. The images are the parallel loop
        where they split evenly over the cores, each core running every task of an image on its
        bands (one parallel region, the dy band in that core's L2: MobileNetV2's stem dW, 3 -> 32
        3x3 stride 2 on 112x112, N=32, 2.1 -> 1.5 ms, its nine tasks had been a parallel region
        per image and band, five on one core and four on the other); else the ``tasks`` (inside
        the images and bands), and the packs of x and dy are made band by band in the image's task
        (:data:`PACKS_PER_BAND`). ``tile`` becomes the unrolled loops above the vectorized ``lanes``."""
        sch = self.sch
        band = largest_divisor(loop_extent(sch, ho), DY_BAND_BYTES // row_bytes)
        bands = [] if band == loop_extent(sch, ho) else list(sch.split(ho, [None, band]))
        rows = bands or [ho]  # (band, rows of a band), or the rows
        batched = loop_extent(sch, n) > 1
        images = self._images_parallel(n)  # each core its own images, every task of each
        if batched:
            sch.reorder(n, *rows[:-1], *tasks, rows[-1], wo, *tile, lanes)
            mad = sch.rfactor(n, 0)
            loops = sch.get_loops(mad)  # n, the bands, the tasks, a band's rows, wo, the tile, the lanes
            outer = len(rows)  # (n and the bands)
            rows = [*loops[1:outer], loops[outer + len(tasks)]]
            tasks, tile, lanes = loops[outer : outer + len(tasks)], loops[-1 - len(tile) : -1], loops[-1]
        else:
            sch.reorder(*rows[:-1], *tasks, n, rows[-1], wo, *tile, lanes)
            mad = block
        sch.parallel(loops[0] if images else sch.fuse(*tasks))
        self.register_tile(mad, tile, lanes, rows[0] if batched or bands else n)  # the outermost reduction loop
        if images and self.packs_per_band and not self.tunable:  # (a band's packs in the image's task)
            for pack in producers_named(sch, mad, (GRADS_2_MATRIX, FMAP_L1)):
                self.pack_at(pack, rows[0] if bands else loops[0])
        if batched:
            sum_parts(sch, block)


class PixelLanesInputGrad(CpuMad):
    """One stride phase of dX with output columns on the lanes (``dx_px_<rh>_<rw>``)."""

    write_back_in_task = True  # (the planar tiles' tasks: an image's channel group, every row)

    def schedule(self, block):
        """dX with output columns on the lanes (``dx_px``): a tile is 16 columns (fewer where a
        row of every channel would not fit the registers) x ``j_i`` rows x every input channel;
        per ``(co, mh, mw)`` one dy vector per row, used at once by every channel's broadcast
        weight (so one dy vector is live at a time, the channels' weights for the whole tile)."""
        if self._planar_tiles(block):
            return
        sch, plan = self.sch, self.plan
        *_, n, ci, j, i, co, mh, mw = sch.get_loops(block)
        width, channels = loop_extent(sch, i), loop_extent(sch, ci)
        room = max(1, plan.accumulators - channels + 1)  # each channel's weight stays live
        vectors = largest_divisor(plan.registers_per_row, room // channels)
        columns = vectors * plan.lanes
        i_o, i_i = sch.split(i, [None, columns]) if width > columns else (None, i)
        budget = max(1, room // (channels * vectors))
        rows = largest_divisor(loop_extent(sch, j), budget)
        j_o, j_i = self.split(j, rows, budget)
        outer = [n, j_o] + ([i_o] if i_o is not None else [])
        sch.reorder(*outer, co, mh, mw, j_i, ci, i_i)
        sch.parallel(sch.fuse(*outer))
        sch.unroll(ci)
        sch.unroll(j_i)
        if width <= columns or width % columns == 0:  # a ragged last vector stays scalar
            sch.vectorize(i_i)
        sch.decompose_reduction(block, co)

    def _planar_tiles(self, block) -> bool:
        """A 1x1 over NCX tensors with 16 channels or more (:func:`~tvm_convgrad.dsl.compute.backprop_input.planar_pixel_lanes`,
        or the planar forward's ``conv_px``): an image's pixels one axis ``p = j*cols + i``, a tile ``R`` channels x ``V`` vectors of
        consecutive pixels (:func:`.tiles.planar_tile`; the plane's last pixels one narrower tile),
        per ``co`` one dy load per vector (its plane, read where it lies) and one broadcast weight
        per channel, the tile's ``R`` weights of consecutive steps adjacent (:meth:`_weights_by_tile`).
        The tasks are an image's channels in groups (as few as give
        :data:`PLANAR_TASKS_PER_CORE` tasks a core), each task's result rows written back in it;
        inside, each pixel tile's dy stays in cache while the group's channel tiles read it.
        Its sizes are no tuning samples (a tunable schedule gets the same tiles, its result a pass
        of its own). False (nothing changed) for fewer than 16 channels (the every-channel tile)
        or a plane that is not whole vectors."""
        sch, plan = self.sch, self.plan
        loops = sch.get_loops(block)
        if self.under_task(block) or len(loops) != 7:  # (n, ci, j, i | co, mh, mw), not under an image's loop (tunable too: no samples)
            return False
        n, ci, j, i, co, mh, mw = loops
        images, channels, rows, cols, douts = (loop_extent(sch, lp) for lp in (n, ci, j, i, co))
        pixels = rows * cols
        if channels < C0 or pixels % plan.lanes:  # (few channels: the every-channel tile)
            return False
        try:
            sch.transform_block_layout(block, tirx.IndexMap.from_func(lambda n, ci, j, i, co, mh, mw: (n, ci, j * cols + i, co, mh, mw), ndim=7))
        except s_tir.ScheduleError:
            return False
        r, v = planar_tile(channels, pixels, plan)
        self._weights_by_tile(block, r)
        tiles = channels // r
        result_bytes, dy_bytes = channels * pixels * 4, douts * pixels * 4  # an image's fp32 sums, its dy

        def enough(d: int) -> bool:
            return images * d >= PLANAR_TASKS_PER_CORE * self.cores and result_bytes // d <= max(PLANAR_RESULT_BYTES, dy_bytes)

        groups = min([d for d in range(1, tiles + 1) if tiles % d == 0 and enough(d)] or [tiles])
        n, ci, p, co, mh, mw = sch.get_loops(block)
        group, ci = sch.split(ci, [groups, None])
        ci_o, ci_i = sch.split(ci, [None, r])
        p, lanes = sch.split(p, [None, plan.lanes])
        sch.reorder(n, group, p, ci_o, co, mh, mw, ci_i, lanes)
        task = sch.fuse(n, group)
        sch.parallel(task)
        self.write_back_in(block, task)
        if pixels // plan.lanes % v == 0:
            p_tiles, vectors = sch.split(p, [None, v])
            copies = [(block, [p_tiles], vectors, [ci_o, co, mh, mw, ci_i, lanes])]
        else:  # (the plane's last vectors one narrower tile)
            copies = list(whole_tiles_and_edge(sch, p, pixels // plan.lanes, v))
        for copy, p_tiles, vectors, (ci_o, co, mh, mw, ci_i, lanes) in copies:
            sch.reorder(*p_tiles, ci_o, co, mh, mw, ci_i, vectors, lanes)
            self.register_tile(copy, [ci_i, vectors], lanes, co)
        return True

    def _weights_by_tile(self, block, r: int):
        """The weight pack ``w_t[step, channel, ...]`` (dX: ``(Cout, Cin, KH, KW)``, the forward:
        ``(Cin, Cout)``) laid out ``[channel // r, step, ..., channel % r]``: a tile's ``r``
        broadcasts of every reduction step in one run, the 4-16 KB a tile reads while its dy stays
        in L1, where one row per step put each step's ``r`` weights on a line of its own (a whole
        row of channels apart). ResNet-50's 1x1 dX on 28x28, N=8, Zen 3: 512 -> 256 1.12x, 128 ->
        512 1.27x, 512 -> 128 1.10x."""
        for pack in producers_named(self.sch, block, [W_T]):
            self.sch.transform_layout(pack, ("write", 0), lambda step, channel, *taps: (channel // r, step, *taps, channel % r))
