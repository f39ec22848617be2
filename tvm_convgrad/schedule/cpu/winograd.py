"""Winograd F(2x2, 3x3) on the CPU (:mod:`tvm_convgrad.dsl.compute.winograd`).

* The forward and the stride-1 dX (:class:`WinogradConv`, ``wino_m``): the 16 GEMMs of the
  transform domain run task by task over rows of output tiles (one image's, or whole images:
  :meth:`WinogradConv._result_tasks`), each task transforming its tiles' input windows (``wino_v``,
  the 16 positions unrolled: one window's loads serve them all; an NCX input's rows first copied
  into channel vectors, ``wino_x``: :meth:`_Transforms._rows_in_task`), multiplying them (register tiles
  of ``R`` tiles x ``V`` Cout rows, :func:`.tiles.winograd_tile`: each reduction step ``R``
  broadcast values of ``wino_v`` and ``V`` rows of ``wino_u``) and transforming its sums back
  (``wino_y``, the frontend's result stage folded into it) while they are in cache; the
  transformed weights (``wino_u``) are a pass before, each weight's 16 positions from its nine taps in registers.
* On bf16 pairs (:class:`.bf16.PairedWinogradConv`, a ``vdpbf16ps`` target's bf16 forward and dX):
  the same, each register tile's Cout rows tensorized, from the pair stages ``wino_vp`` and
  ``wino_up`` (:meth:`_Transforms._pack`, :meth:`WinogradConv._weights`).
* The dW (:class:`WinogradFilterGrad`, ``wino_dw``): each core sums a part of the tiles
  (``rfactor``) in chunks, each chunk's ``wino_v`` and ``wino_d`` made in its task, register
  tiles of ``R`` input channels x ``V`` Cout rows (:func:`.tiles.winograd_dw_tile`); the parts are
  added in a fixed order and ``wino_w`` (the 3x3 weight gradient) is a pass after. On bf16 pairs
  of tiles (:class:`.bf16.PairedWinogradFilterGrad`): the same, from a chunk's pair stages
  ``wino_vp`` and ``wino_dp`` (:attr:`WinogradFilterGrad.packs`, :meth:`_Transforms._pack`).
"""

from __future__ import annotations

from tvm import s_tir

from ...dsl.compute.stages import WINO_D, WINO_DYW, WINO_U, WINO_UP, WINO_V, WINO_VP, WINO_W, WINO_WT, WINO_X, WINO_Y
from ...layout import C0
from ..common import loop_extent, loop_position, nbytes
from .loops import CpuMad, producers_named, restore_unit_loops, sum_parts, whole_tiles_and_edge
from .tiles import largest_divisor, winograd_dw_tile, winograd_tile

__all__ = ["FUSED_ROWS_BELOW", "TASKS_PER_CORE", "WINOGRAD_DW_CHUNK_TILES", "WINOGRAD_TASK_BYTES", "WinogradConv", "WinogradFilterGrad",
           "POSITIONS", "dw_chunk_rows", "positions_in_parts", "task_bytes"]

WINOGRAD_TASK_BYTES = 512 << 10
"""Fewest bytes of transformed input (``wino_v``) one task may hold (:func:`task_bytes`)."""


