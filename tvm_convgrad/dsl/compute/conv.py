"""TE compute of the forward convolution (TBE's ``conv``) on a 5HD fmap and a FracZ(_g) weight.

``y[n, co, ho, wo] = sum_{ci, kh, kw} x[n, g*Cin_g + ci, ho*sh - pt + kh*dh, wo*sw - pl + kw*dw] *
w[co, ci, kh, kw]`` (``g`` the group of ``co``; x read as 0 outside the image): the cube's third GEMM,
on the pixel-tile schedule of the dX phases (a tile of output pixels x 16 output channels on the
lanes, each reduction step one weight row times the tile's broadcast x values).

Stages, sums in fp32:

==============  ============================================  =============================================
stage           shape                                         value
==============  ============================================  =============================================
``fmap_pad``    ``(N, g_extend*cin1_g, Hp, Wp, 16)``          x with the zero rows / columns the taps reach,
                                                              fp32 (left out where there is no padding
                                                              and x is fp32 already: the mad reads x)
``w_conv``      ``(g_extend*cout1_g, cin1_g, KH, KW, 16, 16)`` the FracZ weight, ``[.., ci0, co0]`` (a row
                                                              of 16 output channels per input lane)
``conv_cc``     ``(N, g_extend*cout1_g, Ho, Wo, 16)``         the mad (``Formulation.CUBE_FWD``)
``C``           ``(N, ceil(Cout,16), Ho*Wo, 16)``             each output channel from its extended group
                                                              (+ bias), ``res_dtype``, tag
                                                              ``convolution_C`` (TBE's)
==============  ============================================  =============================================

with ``conv_cc[n, co1, j, i, c0] = sum_{ci1, kh, kw, ci0} fmap_pad[n, e*cin1_g + ci1, j*sh + kh*dh,
i*sw + kw*dw, ci0] * w_conv[co1, ci1, kh, kw, ci0, c0]``, ``e = co1 // cout1_g`` (``Hp = (Ho-1)*sh +
(KH-1)*dh + 1``, the image at row ``pt``). One extended group of fewer than 16 input channels
(a network's first layer) sums over its real channels only: the ``ci0`` axis has ``Cin`` steps.

**3-D** (``geom.depth``; x NDC1HWC0 ``(N, D, C1, H, W, 16)``, the weight FracZ_3D ``(KD*C1x*KH*KW,
cout1_g, 16, 16)``, depth tap outermost): output plane ``do`` of image ``n`` is mad row ``n*Do + do``,
and the depth taps join the channel-block reduction (``ci1 = kd*cin1_g + ci1'``); ``fmap_pad`` is
``(N, Dp, C1, Hp, Wp, 16)`` and the result ``(N*Do, ceil(Cout,16), Ho*Wo, 16)``.
"""

from __future__ import annotations

from typing import Callable

from tvm import te, tirx

from ... import layout
from ...layout import C0, ceil_div
from ...params import ConvGradParams
from .common import ACC, guarded, inside
from .stages import CONV_CC, CONV_RES, CONV_TAG, FMAP_PAD, FORMULATION, MAD_TAG, W_CONV, Formulation

__all__ = ["conv_compute", "conv_output_shape"]

Epilogue = Callable[..., "tvm.tirx.PrimExpr"]
"""``epilogue(value, n, channel, pixel)``: the fp32 sum of output ``(n, channel, pixel)`` (pixel =
``ho*Wo + wo``) made into the stored value before the cast (a fused bias, ReLU or residual add)."""


def conv_output_shape(params: ConvGradParams) -> tuple[int, int, int, int]:
    """TBE's result shape ``(N*Do, ceil(Cout,16), Ho*Wo, 16)`` (``Do = 1`` in 2-D)."""
    g = params.geom
    planes = g.depth.out if g.depth else 1
    return (g.batch * planes, ceil_div(g.cout, C0), g.ho * g.wo, C0)


