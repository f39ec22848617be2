"""LLVM (CPU) schedule rule: 16-lane fp32 blocks held in AVX-512 registers, fed by broadcast FMAs.

Both gradients are GEMMs whose N axis is a block of 16 lanes (one zmm register); every mad runs
as register tiles of up to 16-28 accumulators, each reduction step one vector load and one
broadcast FMA per accumulator row:

* dW cube (``dw_cc``): a tile is one ``(co1, c1, kh, kw)`` block, 16 Cout rows x 16 Cin lanes,
  each step one fmap row (constant offset per tap) times 16 broadcast dy values. Each core owns
  a group of Cout (or Cin) blocks and walks the reduction ``(n, ho, wo)`` in chunks of whole
  images or row bands, running all its tiles on a chunk before the next (``_chunk``). With
  fewer tiles than cores, each core sums its own part of the reduction (``rfactor``) and the
  parts are added in a fixed order, so results do not vary from run to run.
* dX cube (``dx_cc_<rh>_<rw>``, one per stride phase): a tile is ``TH x TW`` output pixels of one
  16-channel block (``pixel_tile``), the reduction ``(co1, taps, co0)`` inside, each step one
  w_col row times ``TH*TW`` broadcast dy values. The channel blocks are taken in groups whose
  weights fit a core's cache, the pixels streaming past once per group.
* few input channels (``dw_cc_t``: Cout on the lanes; ``dx_px_*``: output columns on the lanes):
  tiles of taps x Cout vectors, or rows x channels, see their methods.

The fp16 -> fp32 conversion happens once: in the packing stages (``fmap_l1``, ``grads_2_matrix``,
``dy_pad``, ``w_col``, ``dy_rows``, ``w_t``; parallel, vectorized or walked in source order), or
as vector operands load (``vcvtph2ps``) where a pack would only have converted. With
``tunable=True`` the tile sizes become MetaSchedule samples (``sample_perfect_tile``): the dX
pixel tiles, the transposed dW's taps x Cout vectors, the pixel-lane dX's rows (the 16x16 cube
tile is fixed by the register file).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .. import usable_cores
from .common import stage_blocks

__all__ = ["CpuRule", "pixel_tile"]

MAX_TILE_PIXELS = 16  # dX accumulators per tile: 16 zmm of the 32, the rest for operands
WEIGHTS_IN_CACHE = 512 * 1024  # bytes of w_col kept in a core's L2 while dX walks the pixels
CHUNK_STEPS = 1600  # reduction steps (n, ho, wo) per dW chunk: ~1.6 MB of fmap per 16 Cin blocks


def _num_cores(target: Target) -> int:
    return int(target.attrs.get("num-cores", 0)) or usable_cores()


def _extent(sch: s_tir.Schedule, loop) -> int:
    return int(sch.get(loop).extent)


def pixel_tile(rows: int, cols: int) -> tuple[int, int]:
    """dX register tile ``(TH, TW)``: divisors of the phase's rows / cols with the most pixels
    ``<= 16`` (whole tiles keep every row's FMAs unpredicated); a 16-wide ragged tile when the
    columns have no divisor giving at least 8 pixels."""
    divisors = lambda n: [d for d in range(1, min(n, MAX_TILE_PIXELS) + 1) if n % d == 0]  # noqa: E731
    th, tw = max(
        ((th, tw) for tw in divisors(cols) for th in divisors(rows) if th * tw <= MAX_TILE_PIXELS),
        key=lambda t: (t[0] * t[1], t[1]),
    )
    if th * tw < 8 and cols > MAX_TILE_PIXELS:
        return 1, MAX_TILE_PIXELS
    return th, tw


def _elementwise(sch: s_tir.Schedule, block):
    """Parallel over the outer loops, vectorized over the innermost (C0, or 16 of a longer row)."""
    *outer, lanes = sch.get_loops(block)
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


def _planar_pack(sch: s_tir.Schedule, block):
    """A 5HD -> channel-plane pack (``dy_rows``, the transposed dW's ``fmap_l1``): walked in the
    source's order (channels innermost), so every read is contiguous; 16 planes are written."""
    n, c, i, j = sch.get_loops(block)
    c1, c0 = sch.split(c, [None, 16])
    sch.reorder(n, c1, i, j, c0)
    sch.parallel(sch.fuse(n, c1, i))
    sch.unroll(c0)


@dataclass
class _Cube:
    sch: s_tir.Schedule
    cores: int
    tunable: bool

    def split(self, loop, inner: int, max_inner: int):
        """``(outer, inner)``: ``inner`` fixed, or a MetaSchedule sample (a divisor of the
        extent, at most ``max_inner``) when tunable."""
        if self.tunable:
            factors = self.sch.sample_perfect_tile(loop, n=2, max_innermost_factor=max_inner)
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
        images, bands = _chunk(batch, rows, cols)
        n_o, n_i = sch.split(n, [None, images])
        ho_o, ho_i = sch.split(ho, [None, bands])
        chunk, steps = [n_o, ho_o], [n_i, ho_i, wo]
        if (groups * blocks_out) % cores == 0:
            sch.reorder(g, co1, c1)
            core, owned = sch.split(sch.fuse(g, co1), [cores, None])
            sch.reorder(core, *chunk, owned, c1, tap_h, tap_w, *steps, co0, c0)
        elif blocks_in % cores == 0:
            core, owned = sch.split(c1, [cores, None])
            sch.reorder(core, *chunk, g, co1, owned, tap_h, tap_w, *steps, co0, c0)
        else:  # no even split: every tile a task, its whole reduction inside
            sch.reorder(g, co1, c1, tap_h, tap_w, *chunk, *steps, co0, c0)
            core = sch.fuse(g, co1, c1)
        sch.parallel(core)
        self._tile_body(block, n_o)

    def _split_reduction(self, block, tiles, reduce, longest, co0, c0):
        """Too few tiles for the cores: each core sums a part of the reduction (``rfactor``);
        the parts are added in a fixed order afterwards, so results do not vary run to run."""
        sch = self.sch
        i = reduce.index(longest)
        part, reduce[i] = sch.split(longest, [self.cores, None])
        sch.reorder(part, *tiles, *reduce, co0, c0)
        rf = sch.rfactor(part, 0)
        loops = sch.get_loops(rf)  # part, the tile loops, the reduction loops, co0, c0
        sch.parallel(loops[0])
        self._tile_body(rf, loops[1 + len(tiles)])
        _sum_parts(sch, block)

    def _tile_body(self, block, first_reduce):
        """The 16x16 register tile: C0 rows unrolled, C0 lanes vectorized; init before the reduction."""
        *_, rows, lanes = self.sch.get_loops(block)
        self.sch.unroll(rows)
        self.sch.vectorize(lanes)
        self.sch.decompose_reduction(block, first_reduce)

    def input_grad(self, block, weight_bytes: int):
        """dX phase: pixel tiles ``(j_i x i_i)`` x 16 lanes, reduction ``[co1, mh, mw, co0]`` inside.

        The channel blocks ``c1`` are taken in groups whose w_col fits a core's cache
        (WEIGHTS_IN_CACHE): a group's weights stay in cache while the pixels stream past, once
        per group (all of them in one group when the weights fit, one block per group when a
        single block's panel is that large).
        """
        sch = self.sch
        n, c1, j, i, c0, co1, mh, mw, co0 = sch.get_loops(block)
        blocks = _extent(sch, c1)
        group = _largest_divisor(blocks, WEIGHTS_IN_CACHE // max(1, weight_bytes // blocks))
        c1_o, c1_i = sch.split(c1, [None, group])
        th, tw = pixel_tile(_extent(sch, j), _extent(sch, i))
        j_o, j_i = self.split(j, th, MAX_TILE_PIXELS)
        i_o, i_i = self.split(i, tw, MAX_TILE_PIXELS)
        sch.reorder(c1_o, n, j_o, i_o, c1_i, co1, mh, mw, co0, j_i, i_i, c0)
        sch.parallel(sch.fuse(c1_o, n, j_o))
        sch.unroll(j_i)
        sch.unroll(i_i)
        sch.vectorize(c0)
        sch.decompose_reduction(block, co1)

    def transposed_filter_grad(self, block):
        """dW with Cout on the lanes (``dw_cc_t[c, kh, kw, co]``): a tile is ``kw_i`` taps x
        ``co1_i`` Cout vectors (<= 28 accumulators) of one ``(c, kh)``, fed by one broadcast x
        value per tap and one dy vector per Cout block, summing ``(ho, wo)`` in registers.

        With a batch, each image is a separate partial dW (``rfactor`` over ``n``): the images
        run one after another with every tile reading that image's dy while it is in cache, and
        the partials (``N`` small dWs: this layout is for few input channels) are summed after.
        """
        sch = self.sch
        c, kh, kw, co, n, ho, wo = sch.get_loops(block)
        co1, co0 = sch.split(co, [None, 16])
        taps = _largest_divisor(_extent(sch, kw), 7)
        vectors = _largest_divisor(_extent(sch, co1), 28 // taps)
        kw_o, kw_i = self.split(kw, taps, 7)
        co1_o, co1_i = self.split(co1, vectors, 4)
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

    def pixel_lane_input_grad(self, block):
        """dX with output columns on the lanes (``dx_px``): a tile is 16 columns x ``j_i`` rows x
        every input channel (<= 24 accumulators); per ``(co, mh, mw)`` one dy vector per row, used
        at once by every channel's broadcast weight (so one dy vector is live at a time)."""
        sch = self.sch
        n, ci, j, i, co, mh, mw = sch.get_loops(block)
        width = _extent(sch, i)
        i_o, i_i = sch.split(i, [None, 16]) if width > 16 else (None, i)
        rows = _largest_divisor(_extent(sch, j), 24 // _extent(sch, ci))
        j_o, j_i = self.split(j, rows, max(1, 24 // _extent(sch, ci)))
        outer = [n, j_o] + ([i_o] if i_o is not None else [])
        sch.reorder(*outer, co, mh, mw, j_i, ci, i_i)
        sch.parallel(sch.fuse(*outer))
        sch.unroll(ci)
        sch.unroll(j_i)
        if width <= 16 or width % 16 == 0:  # a ragged last vector stays scalar
            sch.vectorize(i_i)
        sch.decompose_reduction(block, co)


def _sum_parts(sch: s_tir.Schedule, block):
    """The write-back of an rfactor: ``dW = part_0 + part_1 + ...`` in a fixed order, vectorized."""
    part, *spatial = sch.get_loops(block)
    *outer, lanes = spatial
    sch.reorder(*outer, part, lanes)
    sch.parallel(sch.fuse(*outer))
    sch.vectorize(lanes)
    init = sch.decompose_reduction(block, part)
    sch.vectorize(sch.get_loops(init)[-1])


def _chunk(batch: int, rows: int, cols: int) -> tuple[int, int]:
    """``(images, rows)`` of a dW reduction chunk: whole images while they fit CHUNK_STEPS,
    else bands of rows of one image."""
    if rows * cols <= CHUNK_STEPS:
        return _largest_divisor(batch, CHUNK_STEPS // (rows * cols)), rows
    return 1, _largest_divisor(rows, max(1, CHUNK_STEPS // cols))


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0)


def _buffer_bytes(sch: s_tir.Schedule, stage: str) -> int:
    """Bytes of the buffer a stage writes."""
    (buffer,) = [w.source for w in sch.get(sch.get_sblock(stage)).writes]
    size = 1
    for d in buffer.shape:
        size *= int(d)
    return size * tvm.DataType(buffer.dtype).bits // 8


class CpuRule(ScheduleRule):
    """Schedule rule for ``llvm`` targets (usable in ``dlight.ApplyDefaultSchedule``)."""

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "llvm"

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func, error_render_level="none")
        cube = _Cube(sch, _num_cores(target), tunable)
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
            elif name == "dy_rows" or (name == "fmap_l1" and len(sch.get_loops(block)) == 4):
                _planar_pack(sch, block)
            else:
                _elementwise(sch, block)
        return sch
