"""Depthwise gradients (``Cin/groups == 1``, any channel multiplier ``m = Cout/groups``) and the
depthwise forward of multiplier 1: channels on the lanes, no zero lane multiplied.

TBE packs depthwise groups 16 to a FracZ_g block (``multiple = min(16, groups)`` slots), so the
cube would multiply 16 x 16 blocks of which only the diagonal is the gradient: 15 of 16 FMAs
spent on zero weights (dX) or on cross-group correlations nobody reads (dW). Here the 16 lanes
are 16 channels of a 5HD block: x's channel ``c`` meets dy's channels ``c*m + q``, an
elementwise product of two 16-lane vectors, both read in 5HD order, each input streamed once.

=====================  ===========================================  ====================================
stage                  shape                                        value
=====================  ===========================================  ====================================
``grads_dw``           ``(N, m, C1x, Ho, Wo, 16)`` fp32             dW: ``dy[n, c*m + q, ho, wo]`` at lane
                                                                    ``c`` (``convert_in_place`` when
                                                                    ``m == 1``: it is dy itself)
``fmap_dw``            ``(N, C1x, Hr, Wr, 16)`` fp32                dW: x with the zero padding the taps
                                                                    reach (``convert_in_place`` when
                                                                    there is none)
``dw_dw``              ``(m, C1x, KH, KW, 16)`` fp32                ``sum_{n,ho,wo} grads_dw[n, q, c1,
                                                                    ho, wo, c0] * fmap_dw[n, c1, ho*sh +
                                                                    kh*dh, wo*sw + kw*dw, c0]``
``dy_dw``              ``(N, m, C1x, Hy, Wy, 16)`` fp32             dX: dy by multiplier, zero-padded as
                                                                    far as the phases' taps reach
``w_dw``               ``(m, C1x, KH, KW, 16)`` fp32                dX: the diagonal of the FracZ_g
                                                                    weight, ``W[c*m + q, 0, kh, kw]`` at
                                                                    lane ``c``
``dx_dw_{rh}_{rw}``    ``(N, C1x, H_rh, W_rw, 16)`` fp32            one stride phase: ``sum_{q,mh,mw}
                                                                    dy_dw[.., j + off_h(mh), i +
                                                                    off_w(mw), c0] * w_dw[q, c1, kh(mh),
                                                                    kw(mw), c0]``
``conv_dw``            ``(N, C1x, Ho, Wo, 16)`` fp32                the forward (``m == 1``): ``sum_{kh,kw}
                                                                    xpad[n, c1, j*sh + kh*dh, i*sw +
                                                                    kw*dw, c0] * w_dw[0, c1, kh, kw, c0]``
                                                                    (x padded as the cube's forward pads
                                                                    it: :func:`.conv._fmap_pad`)
=====================  ===========================================  ====================================

**dW result.** TBE's ``(real_g, KH*KW, cout_g, 16)`` holds the gradient on each block's diagonal
(``co_l // m == ci0``, the slot's own channels); the other entries of a block pair channels of
different groups. TBE's cube computes them (genuine cross-group correlations that every consumer
ignores: TBE's own GOLD marks them "don't care"); this path writes 0 there, which is what makes
it 16x cheaper. Every entry a consumer reads is the same.
"""

from __future__ import annotations

from typing import Callable

from tvm import te, tirx

from ... import layout
from ...layout import C0
from ...params import ConvGradParams
from .common import ACC, guarded, in_place, inside
from .phases import AxisPhase, DyWindow, phase_stage_name
from .stages import CONV_DW, DW_DW, DX_DW, DY_DW, FMAP_DW, FORMULATION, GRADS_DW, MAD_TAG, READ_IN_PLACE, W_DW, Formulation

__all__ = ["DY_IN_PLACE", "depthwise", "depthwise_channels", "depthwise_filter_grad", "depthwise_forward", "depthwise_input_phases"]

DY_IN_PLACE = True
"""The depthwise dW reads an fp32 dy's 16-channel rows where they lie (NXC, 5HD; multiplier 1,
whole channel blocks): the pack only copied them, dy needs no padding (x's pack stays, for its
halo). Zen 4, 2 cores, N=32, NXC, ms, packed / in place, the kernel alone, inputs flushed from the
caches before each call: 144 channels on 28x28 1.57 / 1.30, 192 on 14x14 0.55 / 0.47, 576 on 7x7
0.51 / 0.42, 960 on 4x4 0.19 / 0.17, 32 on 56x56 and the stride-2 96 on 56x56 level (1.51 / 1.54,
2.22 / 2.24); hot, 1.09-1.50x."""