def conv_compute(data: te.Tensor, weight: te.Tensor, params: ConvGradParams, bias: te.Tensor | None = None,
                 epilogue: Epilogue | None = None) -> te.Tensor:  # fmt: skip
    """``y`` of TBE's shape ``(N, ceil(Cout,16), Ho*Wo, 16)`` from 5HD ``data`` and FracZ(_g)
    ``weight`` (3-D: NDC1HWC0 and FracZ_3D, the result ``(N*Do, ..)``); ``bias`` ``(Cout,)`` or
    ``(align(Cout,16),)`` is added to the fp32 sums, ``epilogue`` then maps each sum (see
    :data:`Epilogue`), and the result is rounded once to ``params.res_dtype``."""
    g = params.geom
    ext = g.group
    fmap = _fmap_pad(data, params)
    w_conv = _w_conv(weight, params)
    depth = g.depth
    kd_n = depth.kernel if depth else 1
    one_block = ext.g_extend == 1 and ext.cin1_g == 1 and g.cin < C0  # the real channels only
    ci1 = te.reduce_axis((0, kd_n * ext.cin1_g), name="ci1")
    kh = te.reduce_axis((0, g.kh), name="kh")
    kw = te.reduce_axis((0, g.kw), name="kw")
    ci0 = te.reduce_axis((0, g.cin if one_block else C0), name="ci0")
    (sh, sw), (dh, dw) = g.strides, g.dilations

    def mad(row, co1, j, i, c0):
        e = co1 // ext.cout1_g
        y, x = j * sh + kh * dh, i * sw + kw * dw
        if depth is None:
            x_at = fmap[row, e * ext.cin1_g + ci1, y, x, ci0]
        else:
            n, plane = row // depth.out, row % depth.out
            tap, block = ci1 // ext.cin1_g, ci1 % ext.cin1_g
            x_at = fmap[n, plane * depth.stride + tap * depth.dilation, e * ext.cin1_g + block, y, x, ci0]
        return te.sum(x_at * w_conv[co1, ci1, kh, kw, ci0, c0], axis=[ci1, kh, kw, ci0])

    rows = g.batch * (depth.out if depth else 1)
    conv_cc = te.compute((rows, ext.g_extend * ext.cout1_g, g.ho, g.wo, C0), mad, name=CONV_CC, tag=MAD_TAG,
                         attrs={FORMULATION: Formulation.CUBE_FWD.value})  # fmt: skip

    identity = ext.multiple == 1 and (ext.groups == 1 or ext.cout_g % C0 == 0)

    def result(row, c1, hw, c0):
        h, w = hw // g.wo, hw % g.wo
        channel = c1 * C0 + c0
        if identity:
            value = conv_cc[row, c1, h, w, c0].asobject()
        else:  # the channel's column in its extended group (TBE's FracZ_g slots)
            group = tirx.min(channel, g.cout - 1) // ext.cout_g
            col = group % ext.multiple * ext.cout_g + tirx.min(channel, g.cout - 1) % ext.cout_g
            block = group // ext.multiple * ext.cout1_g + col // C0
            value = guarded([channel < g.cout] if ceil_div(g.cout, C0) * C0 > g.cout else [], conv_cc[row, block, h, w, col % C0].asobject())
        if bias is not None:
            conds = [channel < int(bias.shape[0])] if int(bias.shape[0]) < ceil_div(g.cout, C0) * C0 else []
            value = value + guarded(conds, bias[tirx.min(channel, int(bias.shape[0]) - 1) if conds else channel].astype(ACC))
        if epilogue is not None:
            value = epilogue(value, row, channel, hw)
        return value.astype(params.res_dtype)

    return te.compute(
        conv_output_shape(params),
        result,
        name=CONV_RES,
        tag=CONV_TAG,
        attrs={
            "kernel_name": params.kernel_name,
            "width_out": g.wo,
            "output_dtype": params.res_dtype,
            "flops": params.flops,
        },
    )


def _fmap_pad(data: te.Tensor, params: ConvGradParams) -> te.Tensor:
    """x as the mad reads it: fp32, with the zero padding its taps reach (``Hp x Wp``, and ``Dp``
    planes in 3-D); ``data`` itself where that would only copy it (fp32 and nothing to pad)."""
    g = params.geom
    kernel, strides, dilations = (g.kh, g.kw), g.strides, g.dilations
    outs, sizes, before = (g.ho, g.wo), (g.h, g.w), (g.pads[0], g.pads[2])
    if g.depth is not None:
        d = g.depth
        kernel, strides, dilations = (d.kernel, *kernel), (d.stride, *strides), (d.dilation, *dilations)
        outs, sizes, before = (d.out, *outs), (d.size, *sizes), (d.pad_before, *before)
    padded = tuple((o - 1) * s + (k - 1) * dl + 1 for o, s, k, dl in zip(outs, strides, kernel, dilations))
    depth = g.depth is not None
    blocks, c1_x = g.group.g_extend * g.group.cin1_g, int(data.shape[2 if depth else 1])
    if data.dtype == ACC and not any(before) and all(p <= n for p, n in zip(padded, sizes)) and blocks <= c1_x:
        return data

    def value(*index):
        n, *planes, c1, y, x, c0 = index
        positions = (*planes, y, x)
        conds = inside(positions, before, sizes, padded) + ([c1 < c1_x] if blocks > c1_x else [])
        at = tuple(p - b for p, b in zip(positions, before))
        read = data[(n, at[0], c1, *at[1:], c0)] if depth else data[n, c1, at[0], at[1], c0]
        return guarded(conds, read.astype(ACC))

    shape = (g.batch, padded[0], blocks, *padded[1:], C0) if depth else (g.batch, blocks, *padded, C0)
    return te.compute(shape, value, name=FMAP_PAD, tag=FMAP_PAD)


def _w_conv(weight: te.Tensor, params: ConvGradParams) -> te.Tensor:
    """The FracZ(_g) weight ``(KD*g_extend*cin1_g*KH*KW, cout1_g, 16 co0, 16 ci0)`` as
    ``(g_extend*cout1_g, KD*cin1_g, KH, KW, 16 ci0, 16 co0)`` fp32: each input lane's row of 16
    output channels contiguous (the mad's vector operand)."""
    g = params.geom
    ext = g.group
    per_tap = int(weight.shape[0]) // (g.kd * g.kh * g.kw)  # C1 blocks of FracZ rows per depth tap

    def value(co1, ci1, kh, kw, ci0, co0):
        e, block = co1 // ext.cout1_g, co1 % ext.cout1_g
        tap, c1 = (ci1 // ext.cin1_g, ci1 % ext.cin1_g) if g.depth is not None else (0, ci1)
        c1 = e * ext.cin1_g + c1
        conds = [c1 < per_tap] if ext.g_extend * ext.cin1_g > per_tap else []  # blocks past the channels
        row = layout.fracz_row(tap * per_tap + (tirx.min(c1, per_tap - 1) if conds else c1), kh, kw, g.kh, g.kw)
        return guarded(conds, weight[row, block, co0, ci0].astype(ACC))

    shape = (ext.g_extend * ext.cout1_g, g.kd * ext.cin1_g, g.kh, g.kw, C0, C0)
    return te.compute(shape, value, name=W_CONV, tag=W_CONV)
