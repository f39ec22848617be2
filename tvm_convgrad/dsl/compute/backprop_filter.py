"""TE compute of ``conv2d_backprop_filter`` (dW) on 5HD tensors.

Stages (found by name by the schedules), inputs fp16, reduction fp32:

=================  ==============================================  =========================================
stage              shape                                           value
=================  ==============================================  =========================================
``grads_2_matrix`` ``(N, real_g*cout_g/16, Ho, Wo, 16)`` fp32      dy, zero past its channel blocks
``fmap_l1``        ``(N, real_g*cin1_g, PH, PW, Hq, Wq, 16)``      x with its zero padding, stored by stride
                   fp32                                            phase: ``[.., rh, rw, hq, wq, ..] =
                                                                   xpad[hq*sh + rh, wq*sw + rw]``; only the
                                                                   phases the taps read (PH = 1 when every
                                                                   ``kh*dh`` is a multiple of ``sh``)
``dw_cc``          ``(real_g, cin1_g*KH*KW, cout_g, 16)`` fp32     the mad: sum over n, ho, wo
``dw_ddr``         same, ``res_dtype``                             the result (tag ``conv2d_backprop_filterdw_ddr``)
=================  ==============================================  =========================================

``dw_cc[g, (c1,kh,kw), co, c0] = sum_{n,ho,wo} grads_2_matrix[n, g*cout_g/16 + co//16, ho, wo, co%16]
* xpad[n, g*cin1_g + c1, ho*sh + kh*dh, wo*sw + kw*dw, c0]``, xpad read through ``fmap_l1``, so that
consecutive ``wo`` read consecutive memory whatever the stride: every entry of an extended group's
blocks is computed, the cross-slot ones too (spec §2.5). The fp16 x fp16 products are exact in fp32,
so this is the cube's arithmetic (exact multiply, fp32 accumulate).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te

from ... import layout
from ...layout import C0
from ...params import ConvGradParams
from .common import ACC, guarded

__all__ = ["conv2d_backprop_filter_compute"]


@dataclass(frozen=True)
class _StridePhases:
    """One axis of the dW reduction: output position ``o`` and tap ``k`` read padded position
    ``o*stride + k*dilation = (o + q)*stride + r`` with ``(q, r) = divmod(k*dilation, stride)``."""

    out: int
    kernel: int
    stride: int
    dilation: int

    @property
    def phases(self) -> int:
        """Phases stored: ``stride``, or 1 when every tap lands on phase 0 (e.g. 1x1, stride 2)."""
        used = {(k * self.dilation) % self.stride for k in range(self.kernel)}
        return 1 if used == {0} else self.stride

    @property
    def reach(self) -> int:
        """Padded positions the reduction reads: ``(out-1)*stride + (kernel-1)*dilation + 1``."""
        return (self.out - 1) * self.stride + (self.kernel - 1) * self.dilation + 1

    @property
    def per_phase(self) -> int:
        return -(-self.reach // self.stride) if self.phases > 1 else self.out + (self.kernel - 1) * self.dilation // self.stride

    @property
    def packed_extent(self) -> int:
        """1 + the largest padded position stored (>= reach: the last phase row may be extra)."""
        return (self.per_phase - 1) * self.stride + self.phases

    def padded_index(self, r, q):
        return q * self.stride + r

    def of_tap(self, k):
        """``(phase, offset)`` of tap ``k`` (a TE expression or an int)."""
        shift = k * self.dilation
        return (shift % self.stride if self.phases > 1 else 0), shift // self.stride


def conv2d_backprop_filter_compute(fmap: te.Tensor, dy: te.Tensor, params: ConvGradParams) -> te.Tensor:
    """dW of TBE's shape ``(real_g, cin1_g*KH*KW, cout_g, 16)`` from 5HD ``fmap`` and ``dy``."""
    g = params.geom
    ext = g.group
    (sh, sw), (dil_h, dil_w), (pt, _, pl, _) = g.strides, g.dilations, g.pads
    rows = _StridePhases(g.ho, g.kh, sh, dil_h)
    cols = _StridePhases(g.wo, g.kw, sw, dil_w)
    c1_grads = ext.g_extend * ext.cout1_g
    c1_fmap = ext.g_extend * ext.cin1_g

    def grads_value(n, c1, ho, wo, c0):
        conds = [c1 < g.c1_y] if c1_grads > g.c1_y else []
        return guarded(conds, dy[n, c1, ho, wo, c0].astype(ACC))

    grads = te.compute((g.batch, c1_grads, g.ho, g.wo, C0), grads_value, name="grads_2_matrix", tag="grads_2_matrix")

    def fmap_value(n, c1, rh, rw, hq, wq, c0):
        i, j = rows.padded_index(rh, hq), cols.padded_index(rw, wq)  # in the zero-padded x
        conds = [c1 < g.c1_x] if c1_fmap > g.c1_x else []
        conds += [i >= pt] if pt else []
        conds += [i < pt + g.h] if rows.packed_extent > pt + g.h else []
        conds += [j >= pl] if pl else []
        conds += [j < pl + g.w] if cols.packed_extent > pl + g.w else []
        return guarded(conds, fmap[n, c1, i - pt, j - pl, c0].astype(ACC))

    shape = (g.batch, c1_fmap, rows.phases, cols.phases, rows.per_phase, cols.per_phase, C0)
    fmap_l1 = te.compute(shape, fmap_value, name="fmap_l1", tag="fmap_l1")

    n = te.reduce_axis((0, g.batch), name="n")
    ho = te.reduce_axis((0, g.ho), name="ho")
    wo = te.reduce_axis((0, g.wo), name="wo")

    def mad(grp, fkk, co, c0):
        c1, kh, kw = layout.split_fracz_row(fkk, g.kh, g.kw)
        (rh, qh), (rw, qw) = rows.of_tap(kh), cols.of_tap(kw)
        return te.sum(
            grads[n, grp * ext.cout1_g + co // C0, ho, wo, co % C0]
            * fmap_l1[n, grp * ext.cin1_g + c1, rh, rw, ho + qh, wo + qw, c0],
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
