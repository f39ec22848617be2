"""bf16 pairs: two bf16 values of consecutive reduction steps in one 32-bit word, the operand
layout of AVX512-BF16's ``vdpbf16ps`` (and of AMX-BF16's tiles).

``vdpbf16ps acc, a, b`` adds, in each fp32 lane ``i``, ``a[2i+1]*b[2i+1]`` and then ``a[2i]*b[2i]``:
the reduction runs in pairs whose two bf16 values sit side by side. The bf16 computes
(:mod:`.backprop_filter`, :mod:`.backprop_input`) pack their inputs that way, one ``uint32`` per
pair (:data:`PAIR_DTYPE`; low half the even step, high half the odd one), and their mads sum
:func:`pair_dot` over the pairs. The schedule of a target with the instruction replaces 16 lanes
of that sum by one ``vdpbf16ps`` (:mod:`tvm_convgrad.schedule.cpu.bf16`); :func:`pair_dot` is also
the tensor intrinsic's description, so the two cannot disagree.

=========================  ==========================================================
stage (bf16 pairs)         shape, ``uint32``
=========================  ==========================================================
dW ``grads_2_matrix``      ``(N, C1y, Ho, ceil(Wo/2), 16)``: dy at ``(wo, wo+1) = (2p, 2p+1)``
                           (0 past ``Wo``), one word per Cout lane (the broadcast operand)
dW ``fmap_l1``             ``(N, C1x, PH, PW, Hq, S, 16)``: x at packed columns ``(s, s+1)``
                           for every start ``s`` (a tap's odd column offset starts odd); the
                           pairs of images, and the AMX tile plan's layout: :mod:`.dw_pairs`
dX ``dy_pad``              ``(N, C1y, Hy, Wy, 8)``: dy channels ``(2q, 2q+1)`` of a block
dX ``w_col``               ``(C1x, C1y, KH, KW, 8, 16)``: the weights of Cout ``(2q, 2q+1)``
=========================  ==========================================================
"""

from __future__ import annotations

from tvm import tirx

from ...layout import largest_divisor

__all__ = ["AMX_PAIRS_PER_ROW", "PAIR_DTYPE", "amx_tile_depth", "pair", "pair_dot", "rounded_pair"]

PAIR_DTYPE = "uint32"
"""One bf16 pair: the even reduction step's bits in the low half, the odd one's in the high half."""
AMX_PAIRS_PER_ROW = 16
"""bf16 pairs in an AMX tile row (64 bytes): a ``tdpbf16ps`` reduces at most 16 pairs of each row."""


def amx_tile_depth(pairs: int) -> int:
    """The pairs one ``tdpbf16ps`` reduces of a run of ``pairs``: their largest divisor up to
    :data:`AMX_PAIRS_PER_ROW` (whole tiles, none partial)."""
    return largest_divisor(pairs, AMX_PAIRS_PER_ROW)


_HALF = 16
_HIGH = 0xFFFF0000


def pair(even, odd):
    """The ``uint32`` word of two bf16 values (TE expressions). Each is read as the fp32 it widens
    to exactly (its bits in the upper half, as TVM's bf16 legalization does; a ``reinterpret`` of
    a bf16 vector does not legalize)."""

    def widened(value):
        return tirx.reinterpret(PAIR_DTYPE, value.astype("float32"))

    return (widened(even) >> tirx.const(_HALF, PAIR_DTYPE)) | (widened(odd) & tirx.const(_HIGH, PAIR_DTYPE))


def rounded_pair(even, odd):
    """The ``uint32`` word of two fp32 values (TE expressions) each rounded to bf16, to nearest
    with ties to even, in integer arithmetic: the bits plus ``0x7FFF`` plus the kept part's lowest
    bit, the upper half kept. (A cast to bf16 and back, as :func:`pair` reads its values, folds
    away before TVM's bf16 legalization: the word would keep the values' upper halves, truncated.)"""
    half, high = tirx.const(_HALF, PAIR_DTYPE), tirx.const(_HIGH, PAIR_DTYPE)

    def rounded(value):
        bits = tirx.reinterpret(PAIR_DTYPE, value)
        return bits + tirx.const(0x7FFF, PAIR_DTYPE) + ((bits >> half) & tirx.const(1, PAIR_DTYPE))

    return (rounded(even) >> half) | (rounded(odd) & high)


def pair_dot(a, b):
    """``a.even*b.even + a.odd*b.odd`` in fp32 for two pair words (each bf16 widened exactly by
    placing its bits in the upper half of an fp32). ``a`` is the vector operand (16 lanes of a
    row), ``b`` the one broadcast to every lane."""
    half, high = tirx.const(_HALF, PAIR_DTYPE), tirx.const(_HIGH, PAIR_DTYPE)

    def even(word):
        return tirx.reinterpret("float32", word << half)

    def odd(word):
        return tirx.reinterpret("float32", word & high)

    return even(a) * even(b) + odd(a) * odd(b)
