"""The depthwise forward over channel-planar (NCX) tensors: each channel's plane on its own, its
output columns on the lanes.

A depthwise layer (one input channel per group, one output channel per group) multiplies each
plane by its own ``KH x KW`` taps: no reduction over channels, ``KH*KW`` FMAs an output. On the
cube its FracZ_g blocks are 15/16 zeros, and with 16 channels on the lanes an NCX tensor must be
turned into 5HD and back; here the pixels of one plane lie on the lanes as they lie in memory, so
x is read once, and y written once, in place (MobileNetV2's 3x3 layers, N=32, NCHW fp32: see
``docs/performance/``).

==============  ==================================  ===============================================
stage           shape                               value
==============  ==================================  ===============================================
``x_plane``     ``(N, C, PH, PW, Hq, Wq)`` fp32      x's plane with the zero padding its taps reach,
                                                    by stride phase: ``[.., rh, rw, yq, xq]`` holds
                                                    padded position ``(yq*sh + rh, xq*sw + rw)``, so
                                                    a tap reads consecutive columns of one phase
``w_plane``     ``(C, KH, KW)`` fp32                 each channel's taps (the diagonal of the
                                                    FracZ_g weight)
``conv_dw_px``  ``(N, C, Ho, Wv)`` fp32              ``sum_{kh,kw} x_plane[n, c, (kh*dh) % sh, (kw*dw)
                                                    % sw, j + (kh*dh) // sh, i + (kw*dw) // sw] *
                                                    w_plane[c, kh, kw]`` (``Formulation.DEPTHWISE_FWD``)
==============  ==================================  ===============================================

``Wv`` is ``Wo`` rounded up to whole registers (:func:`row_vector`), ``Wq = Wv + (KW-1)*dw // sw``
and ``Hq = Ho + (KH-1)*dh // sh``; a one-tap axis packs one phase (``PH = 1``).
"""

from __future__ import annotations

from typing import Callable

from tvm import te

from ... import layout
from ...layout import C0, ceil_div
from ...params import ConvGradParams
from .common import ACC, channel_lanes, guarded, inside
from .stages import CONV_DW_PX, FORMULATION, MAD_TAG, PAD_CUTS_H, PAD_CUTS_W, W_PLANE, X_PLANE, Formulation

__all__ = ["PLANAR_DEPTHWISE", "depthwise_plane_sums", "padding_cuts", "planar_depthwise", "row_vector"]

PLANAR_DEPTHWISE = True  # (off: an NCX depthwise forward on the cube; for A/B)


def planar_depthwise(params: ConvGradParams, dtype: str) -> bool:
    """Whether a forward runs plane by plane (:func:`depthwise_plane_sums`): fp32, 2-D, one input
    and one output channel per group, several groups."""
    g = params.geom
    return PLANAR_DEPTHWISE and dtype == ACC and g.depth is None and g.groups > 1 and g.cin_g == 1 and g.cout_g == 1


def row_vector(width: int) -> int:
    """The columns a row of the mad computes: ``width`` rounded up to a power of two up to 16, past
    that to a multiple of 16, so that LLVM splits the row into whole registers (a 28-lane vector
    came out as 16 lanes and a 12 assembled lane by lane, each tap's broadcast too: 144 channels on
    28x28, N=32, 0.6x PyTorch); the columns past ``width`` are sums of zeros nobody reads."""
    return 1 << (width - 1).bit_length() if width <= C0 else ceil_div(width, C0) * C0


def padding_cuts(before: int, size: int, extent: int, stride: int) -> list[int]:
    """Where an unstrided padded axis of ``extent`` positions (the image at ``[before, before +
    size)``) changes between padding and image: the lengths of its parts but the last, none on a
    strided axis (its phases interleave) or where the axis is one part."""
    if stride != 1:
        return []
    head = min(before, extent)
    parts = [part for part in (head, min(size, extent - head)) if part > 0]
    return parts if sum(parts) < extent else parts[:-1]


def depthwise_plane_sums(data: te.Tensor, weight: te.Tensor, params: ConvGradParams) -> Callable:
    """The sums ``sums(row, block, h, w, c0)`` the forward's result reads (the lanes past C masked,
    the index clamped: branch-free), from ``data`` (5HD ``(N, C1, H, W, 16)``, a frontend's view of
    NCX x) and ``weight`` (FracZ_g); the stages are the module docstring's."""
    g = params.geom
    (sh, sw), (dh, dw), (pt, _, pl, _) = g.strides, g.dilations, g.pads
    ph, pw = (sh if g.kh > 1 else 1), (sw if g.kw > 1 else 1)  # stride phases a tap reads
    wv = row_vector(g.wo)
    rows, cols = g.ho + (g.kh - 1) * dh // sh, wv + (g.kw - 1) * dw // sw  # positions of a phase the taps reach

    def x_value(n, c, rh, rw, yq, xq):
        y, x = yq * sh + rh, xq * sw + rw
        conds = inside((y, x), (pt, pl), (g.h, g.w), (rows * sh, cols * sw))
        return guarded(conds, data[n, c // C0, y - pt, x - pl, c % C0].asobject())  # (fp32: :func:`planar_depthwise`)

    cuts = {PAD_CUTS_H: padding_cuts(pt, g.h, rows, sh), PAD_CUTS_W: padding_cuts(pl, g.w, cols, sw)}
    x_plane = te.compute((g.batch, g.cin, ph, pw, rows, cols), x_value, name=X_PLANE, tag=X_PLANE, attrs=cuts)
    mag = g.group.multiple

    def w_value(c, kh, kw):  # group c's slot j in extended group e holds FracZ_g column j, lane j
        e, j = c // mag, c % mag
        return weight[layout.fracz_row(e, kh, kw, g.kh, g.kw), j // C0, j % C0, j].astype(ACC)

    w_plane = te.compute((g.cin, g.kh, g.kw), w_value, name=W_PLANE, tag=W_PLANE)
    kh = te.reduce_axis((0, g.kh), name="kh")
    kw = te.reduce_axis((0, g.kw), name="kw")
    sums = te.compute(
        (g.batch, g.cin, g.ho, wv),
        lambda n, c, j, i: te.sum(
            x_plane[n, c, kh * dh % ph, kw * dw % pw, j + kh * dh // sh, i + kw * dw // sw] * w_plane[c, kh, kw], axis=[kh, kw]
        ),
        name=CONV_DW_PX,
        tag=MAD_TAG,
        attrs={FORMULATION: Formulation.DEPTHWISE_FWD.value},
    )
    return channel_lanes(sums, g.cout)
