"""TE compute of a 3x3 stride-1 convolution by Winograd's minimal filtering F(2x2, 3x3).

``y[n, co, h, w] = sum_{ci, kh, kw} x[n, ci, h - pt + kh, w - pl + kw] * g[co, ci, kh, kw]`` (x
read as 0 outside the image) computed per 2x2 block of outputs (a *tile*) from the 4x4 window of x
under it: ``Y = A^T [sum_ci (G g G^T) (.) (B^T d B)] A`` (Lavin and Gray, *Fast Algorithms for
Convolutional Neural Networks*, 2016). The 16 products of a tile's transformed window and
transformed weight are 16 GEMMs of Cin, one per position ``xi = 4a + b`` of the 4x4 transform
domain: 16 multiplies per 4 outputs where the direct convolution takes 36 (2.25x fewer).

The same compute is the forward (``x``, ``g = w``) and the stride-1 dX (``x = dy``, ``g[ci, co]``
the weight rotated 180 degrees and transposed, the pads ``2 - p``): the caller gives the operands
as index functions, so it reads any layout in place.

Stages, sums in fp32 (``TH = ceil(Ho/2)``, ``TW = ceil(Wo/2)``, Cin and Cout whole 16-channel
blocks; the 16 transform positions ``xi`` next to the lanes, so that a tile's 16 rows lie together,
never a power of two apart in one cache set):

=============  ====================================  ===============================================
stage          shape                                 value
=============  ====================================  ===============================================
``wino_v``     ``(16, N, TH, Cin/16, TW, 16)``       ``B^T d B`` of tile ``(i, j)``'s window ``d``
                                                     (x rows ``2i - pt ..``, columns ``2j - pl ..``),
                                                     position ``xi`` outermost: see below
``wino_u``     ``(Cout/16, 16, Cin, 16)``            ``G g G^T`` of each (co, ci) weight (a sum over
                                                     the 9 taps), position ``xi`` outside the input
                                                     channels: see below
``wino_m``     ``(N, TH, Cout/16, TW, 16, 16)``      the mad (``Formulation.WINOGRAD``):
                                                     ``sum_ci wino_v[.., ci, .., xi, :] * wino_u[.., xi, ci, ..]``
``wino_y``     ``(N, TH, Cout/16, TW, 2, 2, 16)``    ``A^T m A`` of each tile (+ bias), ``res_dtype``
=============  ====================================  ===============================================

A GEMM of one position ``xi`` reads ``wino_u[co1, xi, :, :]``, each input channel's 16 Cout lanes
in turn: one contiguous run (16 KB at 256 channels). With the input channels outside the positions
(``(Cout/16, Cin, 16, 16)``) the run was 64 B lines 1 KB apart, all in 4 of a 64-set L1's sets, so
every pass of a register tile over the channels read them again from L2: Zen 3 (AVX2), N=8, dX
256 -> 256 on 14x14 (7 tiles a row: four tile passes a row) 16.8 -> 10.8 ms, 256 on 16x16 1.31x,
128 on 14x14 N=32 1.59x, 256 on 7x7 N=32 1.55x, the forward 1.27-1.46x; 8x8 maps (4 tiles a side)
0.91x, 28x28 and larger 0.95-1.06x. ``wino_v`` and the dW's ``wino_d`` likewise hold each position's
values together (a GEMM of one position walks its tiles' rows 64 B apart, not 1 KB apart in 4 L1
sets and 1/16 of L2's): an Emerald Rapids, the dW at N=8 NCHW, 128 channels on 28x28 22.7 -> 11.3
ms, 96 1.29x, 64 on 56x56 1.17x; the forward and dX 1.00-1.07x.

The output ``(n, h, w, co)`` is ``wino_y[n, h // 2, co // 16, w // 2, h % 2, w % 2, co % 16]``
(:func:`output_index`): a frontend's result stage reads it there, one to one where ``Ho`` and ``Wo``
are even, so a schedule folds it into ``wino_y``; an odd output (a 7x7 map: 4 x 4 tiles) leaves the
tiles' last row and column out, in a pass of its own. A frontend asks for it
with ``algorithm="winograd"`` (where it applies) or ``"auto"`` (where it also pays,
:func:`~.winograd_rules.winograd_pays`).

Error: each output is a sum of the same products as the direct convolution's, regrouped; in fp32
the transforms (``+-1`` and ``1/2``) add a few units in the last place per output (tests bound it
against the float64 reference).

**bf16 pairs** (``pairs``, what a ``vdpbf16ps`` target builds for a bf16 forward, dX or dW under
``algorithm="auto"`` where it pays: :func:`~.winograd_rules.paired_winograd_pays`): the transforms
stay fp32, then ``wino_vp (16, N, TH, Cin/16, TW, 8)`` and ``wino_up (Cout/16, 16, Cin/2, 16)``
hold ``wino_v`` and ``wino_u`` rounded to bf16 (to nearest, ties to even:
:func:`.pairs.rounded_pair`), two consecutive input channels a ``uint32`` word, and ``wino_m`` sums
:func:`.pairs.pair_dot` over the pairs in fp32 (``Formulation.WINOGRAD_BF16``; the dW pairs
consecutive tiles of ``wino_v`` and ``wino_d``: :func:`_paired_dw_mad`). Each product's two
operands are rounded once (relative 2^-8 each: bf16's unit roundoff), so an output is off by at most 2^-7 of the same
sums taken over the magnitudes (``tests/framework_cases.pair_winograd_bound``): on random data
(64 -> 64 on 16x16, N=8, weights 0.05 x N(0, 1)) 4.2e-3 of the result's RMS, against 1.7e-3 for
the exact path (its bf16 result's rounding) and 2.4e-3 for autocast's own rounding of fp32
activations and weights to bf16. Asked for by name (``"winograd"``) a bf16 call keeps the exact
form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tvm import te, tirx

from ...layout import C0
from .common import ACC
from .pairs import pair_dot, rounded_pair
from .stages import (
    FORMULATION,
    MAD_TAG,
    WINO_D,
    WINO_DP,
    WINO_DW,
    WINO_DYW,
    WINO_M,
    WINO_U,
    WINO_UP,
    WINO_V,
    WINO_VP,
    WINO_W,
    WINO_X,
    WINO_Y,
    Formulation,
)

__all__ = ["ALPHA", "WINOGRAD_DTYPES", "WinogradShape", "forward_shape", "input_grad_shape", "output_index", "weight_index", "input_tiles", "weight_tiles",
           "winograd_applies", "winograd_conv", "winograd_filter_grad"]

ALPHA = 4
"""Side of the transform domain: a 4x4 window per 2x2 outputs."""

# F(2x2, 3x3) (Lavin and Gray): the non-zeros of each row of B^T (4x4), G (4x3), A^T (2x4)
_BT = (((0, 1), (2, -1)), ((1, 1), (2, 1)), ((1, -1), (2, 1)), ((1, 1), (3, -1)))
_G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))
_AT = (((0, 1), (1, 1), (2, 1)), ((1, 1), (2, -1), (3, -1)))
_A = tuple(tuple((r, sign) for r, row in enumerate(_AT) for a_, sign in row if a_ == a) for a in range(ALPHA))  # the rows of A = (A^T)^T


@dataclass(frozen=True)
class WinogradShape:
    """One Winograd convolution: ``n`` images of ``cin`` channels on ``h x w`` in, ``cout`` out,
    3x3 at stride 1 with ``pads = (top, bottom, left, right)``."""

    n: int
    cin: int
    cout: int
    h: int
    w: int
    pads: tuple[int, int, int, int]

    @property
    def ho(self) -> int:
        return self.h + self.pads[0] + self.pads[1] - 2

    @property
    def wo(self) -> int:
        return self.w + self.pads[2] + self.pads[3] - 2

    @property
    def tiles(self) -> tuple[int, int]:
        """``(TH, TW)``: 2x2 output tiles per column and per row."""
        return (self.ho + 1) // 2, (self.wo + 1) // 2

    @property
    def flops(self) -> int:
        """The direct convolution's (what a user compares against)."""
        return 2 * self.n * self.ho * self.wo * self.cin * self.cout * 9