def depthwise(params: ConvGradParams) -> bool:
    """Whether the gradient takes the depthwise path: one input channel per group, several groups (2-D)."""
    return params.geom.cin_g == 1 and params.geom.groups > 1 and params.geom.depth is None


def _by_multiplier(dy: te.Tensor, params: ConvGradParams, shape, index, name: str, attrs=None) -> te.Tensor:
    """dy with the input channel ``c`` on the lanes and the multiplier ``q`` as an axis:
    ``[n, q, c1, y, x, c0] = dy[n, (c1*16 + c0)*m + q, index(y, x)]`` (0 where ``index`` says
    the position is padding or the lane is past Cin)."""
    g = params.geom
    m = g.cout_g

    def value(n, q, c1, y, x, c0):
        conds, (i, j) = index(y, x)
        if m == 1:  # dy's own layout
            return guarded(conds, dy[n, c1, i, j, c0].astype(ACC))
        c = c1 * C0 + c0
        channel = c * m + q
        conds = conds + ([c < g.cin] if g.c1_x * C0 > g.cin else [])
        return guarded(conds, dy[n, channel // C0, i, j, channel % C0].astype(ACC))

    return te.compute(shape, value, name=name, tag=name, attrs=attrs)


def depthwise_filter_grad(fmap: te.Tensor, dy: te.Tensor, params: ConvGradParams, rows_in_place: bool = False):
    """dW: ``(dw_dw, value)`` with ``value(e, fkk, co_l, ci0)`` the TBE result entry.
    ``rows_in_place``: dy's 16-channel rows lie contiguous (NXC or 5HD, not NCX); an fp32 dy of
    multiplier 1 and whole channel blocks is then read where it lies (:data:`DY_IN_PLACE`)."""
    g = params.geom
    m = g.cout_g
    (sh, sw), (dil_h, dil_w), (pt, _, pl, _) = g.strides, g.dilations, g.pads
    dy_rows = DY_IN_PLACE and rows_in_place and m == 1 and dy.dtype == ACC and g.cout % C0 == 0
    grads = _by_multiplier(
        dy, params, (g.batch, m, g.c1_x, g.ho, g.wo, C0), lambda y, x: ([], (y, x)), GRADS_DW,
        {READ_IN_PLACE: 1} if dy_rows else in_place(dy, m == 1),
    )  # fmt: skip
    reach = ((g.ho - 1) * sh + g.kh_dilated, (g.wo - 1) * sw + g.kw_dilated)

    def fmap_value(n, c1, i, j, c0):
        conds = inside((i, j), (pt, pl), (g.h, g.w), reach)
        return guarded(conds, fmap[n, c1, i - pt, j - pl, c0].astype(ACC))

    direct = not any(g.pads) and reach[0] <= g.h and reach[1] <= g.w
    fmap_dw = te.compute((g.batch, g.c1_x, *reach, C0), fmap_value, name=FMAP_DW, tag=FMAP_DW, attrs=in_place(fmap, direct))
    n = te.reduce_axis((0, g.batch), name="n")
    ho = te.reduce_axis((0, g.ho), name="ho")
    wo = te.reduce_axis((0, g.wo), name="wo")
    dw = te.compute(
        (m, g.c1_x, g.kh, g.kw, C0),
        lambda q, c1, kh, kw, c0: te.sum(
            grads[n, q, c1, ho, wo, c0] * fmap_dw[n, c1, ho * sh + kh * dil_h, wo * sw + kw * dil_w, c0],
            axis=[n, ho, wo],
        ),
        name=DW_DW,
        tag=MAD_TAG,
        attrs={FORMULATION: Formulation.DEPTHWISE_DW.value},
    )
    mag = g.group.multiple

    def value(e, fkk, co_l, ci0):
        _, kh, kw = layout.split_fracz_row(fkk, g.kh, g.kw)
        channel = e * mag + ci0  # the group (= x channel) of slot ci0
        own = tirx.all(co_l // m == ci0, ci0 < mag, channel < g.groups)
        return te.if_then_else(own, dw[co_l % m, channel // C0, kh, kw, channel % C0], tirx.const(0.0, ACC))

    return dw, value


def _diagonal(filters: te.Tensor, params: ConvGradParams) -> te.Tensor:
    """``w_dw (m, C1x, KH, KW, 16)``: the diagonal of the FracZ_g weight, ``W[c*m + q, 0, kh, kw]``
    at lane ``c`` of block ``c1`` (0 past Cin)."""
    g = params.geom
    m, mag = g.cout_g, g.group.multiple

    def weight(q, c1, kh, kw, c0):
        channel = c1 * C0 + c0  # the group; its slot j in extended group e holds FracZ_g column j*m + q, lane j
        e, j = channel // mag, channel % mag
        co_l = j * m + q
        row = layout.fracz_row(e, kh, kw, g.kh, g.kw)  # cin1_g == 1: one C1 row block per extended group
        conds = [channel < g.cin] if g.c1_x * C0 > g.cin else []
        return guarded(conds, filters[row, co_l // C0, co_l % C0, j].astype(ACC))

    return te.compute((m, g.c1_x, g.kh, g.kw, C0), weight, name=W_DW, tag=W_DW)


def depthwise_channels(params: ConvGradParams) -> bool:
    """Whether the forward takes :func:`depthwise_forward`: 2-D, one input and one output channel per group."""
    return depthwise(params) and params.geom.cout_g == 1


def depthwise_forward(read_x: Callable, filters: te.Tensor, params: ConvGradParams) -> Callable:
    """The forward of a depthwise layer of multiplier 1 (:func:`depthwise_channels`), channels on
    the lanes: ``conv_dw (N, C1x, Ho, Wo, 16) = sum_{kh, kw} x[n, c1, j*sh + kh*dh, i*sw + kw*dw, c0] *
    w_dw[0, c1, kh, kw, c0]`` (``read_x(lead, c1, kh, kw, j, i, c0)``: the padded x, see
    :func:`.conv._fmap_pad`), ``Formulation.DEPTHWISE_CHANNELS_FWD``: 9 FMAs of two 16-lane vectors
    per 16 outputs of a 3x3, where the cube multiplies 16 x 16 FracZ_g blocks of which only the
    diagonal is the layer's. Its axes are a dX phase's (a reduction ``q`` of one multiplier), so
    the dX phase's schedule takes it. Returns the ``sums(row, block, h, w, c0)`` the result reads."""
    g = params.geom
    w_dw = _diagonal(filters, params)
    q = te.reduce_axis((0, 1), name="q")
    kh = te.reduce_axis((0, g.kh), name="kh")
    kw = te.reduce_axis((0, g.kw), name="kw")
    conv_dw = te.compute(
        (g.batch, g.c1_x, g.ho, g.wo, C0),
        lambda n, c1, j, i, c0: te.sum(read_x((n,), c1, kh, kw, j, i, c0) * w_dw[q, c1, kh, kw, c0], axis=[q, kh, kw]),
        name=CONV_DW,
        tag=MAD_TAG,
        attrs={FORMULATION: Formulation.DEPTHWISE_CHANNELS_FWD.value},
    )
    return lambda row, block, h, w, c0: conv_dw[row, block, h, w, c0]


def depthwise_input_phases(filters: te.Tensor, dy: te.Tensor, params: ConvGradParams, grid, window: DyWindow):
    """dX: one ``dx_dw`` mad per stride phase, channels on the lanes; ``(phases, read)`` as the
    other dX formulations return them."""
    g = params.geom
    m = g.cout_g
    top, left = window.top, window.left
    dy_dw = _by_multiplier(
        dy, params, (g.batch, m, g.c1_x, *window.shape, C0), lambda y, x: (window.conds(y, x), (y - top, x - left)), DY_DW
    )
    w_dw = _diagonal(filters, params)

    def phase_mad(ph: AxisPhase, pw: AxisPhase) -> te.Tensor:
        q = te.reduce_axis((0, m), name="q")
        mh = te.reduce_axis((0, ph.taps), name="mh")
        mw = te.reduce_axis((0, pw.taps), name="mw")
        return te.compute(
            (g.batch, g.c1_x, ph.count, pw.count, C0),
            lambda n, c1, j, i, c0: te.sum(
                dy_dw[n, q, c1, ph.dy_index(j, mh, top), pw.dy_index(i, mw, left), c0] * w_dw[q, c1, ph.tap(mh), pw.tap(mw), c0],
                axis=[q, mh, mw],
            ),
            name=phase_stage_name(ph, pw, DX_DW),
            tag=MAD_TAG,
            attrs={FORMULATION: Formulation.DEPTHWISE_DX.value},
        )

    phases = [(ph, pw, phase_mad(ph, pw)) for ph, pw in grid]
    return phases, lambda mad, n, c1, j, i, c0: mad[n, c1, j, i, c0]
