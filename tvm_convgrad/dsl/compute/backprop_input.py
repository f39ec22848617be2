"""TE compute of ``conv2d_backprop_input`` (dX) on a 5HD dy and a FracZ(_g) forward weight.

The input gradient is a stride-1 convolution of the zero-inserted, padded dy with the weight
rotated by 180 degrees (TBE's general pattern, spec §3.6). Stages, inputs fp16, reduction fp32:

===============  ============================================  =============================================
stage            shape                                         value
===============  ============================================  =============================================
``dy_filling``   ``(N, g_extend*dy_c1_extend, Hf, Wf, 16)``    dy with ``stride-1`` zeros between rows/cols
                 fp32, ``Hf = H + (KH-1)*dh``                  and the stride-1 conv's padding (or crop)
``w_col``        ``(C1x, dy_c1_extend, KH, KW, 16, 16)`` fp32  the FracZ weight, ``[.., co0, ci0]``
``dx_cc``        ``(N, C1x, H, W, 16)`` fp32                   the mad
``c_ddr``        ``(N, C1x, H*W, 16)``, ``res_dtype``          the result (+ ``tensor_bias``), tag
                                                               ``conv2d_backprop_input``
===============  ============================================  =============================================

``dx_cc[n, c1, h, w, c0] = sum_{co1, kh, kw, co0} dy_filling[n, e*dy_c1_extend + co1, h + (KH-1-kh)*dh,
w + (KW-1-kw)*dw, co0] * w_col[c1, co1, kh, kw, co0, c0]`` with ``e = c1 // dx_c1_extend``, where
``dy_filling[.., i, j, ..] = dy[.., (i-pb_h)/sh, (j-pb_w)/sw, ..]`` when both divide exactly and lie
inside dy, else 0; ``pb_h = (KH-1)*dh - pad_up`` (negative: the crop case).
"""

from __future__ import annotations

from tvm import te

from ... import layout
from ...layout import C0
from ...params import ConvGradParams
from .common import ACC, guarded

__all__ = ["conv2d_backprop_input_compute"]


def conv2d_backprop_input_compute(
    filters: te.Tensor, dy: te.Tensor, params: ConvGradParams, bias: te.Tensor | None = None
) -> te.Tensor:
    """dX of TBE's shape ``(N, ceil(Cin,16), H*W, 16)`` from FracZ ``filters`` and 5HD ``dy``."""
    g = params.geom
    ext = g.group
    (sh, sw), (dil_h, dil_w), (pu, _, pl, _) = g.strides, g.dilations, g.pads
    hf = g.h + (g.kh - 1) * dil_h
    wf = g.w + (g.kw - 1) * dil_w
    pb_h = (g.kh - 1) * dil_h - pu
    pb_w = (g.kw - 1) * dil_w - pl
    c1_dy = ext.g_extend * ext.cout1_g

    def filling(n, c1, i, j, c0):
        yi, yj = i - pb_h, j - pb_w  # positions in the zero-inserted dy
        conds = [c1 < g.c1_y] if c1_dy > g.c1_y else []
        conds += [yi >= 0] if pb_h > 0 else []
        conds += [yj >= 0] if pb_w > 0 else []
        conds += [yi % sh == 0] if sh > 1 else []
        conds += [yj % sw == 0] if sw > 1 else []
        conds += [yi <= (g.ho - 1) * sh] if hf - 1 - pb_h > (g.ho - 1) * sh else []
        conds += [yj <= (g.wo - 1) * sw] if wf - 1 - pb_w > (g.wo - 1) * sw else []
        return guarded(conds, dy[n, c1, yi // sh, yj // sw, c0].astype(ACC))

    dy_filling = te.compute((g.batch, c1_dy, hf, wf, C0), filling, name="dy_filling", tag="stride_filling")

    w_col = te.compute(
        (g.c1_x, ext.cout1_g, g.kh, g.kw, C0, C0),
        lambda c1, co1, kh, kw, co0, ci0: filters[layout.fracz_row(c1, kh, kw, g.kh, g.kw), co1, co0, ci0].astype(ACC),
        name="w_col",
        tag="w_col",
    )

    co1 = te.reduce_axis((0, ext.cout1_g), name="co1")
    kh = te.reduce_axis((0, g.kh), name="kh")
    kw = te.reduce_axis((0, g.kw), name="kw")
    co0 = te.reduce_axis((0, C0), name="co0")

    def mad(n, c1, h, w, c0):
        e = c1 // ext.cin1_g
        return te.sum(
            dy_filling[n, e * ext.cout1_g + co1, h + (g.kh - 1 - kh) * dil_h, w + (g.kw - 1 - kw) * dil_w, co0]
            * w_col[c1, co1, kh, kw, co0, c0],
            axis=[co1, kh, kw, co0],
        )

    dx_cc = te.compute((g.batch, g.c1_x, g.h, g.w, C0), mad, name="dx_cc", tag="mad")

    def result(n, c1, hw, c0):
        value = dx_cc[n, c1, hw // g.w, hw % g.w, c0]
        if bias is not None:
            channel = c1 * C0 + c0
            conds = [channel < int(bias.shape[0])] if int(bias.shape[0]) < g.c1_x * C0 else []
            value = value + guarded(conds, bias[channel].astype(ACC))
        return value.astype(params.res_dtype)

    return te.compute(
        layout.shape_dx_result(g.input_sizes),
        result,
        name="c_ddr",
        tag="conv2d_backprop_input",
        attrs={
            "kernel_name": params.kernel_name,
            "output_shape": list(layout.shape_5hd(*g.input_sizes)),
            "output_dtype": params.res_dtype,
            "flops": params.flops,
        },
    )