def forward_shape(geom) -> WinogradShape:
    """The Winograd convolution of a forward of ``geom`` (a :class:`~tvm_convgrad.params.geometry.ConvGeometry`)."""
    return WinogradShape(geom.batch, geom.cin, geom.cout, geom.h, geom.w, tuple(geom.pads))


def input_grad_shape(geom) -> WinogradShape:
    """The Winograd convolution of ``geom``'s stride-1 dX: dy's ``cout`` channels in, ``cin`` out,
    the pads ``2 - p`` (the weight rotated 180 degrees and transposed)."""
    return WinogradShape(geom.batch, geom.cout, geom.cin, geom.ho, geom.wo, tuple(2 - p for p in geom.pads))


WINOGRAD_DTYPES = (ACC, "bfloat16")
"""The tensor types F(2x2, 3x3) takes: fp32, and bf16 read widened to fp32 (the transforms and sums
in fp32, the result rounded once to its type)."""


def winograd_applies(geom, dtype: str, input_grad: bool = False) -> bool:
    """Whether the forward (``input_grad``: the dX) of ``geom`` can run as F(2x2, 3x3): one of
    :data:`WINOGRAD_DTYPES`, a 2-D 3x3 kernel at stride 1 without dilation or groups, pads of at
    most 2, whole 16-channel blocks each side, and an output of at least 2 x 2."""
    if dtype not in WINOGRAD_DTYPES or geom.depth is not None or (geom.kh, geom.kw) != (3, 3) or geom.strides != (1, 1) or geom.dilations != (1, 1):
        return False
    if geom.groups != 1 or geom.cin % C0 or geom.cout % C0 or not all(0 <= p <= 2 for p in geom.pads):
        return False
    shape = input_grad_shape(geom) if input_grad else forward_shape(geom)
    return shape.ho >= 2 and shape.wo >= 2