def task_bytes(plan, weight_bytes: int) -> int:
    """Most bytes of transformed input (``wino_v``) one task holds. Every task reads all the
    transformed weights (``wino_u``, ``weight_bytes``; 4 MB at 256 x 256 channels, 16 MB at 512):
    half their bytes, so that a task does enough work for their read, within the core's L2
    (:attr:`~tvm_convgrad.isa.IsaPlan.l2_bytes`) and at least :data:`WINOGRAD_TASK_BYTES`.
    Small weights keep small tasks: their read costs little and a task's tiles stay in L2.
    The Sapphire Rapids-class guest (2 cores, 2 MB of L2 a core), the dX NCHW, N x Cin -> Cout on
    HxW, ms, against half the L2 (1 MB) and against 512 KB a task: 8 x 256 -> 256 on 14x14 4.17 /
    4.22 / 5.96 (one tile row a task: the weights read 56 times); 4 x 256 on 14x14 2.76 / 2.77 /
    4.36; 32 x 512 on 4x4 8.07 / 8.01 / 9.09; 8 x 512 on 8x8 8.22 / 8.19 / 8.84; 32 x 64 on 28x28
    4.02 / 4.24 / 4.03; 8 x 128 on 28x28 3.54 / 3.61 / 3.64 (an Emerald Rapids core, 256 on 14x14
    N=8, whole images a task against a tile row: 13.9 -> 9.1 ms)."""
    return max(WINOGRAD_TASK_BYTES, min(plan.l2_bytes, weight_bytes // 2))

TASKS_PER_CORE = 2
"""Fewest tasks per core: a task takes more tile rows only while this many remain."""

FUSED_ROWS_BELOW = 8
"""Tiles per row below which a task's rows of tiles (and images) are one loop for the register
tiles (``R`` a divisor of the task's tiles), not ``R`` bounded by a row's tiles: on AVX-512 (AVX2's
twelve accumulators bound ``R`` before a row does; unmeasured there, so it keeps its rows). An
Emerald Rapids (2 cores), forward / dX NCHW: 512 -> 512 on 4x4 N=32 (2 tiles a row) 8.44 / 8.69 -> 6.80 / 6.76 ms
(channels-last 11.36 / 11.78 -> 8.94 / 9.57), 256 on 4x4 N=8 1.18 / 1.06 -> 1.00 / 0.92, 256 on
14x14 N=8 (7 a row) 5.80 / 5.70 -> 5.24 / 5.28; 7x7 and 8x8 maps level; 16x16 and larger (8 and
more a row) level, so they keep their rows."""


class _Transforms(CpuMad):
    """What both Winograd mads do with their transform stages."""

    def _positions_unrolled(self, transform, loop):
        """A transform stage (``wino_v``, ``wino_d``) computed under ``loop``, its 16 positions
        unrolled (each a constant combination of the window: the 16 share its loads) and its 16
        lanes vectorized."""
        sch = self.sch
        sch.compute_at(transform, loop)
        at = loop_position(sch, sch.get_loops(transform), loop)
        restore_unit_loops(sch, transform, at + 1)
        xi, *rest, tile, c0 = sch.get_loops(transform)[at + 1 :]
        sch.reorder(*rest, tile, xi, c0)  # (the positions inside a tile's loop, laid out outside it)
        for window in producers_named(sch, transform, (WINO_DYW,)):
            sch.compute_at(window, tile)
            sch.set_scope(window, 0, "local")
            *_, r, col, lanes = sch.get_loops(window)
            sch.unroll(r)
            sch.unroll(col)
            sch.vectorize(lanes)
            self.placed.add(sch.get(window).name_hint)
        sch.unroll(xi)
        sch.vectorize(c0)
        self.placed.add(sch.get(transform).name_hint)

    def _pack(self, pack, loop):
        """A mad's operand stage (``wino_v``, ``wino_d``) under ``loop``, its positions unrolled
        (and an NCX input's channel vectors: :meth:`_rows_in_task`)."""
        self._positions_unrolled(pack, loop)
        self._rows_in_task(pack, loop)

    def _rows_in_task(self, transform, loop):
        """An NCX input's channel vectors (``wino_x``, a producer of ``transform``) under ``loop``
        (a task, a dW chunk: the rows its windows read), the 16 lanes vectorized: each value
        gathered from its plane once a task (:func:`~tvm_convgrad.dsl.compute.winograd.input_tiles`)."""
        sch = self.sch
        for rows in producers_named(sch, transform, (WINO_X,)):
            sch.compute_at(rows, loop)
            sch.vectorize(sch.get_loops(rows)[-1])
            self.placed.add(WINO_X)


class WinogradConv(_Transforms):
    """The Winograd mad ``wino_m[n, i, co1, j, xi, co0]`` (reduction ``ci1, ci0``), with its input
    transform and its result in its tasks."""

    whole_tiles = False  # the register tiles divide the tiles (a tensorized mad: no edge tile's copy)

    def schedule(self, block):
        """Tasks of tile rows (:meth:`_result_tasks`), each transforming its windows, running the 16
        GEMMs over its tiles and transforming its sums back while they are in cache; the weights'
        transform a pass before (:meth:`_weights_by_position`). A register tile takes ``R`` tiles
        of a row, or, where rows are short (:data:`FUSED_ROWS_BELOW`), of the task's tiles in
        turn across its rows and images."""
        sch = self.sch
        (u,) = producers_named(sch, block, (WINO_U, WINO_UP))  # (fp32, or its bf16 pairs)
        weight_bytes = nbytes(*(w.source for w in sch.get(u).writes))
        self._weights(u)
        y, task = self._result_tasks(block, weight_bytes)
        sch.compute_at(block, task)
        (v,) = producers_named(sch, block, (WINO_V, WINO_VP))
        self._pack(v, task)
        self.placed.add(sch.get(y).name_hint)
        at = loop_position(sch, sch.get_loops(block), task)
        restore_unit_loops(sch, block, at + 1)  # (compute-at leaves out the axes a task holds one of, and those of extent 1)
        *tile_rows, co1, j, xi, co0, ci1, ci0 = sch.get_loops(block)[at + 1 :]
        fused = bool(tile_rows) and loop_extent(sch, j) < FUSED_ROWS_BELOW and self.plan.registers_per_row == 1
        if fused:  # the task's tiles one loop: a register tile may span its rows and images
            sch.reorder(xi, co1, *tile_rows, j, ci1, ci0, co0)
            j = sch.fuse(*tile_rows, j)
            tile_rows = []
        co1_o, co1_i, r = self._cout_rows(co1, loop_extent(sch, j), whole=fused or self.whole_tiles)
        sch.reorder(xi, co1_o, *tile_rows, j, ci1, ci0, co1_i, co0)
        self._register_tiles(block, j, r, ci1, ci0, co1_i, co0)

    def _weights(self, u):
        """The transformed weights (``wino_u``), a pass before the tasks: :meth:`_weights_by_position`."""
        self._weights_by_position(u)

    def _cout_rows(self, co1, tiles: int, whole: bool = False):
        """``(co1_o, co1_i, R)``: the Cout rows split by :func:`winograd_tile`'s ``V``, and its ``R``
        (``whole``: a divisor of ``tiles``)."""
        r, rows = winograd_tile(tiles, loop_extent(self.sch, co1), self.plan, whole)
        co1_o, co1_i = self.sch.split(co1, [None, rows])
        return co1_o, co1_i, r

    def _register_tiles(self, block, j, r: int, ci1, ci0, co1_i, co0):
        """``R`` of the tiles ``j`` x the Cout rows ``co1_i`` in registers (the last tiles one
        narrower tile where ``R`` does not divide them), summing ``(ci1, ci0)``."""
        sch = self.sch
        cols = loop_extent(sch, j)
        if cols % r == 0:
            j_o, j_i = sch.split(j, [None, r])
            sch.reorder(j_o, ci1, ci0, j_i, co1_i, co0)
            self.register_tile(block, [j_i, co1_i], co0, ci1)
            return
        for copy, tiles, j_i, (ci1, ci0, co1_i, co0) in whole_tiles_and_edge(sch, j, cols, r):
            sch.reorder(*tiles, ci1, ci0, j_i, co1_i, co0)
            self.register_tile(copy, [j_i, co1_i], co0, ci1)

    def _weights_by_position(self, u):
        """``wino_u``, each weight's 16 positions from its nine taps in registers (one store of
        each position's row), tasks of 16 input channels of one Cout block."""
        sch = self.sch
        self.placed.add(sch.get(u).name_hint)
        for staged in [p for p in sch.get_producers(u) if sch.get(p).name_hint == WINO_WT]:
            self._lanes_last(staged)
        co1, xi, ci, co0 = sch.get_loops(u)
        ci_o, ci_i = sch.split(ci, [None, C0])  # (Winograd takes whole 16-channel blocks: winograd_applies)
        sch.reorder(co1, ci_o, ci_i, xi, co0)
        sch.parallel(sch.fuse(co1, ci_o))
        sch.unroll(xi)
        sch.vectorize(co0)

    def _lanes_last(self, staged):
        """``wino_wt`` (the weights with ``wino_u``'s lane channel last) tap by tap over blocks of
        16 x 16 channels: one tap's 16 rows of the layout (16 lines) serve all 16 vectors of the
        block while they are in L1."""
        sch = self.sch
        self.placed.add(sch.get(staged).name_hint)
        other, kh, kw, lane = sch.get_loops(staged)
        lane_o, lane_i = sch.split(lane, [None, C0])
        other_o, other_i = sch.split(other, [None, C0])
        sch.reorder(lane_o, other_o, kh, kw, other_i, lane_i)
        sch.parallel(sch.fuse(lane_o, other_o))
        sch.vectorize(lane_i)

    def _fold_result(self, y):
        """The frontend's result stage folded into ``wino_y`` (its values written where they land)
        where it reads it one to one; an odd output (the tiles' last row or column falls outside
        it) keeps it a pass of its own."""
        sch = self.sch
        for result in sch.get_consumers(y):
            name = sch.get(result).name_hint
            try:
                sch.reverse_compute_inline(result)
            except s_tir.ScheduleError:
                continue
            self.placed.add(name)

    def _result_tasks(self, block, weight_bytes: int):
        """``(wino_y, its task loop)``: the frontend's result stage folded into ``wino_y``, whose
        ``(n, i)`` loops become the parallel tasks: a task is ``rows`` tile rows of one image (a
        divisor of TH), or whole images, as many as keep ``wino_v`` within :func:`task_bytes` (of
        the transformed weights' ``weight_bytes``) and :data:`TASKS_PER_CORE` tasks a core."""
        sch = self.sch
        (y,) = sch.get_consumers(block)
        assert sch.get(y).name_hint == WINO_Y
        self._fold_result(y)
        n, i, co1, j, pr, pc, co0 = sch.get_loops(y)
        images, rows, cols = loop_extent(sch, n), loop_extent(sch, i), loop_extent(sch, j)
        cin1 = loop_extent(sch, sch.get_loops(block)[-2])
        per_row = 16 * cin1 * C0 * cols * 4  # wino_v of one tile row
        budget = task_bytes(self.plan, weight_bytes)

        def fits(rows_per_task: int) -> bool:
            return rows_per_task * per_row <= budget and images * rows // rows_per_task >= TASKS_PER_CORE * self.cores

        choices = [d for d in range(1, rows + 1) if rows % d == 0 and fits(d)]
        choices += [rows * k for k in range(2, images + 1) if images % k == 0 and fits(rows * k)]
        per_task = max(choices or [1])
        if per_task >= rows:
            n_o, _ = sch.split(n, [None, per_task // rows])
            task = n_o
        else:
            i_o, _ = sch.split(i, [None, per_task])
            task = sch.fuse(n, i_o)
        sch.parallel(task)
        *_, pr, pc, co0 = sch.get_loops(y)
        sch.unroll(pr)  # (TVM unrolls them before it simplifies: each copy is one of the four sums, no select)
        sch.unroll(pc)
        sch.vectorize(co0)
        return y, task


WINOGRAD_DW_CHUNK_TILES = 64
"""About how many tiles a dW chunk sums (whole tile rows of an image, or whole images) where its
part's sums (16 x Cin x Cout floats) do not fit the core's L2 beside it: each chunk then reads and
writes them once (:func:`dw_chunk_rows`)."""


def dw_chunk_rows(rows: int, images: int, cols: int, tile_bytes: int, sums_bytes: int, l2_bytes: int) -> int:
    """Tile rows a Winograd dW chunk sums: a divisor of an image's ``rows`` (of ``cols`` tiles), or
    ``rows`` times a divisor of a part's ``images``. A chunk's transforms (``tile_bytes`` a tile:
    ``wino_v`` and ``wino_d``) are made in its task; its part's sums (``sums_bytes``) are read and
    written once per chunk. The largest chunk whose transforms fit half the core's L2
    (``l2_bytes``) and, beside the sums, the whole of it (the sums then stay there); where none
    does, the chunk nearest :data:`WINOGRAD_DW_CHUNK_TILES` tiles (of two as near, the larger).
    The Sapphire Rapids-class guest (2 cores, 2 MB of L2), dW ms, NCHW / NHWC, that chunk against
    64 tiles or more: 8 x 128 -> 128 on 28x28 (1 MB of sums) 2 tile rows (28 tiles, 448 KB) 4.56 /
    4.47 against 7 rows 5.46 / 5.45; 32 x 128 on 14x14 one image (49 tiles) 4.67 / 4.59 against
    two 5.54 / 5.37; 64 channels keep 4 tile rows on 56x56 (896 KB; a chunk as large as fits
    beside their sums, 1.6 MB, ran 4-12% slower). Where none fits, the nearest against the
    smallest of 64 or more: 256 -> 256 on 14x14 at N=8 (4 MB of sums; 2 MB a core split by
    position) one image (49 tiles) 5.14 / 5.73 against two 5.54 / 6.03 (by tile 5.50 / 6.12 against
    6.04 / 6.58; one tile row 13.68 against 5.81), N=16 9.82 against 10.66, N=4 2.92 against 3.12;
    on 28x28 7 tile rows (98 tiles) 21.1 against 2 rows 22.4 and an image 21.4; 32 x 256 on 7x7
    4 images (64 tiles) 7.63 against 2 7.74 and 1 10.22."""
    options = [d for d in range(1, rows) if rows % d == 0] + [rows * k for k in range(1, images + 1) if images % k == 0]
    fitting = [t for t in options if t * cols * tile_bytes <= min(l2_bytes // 2, l2_bytes - sums_bytes)]
    if fitting:
        return max(fitting)
    return min(options, key=lambda t: (abs(t * cols - WINOGRAD_DW_CHUNK_TILES), -t))


POSITIONS = 16
"""F(2x2, 3x3)'s transform positions (4 x 4): the dW's 16 GEMMs."""


def _dw_bytes(positions: int, cin: int, cout: int) -> tuple[int, int]:
    """``(tile_bytes, sums_bytes)`` of a dW at ``positions`` of the :data:`POSITIONS`: one tile's
    transforms (``wino_v`` and ``wino_d``) and the sums, counted as fp32."""
    return positions * (cin + cout) * 4, positions * cin * cout * 4


def positions_in_parts(sums_bytes: int, l2_bytes: int, cores: int) -> bool:
    """Whether a Winograd dW's cores share out the 16 positions, each summing every tile at its
    own, rather than the tiles, each summing its part at every position (``rfactor``): where a
    part's sums (``sums_bytes``: 16 x Cin x Cout fp32) outgrow half the core's L2 (``l2_bytes``),
    so that every chunk streams them in and out, and the cores divide the positions. Split by
    position, a core's sums and each tile's transforms are its share of them (the chunks' traffic
    halved on 2 cores), at the cost of each core loading every window of x and dy. The Sapphire
    Rapids-class guest (2 cores, 2 MB of L2), 256 -> 256 on 14x14 (4 MB of sums), dW ms, by
    position against by tile: N=8 NCHW 5.65-5.71 / 5.92-5.97, NHWC 6.38-6.41 / 6.93-6.98; N=16
    10.5 / 10.6-11.6 and 11.1 / 12.7-12.8; N=4 3.05 / 3.45; 28x28 N=8 21.1 / 21.0-21.2; 128 ->
    128 on 28x28 (1 MB of sums, in L2) 5.76 against 4.71: by tile."""
    return cores > 1 and POSITIONS % cores == 0 and sums_bytes > l2_bytes // 2


class WinogradFilterGrad(_Transforms):
    """The Winograd dW mad ``wino_dw[co1, ci, xi, co0]`` (the sum over the tiles ``n, i, j``): each
    core sums a part of the tiles (``rfactor``; the parts added in a fixed order after, so results
    do not vary run to run), or where the sums outgrow the L2 every tile at its share of the
    positions (:func:`positions_in_parts`), walking them in chunks: a chunk's ``wino_v`` and ``wino_d`` made in
    the task (every position, unrolled: in cache), then register tiles of ``R`` input channels x
    ``V`` Cout rows summing the chunk's tiles (:func:`.tiles.winograd_dw_tile`) into the part's sums;
    ``wino_w`` (the 3x3 weight gradient, the frontend's result folded into it) a pass after."""

    def schedule(self, block):
        sch = self.sch
        co1, ci, xi, co0, n, i, j = sch.get_loops(block)
        cout, cin, images, rows = loop_extent(sch, co1) * C0, loop_extent(sch, ci), loop_extent(sch, n), loop_extent(sch, i)
        if positions_in_parts(_dw_bytes(POSITIONS, cin, cout)[1], self.plan.l2_bytes, self.cores):
            return self._position_parts(block, cin, cout)
        parts = largest_divisor(images, self.cores) if images >= self.cores else 1
        if parts > 1:
            part, n = sch.split(n, [parts, None])
        else:  # one image: its tile rows in parts
            parts = largest_divisor(rows, self.cores)
            part, i = sch.split(i, [parts, None])
        sch.reorder(part, co1, ci, xi, co0, n, i, j)
        rf = sch.rfactor(part, 0)
        sum_parts(sch, block)
        part, *loops = sch.get_loops(rf)
        self._tiles_in_chunks(rf, part, loops, *_dw_bytes(POSITIONS, cin, cout))

    def _tiles_in_chunks(self, block, part, loops, tile_bytes: int, sums_bytes: int):
        """The mad ``block`` under the parallel ``part`` loop over its ``loops`` ``(co1, ci, xi, co0,
        n, i, j)``: its tiles walked in chunks (:func:`dw_chunk_rows` of a part's ``sums_bytes`` and
        a tile's ``tile_bytes`` of transforms, counted as fp32), each chunk's ``wino_v`` and ``wino_d``
        made in it, register tiles of ``R`` input channels x ``V`` Cout rows."""
        sch, plan = self.sch, self.plan
        co1, ci, xi, co0, n, i, j = loops
        cout1, cin, images, rows, cols = (loop_extent(sch, lp) for lp in (co1, ci, n, i, j))
        r, v = winograd_dw_tile(cin, cout1, plan)
        ci_o, ci_r = sch.split(ci, [None, r])
        co1_o, co1_v = sch.split(co1, [None, v])
        chunk = dw_chunk_rows(rows, images, cols, tile_bytes, sums_bytes, plan.l2_bytes)
        if chunk < rows:  # rows of one image
            i_o, i_i = sch.split(i, [None, chunk])
            chunks, steps = [n, i_o], [i_i]
        else:  # whole images per chunk
            n_o, n_i = sch.split(n, [None, chunk // rows])
            chunks, steps = [n_o], [n_i, i]
        sch.reorder(part, *chunks, xi, co1_o, ci_o, *steps, j, ci_r, co1_v, co0)
        sch.parallel(part)
        for pack in producers_named(sch, block, self.packs):
            self._pack(pack, chunks[-1])
        self.register_tile(block, [ci_r, co1_v], co0, chunks[0])  # (a part's sums zeroed before its first chunk)
        self._result()

    def _position_parts(self, block, cin: int, cout: int):
        """:meth:`schedule` with each core summing every tile at its share of the 16 positions
        (:func:`positions_in_parts`): no rfactor, each core summing into its own positions' rows of
        ``wino_dw``; a chunk's ``wino_v`` and ``wino_d`` made at the core's positions only."""
        sch = self.sch
        co1, ci, xi, co0, n, i, j = sch.get_loops(block)
        part, xi = sch.split(xi, [self.cores, None])
        self._tiles_in_chunks(block, part, (co1, ci, xi, co0, n, i, j), *_dw_bytes(POSITIONS // self.cores, cin, cout))

    packs = (WINO_V, WINO_D)
    """The mad's operand stages, each made per chunk (:meth:`_pack`)."""

    def _result(self):
        """``wino_w`` with the frontend's weight layout folded in: ``(co1, ci)`` tasks, the taps
        unrolled (their coefficients constants), 16 Cout lanes."""
        sch = self.sch
        w = sch.get_sblock(WINO_W)
        for result in sch.get_consumers(w):
            name = sch.get(result).name_hint
            sch.reverse_compute_inline(result)
            self.placed.add(name)
        co1, ci, kh, kw, co0 = sch.get_loops(w)
        sch.parallel(sch.fuse(co1, ci))
        sch.unroll(kh)
        sch.unroll(kw)
        sch.vectorize(co0)
        self.placed.add(WINO_W)
