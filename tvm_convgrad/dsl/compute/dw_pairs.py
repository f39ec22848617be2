"""dW's bf16-pair packs (:mod:`.pairs`): how the cube's reduction ``(n, ho, wo)`` is taken in pairs.

=================  =====================================================  ===============================
pairs along        ``grads_2_matrix``, ``fmap_l1`` (``uint32``)            when
=================  =====================================================  ===============================
images             ``(N/2, C1y, Ho, Wo, 16)``, ``(N/2, C1x, PH, PW, Hq,     2-D, even batch, where column
                   Wq, 16)``: images ``(2m, 2m+1)``                        pairs would cost: odd ``Wo`` (a
                                                                          column wasted per row) or an
                                                                          odd tap offset (x stored at
                                                                          every start: twice the pack)
columns            ``(N, C1y, Ho, ceil(Wo/2), 16)``: dy at ``(2p, 2p+1)``   otherwise (e.g. 1x1 kernels)
                   (0 past ``Wo``); ``(N, C1x, PH, PW, Hq, S, 16)``: x at
                   ``(s, s+1)`` for every start ``s = 2p + qw`` a tap
                   reads (the even ones only where every offset is even)
columns, AMX       dy ``(N, C1y, Ho, 16, ceil(Wo/2))``: a Cout lane's       an AMX-BF16 target's 2-D dW
                   pairs in a row (the ``A`` tile); x as above (``B``)
images, AMX        dy ``(Ho, C1y, Wo, 16, N/2)``: a Cout lane's image      an AMX-BF16 target's 2-D dW of
                   pairs in a row (``A``); x ``(Hq, C1x, PH, PW, Wq,        an even batch where a tile's
                   N/2, 16)``: an image pair's 16 Cin a row (``B``)         rows of image pairs take fewer
                                                                          ``tdpbf16ps`` than of columns
                                                                          (small maps: :func:`amx_images`)
=================  =====================================================  ===============================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tvm import te, tirx

from ...layout import C0
from .common import guarded
from .pairs import amx_tile_depth, pair
from .stages import FMAP_L1, GRADS_2_MATRIX

__all__ = ["PAIR_IMAGES", "PairPacks", "amx_images", "column_pairs", "pair_packs"]


@dataclass(frozen=True)
class PairPacks:
    """The packs, the reduction axes, and where a step reads them: ``dy_at(n, c1, ho, wo, co0)``,
    ``x_at(plane, c1, rh, rw, hq, column, c0)`` at x's packed column ``x_column(wo, qw)`` (column
    offset ``qw``; ``x_step``: the column step between consecutive ``wo``), the mad's reduction
    ``axes(ho)`` in the order a step's tile reads them (the pairs innermost on AMX)."""

    grads: te.Tensor
    fmap_l1: te.Tensor
    n: tirx.IterVar
    wo: tirx.IterVar
    x_column: Callable
    x_step: int
    amx: bool
    amx_images: bool = False

    def dy_at(self, n, c1, ho, wo, co0):
        if self.amx_images:
            return self.grads[ho, c1, wo, co0, n]
        return self.grads[n, c1, ho, co0, wo] if self.amx else self.grads[n, c1, ho, wo, co0]

    def x_at(self, plane, c1, rh, rw, hq, column, c0):
        if self.amx_images:
            return self.fmap_l1[hq, c1, rh, rw, column, plane, c0]
        return self.fmap_l1[plane, c1, rh, rw, hq, column, c0]

    def axes(self, ho: tirx.IterVar) -> list:
        return [ho, self.wo, self.n] if self.amx_images else [self.n, ho, self.wo]


def column_pairs(value: Callable, wo: int) -> Callable:
    """dy's pair of output columns ``(2p, 2p+1)`` (the odd one 0 past ``wo``) as
    ``dy_pair(nd, c1, ho, p, c0)``, from ``value(nd, c1, ho, wo, c0)``."""

    def dy_pair(nd, c1, ho, p, c0):
        odd = guarded([2 * p + 1 < wo] if wo % 2 else [], value(nd, c1, ho, tirx.min(2 * p + 1, wo - 1), c0))
        return pair(value(nd, c1, ho, 2 * p, c0), odd)

    return dy_pair


PAIR_IMAGES = True
"""bf16 dW: an even batch pairs images where column pairs would cost (else columns)."""


