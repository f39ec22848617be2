"""Few input channels on the CPU: the lanes hold what is plentiful instead of 3 channels padded to 16.

* dW (:class:`CoutLanesFilterGrad`, ``dw_cc_t``): Cout on the lanes; a tile is taps x Cout
  vectors (:func:`.tiles.tap_tile`).
* dX (:class:`PixelLanesInputGrad`, ``dx_px_<rh>_<rw>``): output columns on the lanes; a tile is
  rows x every input channel.
"""

from __future__ import annotations

from ..common import loop_extent
from .loops import CpuMad, sum_parts
from .tiles import largest_divisor, tap_tile

__all__ = ["DY_BAND_BYTES", "CoutLanesFilterGrad", "PixelLanesInputGrad"]

DY_BAND_BYTES = 256 << 10
"""dy read by the Cout-on-lanes dW tiles per band of rows: within any x86 core's L2 beside the x rows."""


class CoutLanesFilterGrad(CpuMad):
    """dW with Cout on the lanes (``dw_cc_t``)."""

    def schedule(self, block):
        """dW with Cout on the lanes (``dw_cc_t[c, kh, kw, co]``): a tile is ``kw_i`` taps x
        ``co1_i`` Cout vectors, or x a part of one vector's registers (:func:`.tiles.tap_tile`), of
        one ``(c, kh)``, fed by one broadcast x value per tap and one dy vector per register,
        summing ``(ho, wo)`` in registers. The tasks walk the Cout parts outermost: consecutive
        tasks (and each core's share of them) read the same slice of dy.

        With a batch, each image is a separate partial dW (``rfactor`` over ``n``): the images
        run one after another, and the partials (``N`` small dWs: this layout is for few input
        channels) are summed after. An image's dy is read by every tile, so it is read in bands
        of rows (:data:`DY_BAND_BYTES`, the tiles' partial sums kept in the result between bands)
        that stay in cache while all the tiles read them: a stem's 112x112x64 dy is 3 MB.
        """
        sch = self.sch
        c, kh, kw, co, n, ho, wo = sch.get_loops(block)
        row_bytes = loop_extent(sch, wo) * loop_extent(sch, co) * 4
        co1, co0 = sch.split(co, [None, 16])
        taps, vectors, registers = tap_tile(loop_extent(sch, kw), loop_extent(sch, co1), self.plan)
        kw_o, kw_i = self.split(kw, taps, taps)
        co1_o, co1_i = self.split(co1, vectors, vectors)
        parts, co0 = sch.split(co0, [None, 16 * registers // self.plan.registers_per_row])
        band = largest_divisor(loop_extent(sch, ho), DY_BAND_BYTES // row_bytes)
        bands = [] if band == loop_extent(sch, ho) else list(sch.split(ho, [None, band]))
        rows = bands or [ho]  # (band, rows of a band), or the rows
        batched = loop_extent(sch, n) > 1
        if batched:
            sch.reorder(n, *rows[:-1], parts, co1_o, c, kh, kw_o, rows[-1], wo, kw_i, co1_i, co0)
            mad = sch.rfactor(n, 0)
            n, *rows, parts, co1_o, c, kh, kw_o, row, wo, kw_i, co1_i, co0 = sch.get_loops(mad)
            rows.append(row)
        else:
            sch.reorder(*rows[:-1], parts, co1_o, c, kh, kw_o, n, rows[-1], wo, kw_i, co1_i, co0)
            mad = block
        sch.parallel(sch.fuse(parts, co1_o, c, kh, kw_o))
        self.register_tile(mad, [kw_i, co1_i], co0, rows[0] if batched or bands else n)  # the outermost reduction loop
        if batched:
            sum_parts(sch, block)


class PixelLanesInputGrad(CpuMad):
    """One stride phase of dX with output columns on the lanes (``dx_px_<rh>_<rw>``)."""

    def schedule(self, block):
        """dX with output columns on the lanes (``dx_px``): a tile is 16 columns (fewer where a
        row of every channel would not fit the registers) x ``j_i`` rows x every input channel;
        per ``(co, mh, mw)`` one dy vector per row, used at once by every channel's broadcast
        weight (so one dy vector is live at a time, the channels' weights for the whole tile)."""
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
