"""dW on the CPU's cube (:class:`CubeFilterGrad`, ``dw_cc``): 16x16 blocks of fp32 accumulators
in vector registers, fed by broadcast FMAs.

A tile is ``R`` Cout rows of one ``(co1, c1, kh, kw)`` block x 16 Cin lanes, each step one fmap
row (constant offset per tap) times ``R`` broadcast dy values; on AVX-512 ``R`` = 8 rows x 2 Cin
blocks (:func:`.tiles.dw_blocks`: each broadcast feeds both, 10 loads a step for 16 FMAs), or 16
rows x 1 where the blocks do not pair up. The cores share
the work one of three ways:

* each core owns a group of Cout (or Cin) blocks and walks the reduction ``(n, ho, wo)`` in chunks
  of whole images or row bands, running all its tiles on a chunk before the next (its dy packed
  per chunk, in cache);
* a 1x1 dW whose blocks the cores cannot share without each reading a whole operand (dy where
  they own Cin blocks, x where they own Cout blocks): each core sums its own images, both packs
  made per chunk (:meth:`CubeFilterGrad._split_images`; MobileNetV2's 24 -> 144 on 28x28, N=32:
  3.1 -> 2.3 ms);
* with fewer tiles than cores, each core sums its own part of the reduction.

Where cores sum parts (``rfactor``), the parts are added in a fixed order, so results do not vary
from run to run. NXC fp32 rows that a pack would only copy are read where they lie instead
(``backprop_filter.ROWS_IN_PLACE``: the rule inlines those packs before this schedule runs).
"""

from __future__ import annotations

from ...dsl.compute.stages import FMAP_L1, GRADS_2_MATRIX, KERNEL_H, KERNEL_W
from ...layout import C0
from ..common import loop_extent, nbytes
from .loops import CpuMad, reads_of, sum_parts
from .prefetch import prefetch_stream, read_in_place
from .tiles import CHUNK_STEPS, chunk, dw_blocks, largest_divisor

__all__ = ["CHUNK_IN_CACHE", "DW_WRITE_BACK", "FMAP_PER_CHUNK", "IMAGES_PER_CORE", "IMAGES_PER_CORE_TRAFFIC", "PACK_IN_CACHE", "PACK_PER_CHUNK", "CubeFilterGrad"]

PACK_PER_CHUNK = True  # dW: pack each chunk's dy inside the chunk loop when it fits PACK_IN_CACHE
PACK_IN_CACHE = 768 * 1024
DW_WRITE_BACK = True  # dW of one chunk: the result written per Cin block of a task, from cache (:meth:`CpuMad.write_back_in`)
IMAGES_PER_CORE = True  # a 1x1 dW whose blocks the cores cannot share evenly sums each core's images (:meth:`CubeFilterGrad._split_images`)
IMAGES_PER_CORE_TRAFFIC = 0.8  # ... where a core's traffic is then at most this share of what it reads owning blocks
FMAP_PER_CHUNK = True  # ... and x packed per chunk too (else a pass of its own)
CHUNK_IN_CACHE = 1024 * 1024
"""Bytes of dy and x (all of both, a step's share) above which a dW chunk takes fewer steps than
:data:`.tiles.CHUNK_STEPS`: every tile of a chunk reads it again, from L2 while it fits. ResNet-18's
channels-last layers at N=32 (1.2-1.7 KB a step), Zen 3 (512 KB L2): 128 -> 128 3x3 on 14x14 in
chunks of 8 images 18.5 ms, of 4 13.7, of 2 12.1; 64 -> 128 3x3 stride 2 on 28x28 9.6 -> 6.2;
ResNet-50's NCHW layers at N=8 (a smaller budget cut their chunks too: 0.88-0.94x) unchanged."""