def output_index(n, h, w, co) -> tuple:
    """The ``wino_y`` index of output ``(n, h, w, co)``."""
    return n, h // 2, co // C0, w // 2, h % 2, w % 2, co % C0


def weight_index(co, ci, kh, kw) -> tuple:
    """The ``wino_w`` index of the weight gradient's ``(co, ci, kh, kw)``."""
    return co // C0, ci, kh, kw, co % C0


def _signed_sum(terms) -> tirx.PrimExpr:
    """``sum(sign * value)`` of ``(value, sign)`` pairs, signs +-1, without multiplies."""
    (first, sign), *rest = terms
    total = first if sign > 0 else -first
    for value, sign in rest:
        total = total + value if sign > 0 else total - value
    return total


def _g(row, tap) -> tirx.PrimExpr:
    """``G[row][tap]`` at run-time indices (a select chain of the constants)."""
    value = tirx.const(_G[3][2], ACC)
    for r in range(3, -1, -1):
        for k in range(2, -1, -1):
            if (r, k) != (3, 2):
                value = tirx.if_then_else(tirx.all(row == r, tap == k), tirx.const(_G[r][k], ACC), value)
    return value


def _by_position(xi, value_at: Callable[[int], tirx.PrimExpr]) -> tirx.PrimExpr:
    """``value_at(xi)`` for an index ``xi`` of the 16 transform positions: a select chain (``xi``
    is an outer loop of every stage, so each branch is taken by whole vectors)."""
    value = value_at(ALPHA * ALPHA - 1)
    for q in range(ALPHA * ALPHA - 2, -1, -1):
        value = tirx.if_then_else(xi == q, value_at(q), value)
    return value


