"""TE compute of ``conv2d_backprop_filter`` (dW) on 5HD tensors.

Stages (found by name by the schedules), inputs fp16, reduction fp32:

=================  ==============================================  =========================================
stage              shape                                           value
=================  ==============================================  =========================================
``grads_2_matrix`` ``(N, real_g*cout_g/16, Ho, Wo, 16)`` fp32      dy, zero past its channel blocks
``fmap_l1``        ``(N, real_g*cin1_g, Hp, Wp, 16)`` fp32         x with its zero padding (rows/cols the
                                                                   kernel reaches), zero past its blocks
``dw_cc``          ``(real_g, cin1_g*KH*KW, cout_g, 16)`` fp32     the mad: sum over n, ho, wo
``dw_ddr``         same, ``res_dtype``                             the result (tag ``conv2d_backprop_filterdw_ddr``)
=================  ==============================================  =========================================

``dw_cc[g, (c1,kh,kw), co, c0] = sum_{n,ho,wo} grads_2_matrix[n, g*cout_g/16 + co//16, ho, wo, co%16]
* fmap_l1[n, g*cin1_g + c1, ho*sh + kh*dh, wo*sw + kw*dw, c0]``: every entry of an extended group's
blocks is computed, the cross-slot ones too (spec §2.5). The fp16 x fp16 products are exact in fp32,
so this is the cube's arithmetic (exact multiply, fp32 accumulate).
"""

from __future__ import annotations

from tvm import te

from ... import layout
from ...layout import C0
from ...params import ConvGradParams
from .common import ACC, guarded

__all__ = ["conv2d_backprop_filter_compute"]


def conv2d_backprop_filter_compute(fmap: te.Tensor, dy: te.Tensor, params: ConvGradParams) -> te.Tensor:
    """dW of TBE's shape ``(real_g, cin1_g*KH*KW, cout_g, 16)`` from 5HD ``fmap`` and ``dy``."""
    g = params.geom
    ext = g.group
    (sh, sw), (dil_h, dil_w), (pt, _, pl, _) = g.strides, g.dilations, g.pads
    hp = (g.ho - 1) * sh + g.kh_dilated  # padded rows / cols the reduction reads
    wp = (g.wo - 1) * sw + g.kw_dilated
    c1_grads = ext.g_extend * ext.cout1_g
    c1_fmap = ext.g_extend * ext.cin1_g

    def grads_value(n, c1, ho, wo, c0):
        conds = [c1 < g.c1_y] if c1_grads > g.c1_y else []
        return guarded(conds, dy[n, c1, ho, wo, c0].astype(ACC))

    grads = te.compute((g.batch, c1_grads, g.ho, g.wo, C0), grads_value, name="grads_2_matrix", tag="grads_2_matrix")

    def fmap_value(n, c1, i, j, c0):
        conds = [c1 < g.c1_x] if c1_fmap > g.c1_x else []
        conds += [i >= pt] if pt else []
        conds += [i < pt + g.h] if hp > pt + g.h else []
        conds += [j >= pl] if pl else []
        conds += [j < pl + g.w] if wp > pl + g.w else []
        return guarded(conds, fmap[n, c1, i - pt, j - pl, c0].astype(ACC))

    fmap_l1 = te.compute((g.batch, c1_fmap, hp, wp, C0), fmap_value, name="fmap_l1", tag="fmap_l1")

    n = te.reduce_axis((0, g.batch), name="n")
    ho = te.reduce_axis((0, g.ho), name="ho")
    wo = te.reduce_axis((0, g.wo), name="wo")

    def mad(grp, fkk, co, c0):
        c1, kh, kw = layout.split_fracz_row(fkk, g.kh, g.kw)
        return te.sum(
            grads[n, grp * ext.cout1_g + co // C0, ho, wo, co % C0]
            * fmap_l1[n, grp * ext.cin1_g + c1, ho * sh + kh * dil_h, wo * sw + kw * dil_w, c0],
            axis=[n, ho, wo],
        )

    shape = layout.shape_dw_result(g.filter_sizes, g.groups)
    dw_cc = te.compute(shape, mad, name="dw_cc", tag="mad", attrs={"kernel_h": g.kh, "kernel_w": g.kw})
    mode = "f162f32" if params.res_dtype == "float32" else "f162f16"
    return te.compute(
        shape,
        lambda *i: dw_cc(*i).astype(params.res_dtype),
        name="dw_ddr",
        tag="conv2d_backprop_filterdw_ddr",
        attrs={"kernel_name": params.kernel_name, "mode": mode, "flops": params.flops},
    )
