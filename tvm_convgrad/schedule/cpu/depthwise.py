"""Depthwise gradients on the CPU: 16 channels on the lanes, elementwise FMAs, each input streamed
once, instead of multiplying FracZ_g blocks that are 15/16 zeros.
"""

from __future__ import annotations

from ...layout import C0
from ..common import loop_extent
from .loops import CpuMad, sum_parts
from .tiles import MAX_TILE_PIXELS, MAX_WO_UNROLL, depthwise_dw_tile, depthwise_dx_tile, largest_divisor

__all__ = ["DepthwiseFilterGrad", "DepthwiseInputGrad"]


class DepthwiseFilterGrad(CpuMad):
    """Depthwise dW (``dw_dw``)."""

    def schedule(self, block):
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
        rows, vectors, unroll = depthwise_dw_tile(loop_extent(sch, kh), loop_extent(sch, kw), plan)
        lane_groups, c0 = self.split(c0, vectors * plan.lanes, C0)
        tiled = [kh, kw] if rows > 1 or loop_extent(sch, kh) == 1 else [kw]
        tasks = [q, c1, lane_groups] + ([kh] if tiled == [kw] else [])
        wo_o, wo_i = self.split(wo, largest_divisor(loop_extent(sch, wo), unroll), MAX_WO_UNROLL)
        count = 1
        for loop in tasks:
            count *= loop_extent(sch, loop)
        longest = max((n, ho), key=lambda lp: loop_extent(sch, lp))
        if count % self.cores and count < 8 * self.cores and loop_extent(sch, longest) >= 2 * self.cores:
            part, inner = sch.split(longest, [self.cores, None])
            reduce = [part, inner, ho] if longest is n else [n, part, inner]
            reduce.remove(part)
            sch.reorder(part, *tasks, *reduce, wo_o, wo_i, *tiled, c0)
            rf = sch.rfactor(part, 0)
            loops = sch.get_loops(rf)  # part, tasks, reduce (2), wo_o, wo_i, tiled, c0
            sch.parallel(loops[0])
            self.register_tile(rf, [loops[-2 - len(tiled)], *loops[-1 - len(tiled) : -1]], loops[-1], loops[1 + len(tasks)])
            sum_parts(sch, block)
            return
        sch.reorder(*tasks, n, ho, wo_o, wo_i, *tiled, c0)
        sch.parallel(sch.fuse(*tasks))
        self.register_tile(block, [wo_i, *tiled], c0, n)


class DepthwiseInputGrad(CpuMad):
    """One stride phase of depthwise dX (``dx_dw_<rh>_<rw>``)."""

    def schedule(self, block):
        """Depthwise dX phase (``dx_dw``): a tile is ``TH x TW`` pixels x a channel row (or part of
        it, :func:`depthwise_dx_tile`), the reduction ``(q, mh, mw)`` inside (LLVM unrolls the
        taps, sharing dy loads between neighbouring pixels and taps, and keeps the tile's weight
        vectors in registers across the pixel tiles)."""
        sch, plan = self.sch, self.plan
        *_, n, c1, j, i, c0, q, mh, mw = sch.get_loops(block)
        th, tw, v = depthwise_dx_tile(loop_extent(sch, j), loop_extent(sch, i), loop_extent(sch, mh), loop_extent(sch, mw), plan)
        most = min(MAX_TILE_PIXELS, plan.accumulators // v)
        j_o, j_i = self.split(j, th, most)
        i_o, i_i = self.split(i, tw, most)
        lane_groups, c0 = self.split(c0, v * plan.lanes, C0)
        sch.reorder(n, c1, lane_groups, j_o, i_o, q, mh, mw, j_i, i_i, c0)  # a lane group's weights stay in registers
        sch.parallel(sch.fuse(n, c1, lane_groups, j_o))
        self.register_tile(block, [j_i, i_i], c0, q)