def amx_images(batch: int, ho: int, wo: int, even: bool = False) -> bool:
    """Whether an AMX dW of an even ``batch`` takes its pairs along the images: a tile multiply per
    output pixel of ``batch/2`` pairs, against one per image and row of ``ceil(wo/2)`` column pairs.
    Where column pairs store x twice (an odd tap offset: every start) fewer multiplies decide; where
    every offset is ``even`` (x once, as along the images) half as many at most, since the image
    pairs' packs gather across images (a 16 -> 96 1x1 on 56x56 at N=32: 3.2 ms on image pairs, 2.2
    on columns, for 12% fewer multiplies). On a 4x4 map at N=32 a column tile reduces 2 pairs, an
    image tile 16 (the 512 -> 512 3x3 of ResNet-18 at 112x112: 6.5 -> 2.2 ms)."""
    if batch % 2:
        return False
    half, pairs = batch // 2, -(-wo // 2)
    images, columns = ho * wo * (half // amx_tile_depth(half)), batch * ho * (pairs // amx_tile_depth(pairs))
    return 2 * images <= columns if even else images < columns


def pair_packs(grads_value, fmap_value, fold, c1_grads: int, c1_fmap: int, rows, cols, g, amx: bool = False) -> PairPacks:
    """The bf16-pair packs of the cube (:mod:`.pairs`), the reduction axes ``n`` and ``wo``, and
    where a step at column offset ``qw`` reads x's pack, with the pairs along one of two axes.

    * ``wo``: dy's columns ``(2p, 2p+1)`` (0 past ``Wo``) and x's packed columns ``(s, s+1)`` for
      every start ``s = 2p + qw`` a tap reads (the odd half past the packed row is 0). Where every
      offset is even (1x1 kernels, strided ones too) only the even starts are read, and only
      those are stored (``s = 2 * index``).
    * An even batch (2-D) where column pairs cost: an odd ``Wo`` (a column in ``Wo + 1`` wasted)
      or an odd tap offset (x stored at both parities of start): images ``(2m, 2m+1)``, both
      packs the fp32 cube's shapes with half the images (on a 2-core Zen 4, 3x3 layers at N=8
      1.02-1.23x, 7x7 ones 1.1-1.5x faster than column pairs).

    ``amx``: dy's pairs in rows (the AMX tile plan's layout), along the images where
    :func:`amx_images` says so (every step's ``B`` tile 16 image pairs of one x pixel), else the columns."""
    offsets = [cols.of_tap(k)[1] for k in range(g.kw)]
    even = all(q % 2 == 0 for q in offsets)
    if amx and g.depth is None and amx_images(fold.dy_extent, g.ho, g.wo, even):
        half = fold.dy_extent // 2
        grads = te.compute(
            (g.ho, c1_grads, g.wo, C0, half),
            lambda ho, c1, wo, c0, m: pair(grads_value(2 * m, c1, ho, wo, c0), grads_value(2 * m + 1, c1, ho, wo, c0)),
            name=GRADS_2_MATRIX,
            tag=GRADS_2_MATRIX,
        )
        fmap_l1 = te.compute(
            (rows.per_phase, c1_fmap, rows.phases, cols.phases, cols.per_phase, half, C0),
            lambda hq, c1, rh, rw, wq, m, c0: pair(*(fmap_value(n, c1, rh, rw, hq, wq, c0) for n in (2 * m, 2 * m + 1))),
            name=FMAP_L1,
            tag=FMAP_L1,
        )
        n, wo = te.reduce_axis((0, half), name="n"), te.reduce_axis((0, g.wo), name="wo")
        return PairPacks(grads, fmap_l1, n, wo, lambda wo, qw: wo + qw, 1, True, amx_images=True)
    if PAIR_IMAGES and not amx and g.depth is None and fold.dy_extent % 2 == 0 and (g.wo % 2 or not even):
        half = fold.dy_extent // 2
        grads = te.compute(
            (half, c1_grads, g.ho, g.wo, C0),
            lambda m, c1, ho, wo, c0: pair(grads_value(2 * m, c1, ho, wo, c0), grads_value(2 * m + 1, c1, ho, wo, c0)),
            name=GRADS_2_MATRIX,
            tag=GRADS_2_MATRIX,
        )
        fmap_l1 = te.compute(
            (half, c1_fmap, rows.phases, cols.phases, rows.per_phase, cols.per_phase, C0),
            lambda m, *i: pair(fmap_value(2 * m, *i), fmap_value(2 * m + 1, *i)),
            name=FMAP_L1,
            tag=FMAP_L1,
        )
        n, wo = te.reduce_axis((0, half), name="n"), te.reduce_axis((0, g.wo), name="wo")
        return PairPacks(grads, fmap_l1, n, wo, lambda wo, qw: wo + qw, 1, False)
    pairs_out = -(-g.wo // 2)
    dy_pair = column_pairs(grads_value, g.wo)
    if amx:
        grads = te.compute((fold.dy_extent, c1_grads, g.ho, C0, pairs_out), lambda nd, c1, ho, c0, p: dy_pair(nd, c1, ho, p, c0),
                           name=GRADS_2_MATRIX, tag=GRADS_2_MATRIX)  # fmt: skip
    else:
        grads = te.compute((fold.dy_extent, c1_grads, g.ho, pairs_out, C0), dy_pair, name=GRADS_2_MATRIX, tag=GRADS_2_MATRIX)
    starts = pairs_out + max(offsets) // 2 if even else 2 * pairs_out - 1 + max(offsets)
    last = cols.per_phase - 1
    beyond = (2 * starts - 1 if even else starts) > last  # the last pair's odd half is past the packed row

    def x_pair(npad, c1, rh, rw, hq, index, c0):
        s = 2 * index if even else index
        odd = fmap_value(npad, c1, rh, rw, hq, tirx.min(s + 1, last), c0)
        return pair(fmap_value(npad, c1, rh, rw, hq, s, c0), guarded([s + 1 <= last] if beyond else [], odd))

    fmap_l1 = te.compute((fold.fmap_extent, c1_fmap, rows.phases, cols.phases, rows.per_phase, starts, C0), x_pair, name=FMAP_L1, tag=FMAP_L1)

    def x_column(p, qw):
        return p + qw // 2 if even else 2 * p + qw

    n, wo = te.reduce_axis((0, fold.dy_extent), name="n"), te.reduce_axis((0, pairs_out), name="wo")
    return PairPacks(grads, fmap_l1, n, wo, x_column, 1 if even else 2, amx)