def input_tiles(x_at: Callable, shape: WinogradShape, planar: bool = False) -> te.Tensor:
    """``wino_v (16, N, TH, Cin/16, TW, 16)``: ``B^T d B`` of each tile's 4x4 window ``d`` of the
    input (rows ``2i - pt ..``, columns ``2j - pl ..``, 0 outside it); ``x_at(n, c, r, col)`` reads
    the input at a position inside it, as fp32. Channel-planar input (``planar``: NCX, a vector's 16
    channels in 16 planes) is first copied into channel vectors, ``wino_x (N, 2TH + 2, Cin/16, 2TW
    + 2, 16)`` (x padded, by rows), which a schedule makes per task: each value gathered from its
    plane once, not once for each of the four windows that hold it (Zen 4, 64 -> 64 on 28x28 N=32:
    bf16 pairs' forward, dX and dW 1.08-1.36x, fp32 level to 1.07x; 256 channels and more level)."""
    th, tw = shape.tiles
    pt, _, pl, _ = shape.pads

    def padded_value(n, row, c1, col, c0):  # x at padded row and column, 0 outside x
        row, col = row - pt, col - pl
        inside = tirx.all(row >= 0, row < shape.h, col >= 0, col < shape.w)
        return tirx.if_then_else(inside, x_at(n, c1 * C0 + c0, row, col), tirx.const(0, ACC))

    value_at = te.compute((shape.n, 2 * th + 2, shape.cin // C0, 2 * tw + 2, C0), padded_value, name=WINO_X) if planar else padded_value

    def v_value(xi, n, i, c1, j, c0):
        def at(q):
            a, b = divmod(q, ALPHA)
            return _signed_sum((value_at(n, 2 * i + r, c1, 2 * j + col, c0), sr * sc) for r, sr in _BT[a] for col, sc in _BT[b])

        return _by_position(xi, at)

    return te.compute((ALPHA * ALPHA, shape.n, th, shape.cin // C0, tw, C0), v_value, name=WINO_V)


def weight_tiles(w_at: Callable, shape: WinogradShape) -> te.Tensor:
    """``wino_u (Cout/16, 16, Cin, 16)``: ``G g G^T`` of each 3x3 weight ``g`` (its Cout on the 16
    lanes), each position a constant combination of the taps (the 64 non-zero products of
    ``G``'s rows: the 16 share the nine loads), no sum over the taps in memory. ``w_at(co, ci, kh,
    kw)`` reads a weight as fp32."""

    def u_value(co1, xi, ci, co0):
        co = co1 * C0 + co0

        def at(q):
            a, b = divmod(q, ALPHA)
            total = None
            for kh in range(3):
                for kw in range(3):
                    coef = _G[a][kh] * _G[b][kw]
                    if coef:
                        term = w_at(co, ci, kh, kw) if coef == 1 else tirx.const(coef, ACC) * w_at(co, ci, kh, kw)
                        total = term if total is None else total + term
            return total

        return _by_position(xi, at)

    return te.compute((shape.cout // C0, ALPHA * ALPHA, shape.cin, C0), u_value, name=WINO_U)


def _rounded_pairs(shape, value_at: Callable, name: str) -> te.Tensor:
    """A stage of ``shape`` holding bf16 pairs (:func:`.pairs.rounded_pair`): ``value_at(*index, k)``,
    the fp32 value of the pair's ``k``-th channel (0 even, 1 odd), rounded to bf16."""

    def word(*index):
        return rounded_pair(value_at(*index, 0), value_at(*index, 1))

    return te.compute(shape, word, name=name)


def _paired_mad(v: te.Tensor, u: te.Tensor, shape: WinogradShape) -> te.Tensor:
    """``wino_m`` on bf16 pairs of input channels: ``wino_vp (16, N, TH, Cin/16, TW, 8)`` and
    ``wino_up (Cout/16, 16, Cin/2, 16)`` hold ``wino_v`` and ``wino_u`` rounded to bf16, two
    consecutive input channels a word, and the mad sums :func:`.pairs.pair_dot` over the pairs
    (``Formulation.WINOGRAD_BF16``: one ``vdpbf16ps`` per 16 Cout lanes of a pair)."""
    th, tw = shape.tiles
    half = C0 // 2
    vp = _rounded_pairs((ALPHA * ALPHA, shape.n, th, shape.cin // C0, tw, half),
                        lambda xi, n, i, c1, j, p, k: v[xi, n, i, c1, j, 2 * p + k], WINO_VP)  # fmt: skip
    up = _rounded_pairs((shape.cout // C0, ALPHA * ALPHA, shape.cin // 2, C0),
                        lambda co1, xi, p, co0, k: u[co1, xi, 2 * p + k, co0], WINO_UP)  # fmt: skip
    ci1 = te.reduce_axis((0, shape.cin // C0), name="ci1")
    cp = te.reduce_axis((0, half), name="cp")
    return te.compute(
        (shape.n, th, shape.cout // C0, tw, ALPHA * ALPHA, C0),
        lambda n, i, co1, j, xi, co0: te.sum(pair_dot(up[co1, xi, ci1 * half + cp, co0], vp[xi, n, i, ci1, j, cp]), axis=[ci1, cp]),
        name=WINO_M, tag=MAD_TAG, attrs={FORMULATION: Formulation.WINOGRAD_BF16.value},
    )


def winograd_conv(x_at: Callable, w_at: Callable, shape: WinogradShape, bias_at: Callable | None = None, res_dtype: str = ACC,
                  planar: bool = False, pairs: bool = False) -> te.Tensor:  # fmt: skip
    """``wino_y`` of the convolution of ``shape`` (see the module docstring). ``x_at(n, c, r, col)``
    reads the input at a position inside it (the compute guards the padding), ``w_at(co, ci, kh,
    kw)`` the weight, ``bias_at(co)`` the bias; every value fp32 (``planar``: :func:`input_tiles`).
    ``pairs``: the 16 GEMMs on bf16 pairs (:func:`_paired_mad`; see "bf16 pairs" in the module
    docstring)."""
    th, tw = shape.tiles
    cin1, cout1 = shape.cin // C0, shape.cout // C0
    v = input_tiles(x_at, shape, planar)

    u = weight_tiles(w_at, shape)
    if pairs:
        m = _paired_mad(v, u, shape)
    else:
        ci1 = te.reduce_axis((0, cin1), name="ci1")
        ci0 = te.reduce_axis((0, C0), name="ci0")
        m = te.compute(
            (shape.n, th, cout1, tw, ALPHA * ALPHA, C0),
            lambda n, i, co1, j, xi, co0: te.sum(v[xi, n, i, ci1, j, ci0] * u[co1, xi, ci1 * C0 + ci0, co0], axis=[ci1, ci0]),
            name=WINO_M, tag=MAD_TAG, attrs={FORMULATION: Formulation.WINOGRAD.value},
        )

    def y_value(n, i, co1, j, pr, pc, co0):
        def tile(r, c):
            return _signed_sum((m[n, i, co1, j, ALPHA * a + b, co0], sa * sb) for a, sa in _AT[r] for b, sb in _AT[c])

        value = tirx.if_then_else(pr == 0, tirx.if_then_else(pc == 0, tile(0, 0), tile(0, 1)), tirx.if_then_else(pc == 0, tile(1, 0), tile(1, 1)))
        if bias_at is not None:
            value = value + bias_at(co1 * C0 + co0)
        return value.astype(res_dtype)

    return te.compute((shape.n, th, cout1, tw, 2, 2, C0), y_value, name=WINO_Y)


def _paired_dw_mad(v: te.Tensor, d: te.Tensor, shape: WinogradShape, n, i) -> te.Tensor:
    """``wino_dw`` on bf16 pairs of tiles: ``wino_vp (16, N, TH, Cin/16, ceil(TW/2), 16)`` and ``wino_dp (16, N,
    TH, Cout/16, ceil(TW/2), 16)`` hold ``wino_v`` and ``wino_d`` rounded to bf16, tiles ``2p`` and ``2p + 1``
    of a row a word, and the mad sums :func:`.pairs.pair_dot` over the pairs (``Formulation.WINOGRAD_DW_BF16``:
    a ``vdpbf16ps`` per 16 Cout lanes, x's pair broadcast); ``n``, ``i``: the reduction's image and row axes."""
    th, tw = shape.tiles
    half = (tw + 1) // 2

    def tile_pairs(t: te.Tensor, c1: int, name: str) -> te.Tensor:
        def value(xi, n_, i_, c, p, c0, k):  # (an odd row's last pair: its second tile 0, t read inside its row)
            at = t[xi, n_, i_, c, tirx.min(2 * p + k, tw - 1) if tw % 2 else 2 * p + k, c0]
            return tirx.if_then_else(2 * p + k < tw, at, tirx.const(0, ACC)) if tw % 2 else at

        return _rounded_pairs((ALPHA * ALPHA, shape.n, th, c1, half, C0), value, name)

    vp, dp = tile_pairs(v, shape.cin // C0, WINO_VP), tile_pairs(d, shape.cout // C0, WINO_DP)
    p = te.reduce_axis((0, half), name="p")
    return te.compute(
        (shape.cout // C0, shape.cin, ALPHA * ALPHA, C0),
        lambda co1, ci, xi, co0: te.sum(pair_dot(dp[xi, n, i, co1, p, co0], vp[xi, n, i, ci // C0, p, ci % C0]), axis=[n, i, p]),
        name=WINO_DW, tag=MAD_TAG, attrs={FORMULATION: Formulation.WINOGRAD_DW_BF16.value},
    )


def winograd_filter_grad(x_at: Callable, dy_at: Callable, shape: WinogradShape, planar: bool = False, pairs: bool = False) -> te.Tensor:
    """``wino_w (Cout/16, Cin, 3, 3, 16)``, the weight gradient of the convolution of ``shape``
    (``dw[co, ci, kh, kw] = sum_{n, p, q} dy[n, co, p, q] * x[n, ci, p - pt + kh, q - pl + kw]``)
    by F(2x2, 3x3) transposed: per 2x2 tile of dy, ``dW = G^T [sum_tiles (A dy A^T) (.) (B^T d B)] G``
    (``d`` the tile's 4x4 window of x, :func:`input_tiles`), 16 GEMMs over the tiles.

    Stages: ``wino_v`` (x's windows), ``wino_d (16, N, TH, Cout/16, TW, 16)`` (``A dy A^T`` of each
    2x2 tile of dy, 0 past its edge), the mad ``wino_dw (Cout/16, Cin, 16, 16)`` (``Formulation.WINOGRAD_DW``,
    the sum over the tiles ``(n, i, j)``) and ``wino_w`` (``G^T m G``; weight ``(co, ci, kh, kw)`` at
    :func:`weight_index`). ``x_at(n, c, r, col)`` and
    ``dy_at(n, c, r, col)`` read the tensors at positions inside them, as fp32 (``planar``:
    :func:`input_tiles`); ``pairs``: the 16 GEMMs on bf16 pairs of tiles (:func:`_paired_dw_mad`)."""
    th, tw = shape.tiles
    cout1 = shape.cout // C0
    zero = tirx.const(0, ACC)
    v = input_tiles(x_at, shape, planar)

    def dy_value(n, i, co1, j, r, c, co0):  # dy at row r, column c of tile (i, j), 0 past an odd edge
        row, col = 2 * i + r, 2 * j + c
        conds = ([row < shape.ho] if shape.ho % 2 else []) + ([col < shape.wo] if shape.wo % 2 else [])
        value = dy_at(n, co1 * C0 + co0, row, col)
        return tirx.if_then_else(tirx.all(*conds), value, zero) if conds else value

    # (over NCX each tile's 2x2 of dy gathered once, a stage in registers: the tiles do not overlap, as x's windows do)
    dy_at_tile = te.compute((shape.n, th, cout1, tw, 2, 2, C0), dy_value, name=WINO_DYW) if planar else dy_value

    def d_value(xi, n, i, co1, j, co0):
        def at(q):
            a, b = divmod(q, ALPHA)
            return _signed_sum((dy_at_tile(n, i, co1, j, r, c, co0), sr * sc) for r, sr in _A[a] for c, sc in _A[b])

        return _by_position(xi, at)

    d = te.compute((ALPHA * ALPHA, shape.n, th, cout1, tw, C0), d_value, name=WINO_D)
    n = te.reduce_axis((0, shape.n), name="n")
    i = te.reduce_axis((0, th), name="i")
    if pairs:
        m = _paired_dw_mad(v, d, shape, n, i)
    else:
        j = te.reduce_axis((0, tw), name="j")
        m = te.compute(
            (cout1, shape.cin, ALPHA * ALPHA, C0),
            lambda co1, ci, xi, co0: te.sum(d[xi, n, i, co1, j, co0] * v[xi, n, i, ci // C0, j, ci % C0], axis=[n, i, j]),
            name=WINO_DW, tag=MAD_TAG, attrs={FORMULATION: Formulation.WINOGRAD_DW.value},
        )

    def w_value(co1, ci, kh, kw, co0):
        terms = [(_g(a, kh) * _g(b, kw)) * m[co1, ci, ALPHA * a + b, co0] for a in range(ALPHA) for b in range(ALPHA)]
        return sum(terms[1:], terms[0])

    return te.compute((cout1, shape.cin, 3, 3, C0), w_value, name=WINO_W)