class CubeFilterGrad(CpuMad):
    """dW on the cube (``dw_cc``)."""

    write_back_in_task = True

    block_tiles = True  # a tile takes several Cin blocks where the registers hold a row each (:func:`.tiles.dw_blocks`)
    ragged_parts = True  # too few tiles: the reduction in one part per core, the last one shorter (else parts that divide it)

    def schedule(self, block):
        """dW: ``(co1, c1, kh, kw)`` tiles x ``[n, ho, wo]`` x (co0 unrolled, c0 vectorized).

        Each core owns a group of Cout blocks (or of Cin blocks) and walks the reduction in
        chunks of whole images (or row bands), running all its tiles on one chunk before the
        next: the chunk's dy and fmap stay in cache while they are reused, and each core streams
        fmap once. The tile's 16 accumulators stay in registers within a chunk. A 1x1 dW where
        owning blocks makes each core read a whole operand sums each core's images instead
        (:meth:`_split_images`); fewer tiles than cores, a part of the reduction per core.
        """
        sch = self.sch
        kh, kw = (int(sch.get(block).annotations[key]) for key in (KERNEL_H, KERNEL_W))
        g, fkk, co, c0, n, ho, wo = sch.get_loops(block)
        c1, tap_h, tap_w = sch.split(fkk, [None, kh, kw])
        co1, co0 = sch.split(co, [None, 16])
        groups, blocks_out, blocks_in = loop_extent(sch, g), loop_extent(sch, co1), loop_extent(sch, c1)
        batch, rows, cols = loop_extent(sch, n), loop_extent(sch, ho), loop_extent(sch, wo)
        cores = self.cores
        longest = max((n, ho, wo), key=lambda lp: loop_extent(sch, lp))
        if groups * blocks_out * blocks_in < cores and loop_extent(sch, longest) >= 2 * cores:
            self._split_reduction(block, [g, co1, c1, tap_h, tap_w], [n, ho, wo], longest, co0, c0)
            return
        if groups == 1 and self._images_per_core_pay(kh * kw, blocks_out, blocks_in, batch, rows * cols):
            self._split_images(block, [g, co1, c1, tap_h, tap_w], n, ho, wo, co0, c0, blocks_out + blocks_in * FMAP_PER_CHUNK)
            return
        cores_own_out = (groups * blocks_out) % cores == 0  # else Cin blocks, else whole tiles
        owned_out = groups * blocks_out // (cores if cores_own_out else 1)
        images, bands = chunk(batch, rows, cols, self._chunk_steps(block, batch * rows * cols, cols, owned_out))
        n_o, n_i = self.split(n, images, batch)
        ho_o, ho_i = self.split(ho, bands, rows)
        # One chunk (the whole reduction): its loops go inside the tiles, so that each tile's
        # accumulators start at 0 in registers right before its steps (else all of them are
        # zeroed in memory first and loaded per tile), and the packs are made once per core.
        one_chunk = not self.tunable and images == batch and bands == rows
        chunk_loops, steps = ([], [n_o, ho_o, n_i, ho_i, wo]) if one_chunk else ([n_o, ho_o], [n_i, ho_i, wo])
        # Cout rows per tile: all 16 where the registers hold them (AVX-512); else the most that
        # fit, the last tile predicated (AVX2: 6 + 6 + 4 rows, not 4 x 4). LLVM unswitches the
        # predicate, so each tile's hot loop has only its own rows' FMAs; a loop_partition would
        # do the same but put each tile in a scope that cannot zero its accumulators before
        # chunks outside it.
        most = self.plan.rows(C0)
        chunk_first = cores_own_out or blocks_in % cores == 0
        # The Cout rows stay one loop (co0) until the result is placed; they are split into row groups at the end.
        below = steps if cores_own_out or blocks_in % cores == 0 else [*chunk_loops, *steps]  # the loops between co0 and c0
        # A tile's Cin blocks (AVX-512: 8 Cout rows x 2 Cin blocks where they pair up) split off the Cin blocks a task owns.
        if cores_own_out:
            sch.reorder(g, co1, c1)
            core, owned = sch.split(sch.fuse(g, co1), [cores, None])
            sch.reorder(core, *chunk_loops, owned, c1, tap_h, tap_w, co0, *below, c0)
            c1, c1_b = self._cin_blocks(c1)
        elif blocks_in % cores == 0:
            core, owned = sch.split(c1, [cores, None])
            sch.reorder(core, *chunk_loops, g, co1, owned, tap_h, tap_w, co0, *below, c0)
            owned, c1_b = self._cin_blocks(owned)
        else:  # no even split: every tile a task, its whole reduction inside
            sch.reorder(g, co1, c1, tap_h, tap_w, co0, *below, c0)
            c1, c1_b = self._cin_blocks(c1)
            core = sch.fuse(g, co1, c1)
        most //= loop_extent(sch, c1_b[0]) if c1_b else 1
        sch.parallel(core)
        chunk_bytes = images * bands * cols * owned_out * C0 * 4  # the fp32 dy one chunk of a core reads
        if PACK_PER_CHUNK and chunk_first and chunk_bytes <= PACK_IN_CACHE:
            self._pack_per_chunk(GRADS_2_MATRIX, (chunk_loops or [core])[-1])
        # One chunk: each (Cout blocks, Cin block)'s sums are whole after its taps, and written out from cache there;
        # before the rows are split (AVX2's 6 + 6 + 4, predicated), while the region TVM bounds is the block's 16 rows.
        if DW_WRITE_BACK and one_chunk and chunk_first:
            self.write_back_in(block, c1 if cores_own_out else owned)  # (first: a tensorized tile's block is replaced)
        rows_o, co0 = self.split(co0, self.plan.rows(C0, divides=C0) if self.tunable else most, most)
        sch.reorder(rows_o, *below, co0, *c1_b)  # (a tile's Cin blocks innermost: each broadcast feeds them all)
        self._prefetch(block, wo, kh * kw)
        self.register_tile(block, [co0, *c1_b], sch.get_loops(block)[-1], (chunk_loops or steps)[0])

    def _cin_blocks(self, loop, pair: bool = True) -> tuple:
        """``(outer, [the tile's Cin blocks])`` of the Cin-block ``loop`` a task walks: its blocks
        in pairs (:func:`.tiles.dw_blocks`) where :attr:`block_tiles`, ``pair`` and not tuning,
        else ``(loop, [])``."""
        pairs = pair and self.block_tiles and not self.tunable
        return self.split_blocks(loop, dw_blocks(loop_extent(self.sch, loop), self.plan) if pairs else 1)

    def _images_per_core_pay(self, taps: int, blocks_out: int, blocks_in: int, batch: int, pixels: int) -> bool:
        """Whether each core should sum the dW of its own images (:meth:`_split_images`) instead of
        owning Cout (or Cin) blocks: a 1x1 dW (few FLOPs per byte: a core's traffic is its time)
        whose blocks the cores cannot share without each reading a whole operand, dy (Cin blocks
        owned) or x (Cout blocks owned), where a core's images read a share of both and its part of
        the sums is written and added once more (:data:`IMAGES_PER_CORE_TRAFFIC`)."""
        if self.tunable or not IMAGES_PER_CORE or taps != 1 or batch % self.cores:
            return False
        cores = self.cores
        if blocks_out % cores == 0:
            owned = blocks_out / cores + blocks_in
        elif blocks_in % cores == 0:
            owned = blocks_out + blocks_in / cores
        else:
            return False
        block_bytes = C0 * 4 * batch * pixels  # one channel block of an operand (the output's pixels)
        parts = 2 * blocks_out * blocks_in * C0 * C0 * 4  # a core's part written, and read by the sum
        return (blocks_out + blocks_in) / cores * block_bytes + parts < IMAGES_PER_CORE_TRAFFIC * owned * block_bytes

    def _split_images(self, block, tiles, n, ho, wo, co0, c0, packed_blocks: int):
        """Each core sums the dW of ``batch / cores`` images (``rfactor``): in chunks of whole
        images (or row bands) whose packs (``packed_blocks`` 16-channel blocks per pixel: dy's, and
        x's with :data:`FMAP_PER_CHUNK`) fit :data:`PACK_IN_CACHE`, made in the chunk, all the
        tiles run on a chunk before the next; the parts added in a fixed order afterwards
        (run-to-run identical results). Chunks of whole images take the tiles of paired Cin blocks
        (:func:`.tiles.dw_blocks`; MobileNetV2's 96 -> 24 on 28x28, N=32, channels-last: 0.78-0.83
        -> 0.60-0.65 ms); bands of rows keep one (its 24 -> 144 on 56x56 ran no faster, and at
        times slower, paired)."""
        sch = self.sch
        cores = self.cores
        batch, rows, cols = (loop_extent(sch, lp) for lp in (n, ho, wo))
        part, n = sch.split(n, [cores, None])
        images, bands = chunk(batch // cores, rows, cols, self._chunk_steps(block, batch * rows * cols, cols, packed_blocks))
        n_o, n_i = self.split(n, images, batch // cores)
        ho_o, ho_i = self.split(ho, bands, rows)
        g, co1, c1, tap_h, tap_w = tiles
        c1, c1_b = self._cin_blocks(c1, pair=bands == rows)
        tile_blocks = loop_extent(sch, c1_b[0]) if c1_b else 1
        rows_o, co0 = self.split(co0, self.plan.rows(C0, divides=C0) // tile_blocks, self.plan.rows(C0) // tile_blocks)
        sch.reorder(part, n_o, ho_o, g, co1, c1, tap_h, tap_w, rows_o, n_i, ho_i, wo, co0, *c1_b, c0)
        rf = sch.rfactor(part, 0)
        part, n_o, ho_o, *_ = sch.get_loops(rf)
        sch.parallel(part)
        self._pack_per_chunk(GRADS_2_MATRIX, ho_o)
        if FMAP_PER_CHUNK:
            self._pack_per_chunk(FMAP_L1, ho_o)
        loops = sch.get_loops(rf)  # (..., wo, co0, the tile's Cin blocks, c0)
        self._prefetch(rf, loops[-3 - len(c1_b)], taps=1)
        self.register_tile(rf, loops[-2 - len(c1_b) : -1], loops[-1], n_o)
        sum_parts(sch, block)

    def _prefetch(self, block, pixels, taps: int):
        """A 1x1 dW's ``pixels`` loop (a tile's steps along a row) made to prefetch what the tile
        reads in place of dy and x ahead of it (:mod:`.prefetch`): each step a run of the
        channels, the steps a row's channels apart, which the hardware prefetchers follow too
        slowly from memory (MobileNetV2's 1x1 layers at N=32, channels-last, their operands
        streamed from memory as inside a training step: 16 -> 96 on 56x56 5.4 -> 3.1 ms, 144 -> 24
        on 28x28 3.1 -> 1.6). A 3x3 dW reads each row for nine taps, from cache: left as it is."""
        if taps != 1:
            return
        for name in read_in_place(self.sch, block):
            prefetch_stream(self.sch, pixels, name)

    def _chunk_steps(self, block, steps_in_all: int, cols: int, packed_blocks: int) -> int:
        """Reduction steps ``(n, ho, wo)`` per chunk (of ``steps_in_all``): :data:`.tiles.CHUNK_STEPS`,
        fewer where the chunk's packs (``packed_blocks`` fp32 16-channel blocks per step) would
        outgrow :data:`PACK_IN_CACHE`, and fewer where what it reads (all of dy and x: a step's share
        of the operands the mad reads, a core's part or more) would outgrow :data:`CHUNK_IN_CACHE`
        -- but, for either bound, not below the steps that read as many bytes as the sums, which
        every chunk loads and stores again (then the packs are passes of their own); a row at least.
        Sums larger than the operands (Zen 4, cold: DeepLab's 512 -> 512 3x3 at dilation 2 on
        14x14, N=4, 9.4 MB of sums, 18.7 -> 17.1 ms as one chunk against two; 512 -> 2048 1x1 on
        7x7, N=8, 4.6 -> 4.35 against four)."""
        stmt = self.sch.get(block)
        written = {w.source.name: w.source for w in stmt.writes}
        operands = [r.source for r in stmt.reads if r.source.name not in written]
        step_bytes = max(1, nbytes(*operands) // steps_in_all)
        steps = CHUNK_IN_CACHE // step_bytes
        if PACK_PER_CHUNK:
            steps = min(steps, PACK_IN_CACHE // (packed_blocks * C0 * 4))
        return max(cols, min(CHUNK_STEPS, max(steps, nbytes(*written.values()) // step_bytes)))

    def _pack_per_chunk(self, stage: str, loop):
        """Pack what one chunk of the reduction reads, inside the chunk loop: the fp32 copy is
        written to and read from the core's cache instead of memory."""
        sch = self.sch
        try:
            pack = sch.get_sblock(stage)
        except Exception:  # read in place (inlined): nothing to move
            return
        if len(reads_of(sch, stage)) > 1:  # (read by every live-tap region's mad: a pass of its own)
            return
        self.pack_at(pack, loop)  # (tunable: LLVM vectorizes the contiguous 16-lane conversion by itself)

    def _split_reduction(self, block, tiles, reduce, longest, co0, c0):
        """Too few tiles for the cores: each core sums a part of the reduction (``rfactor``);
        the parts are added in a fixed order afterwards, so results do not vary run to run."""
        sch = self.sch
        taps = loop_extent(sch, tiles[-2]) * loop_extent(sch, tiles[-1])
        i = reduce.index(longest)
        parts = self.cores if self.ragged_parts else largest_divisor(loop_extent(sch, longest), self.cores)
        part, reduce[i] = sch.split(longest, [parts, None])
        rows_o, co0 = self.split(co0, self.plan.rows(C0, divides=C0), self.plan.rows(C0))
        sch.reorder(part, *tiles, rows_o, *reduce, co0, c0)
        rf = sch.rfactor(part, 0)
        loops = sch.get_loops(rf)  # part, the tile loops, the row groups, the reduction loops, co0, c0
        sch.parallel(loops[0])
        self._prefetch(rf, loops[-3], taps)
        self.tile_body(rf, loops[2 + len(tiles)])
        sum_parts(sch, block)

