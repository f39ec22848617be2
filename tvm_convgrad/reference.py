"""float64 numpy references of the two gradients, written from the formulas (spec §2.4, §3.4).

They work on plain NCHW / OIHW arrays and never look at the TE code. ``pads`` is
``(top, bottom, left, right)``; ``strides`` and ``dilations`` are ``(h, w)``.

* weight gradient (gather form):
  ``dW[co, ci, kh, kw] = sum_{n,ho,wo} dy[n, co, ho, wo] * xpad[n, G(co)*Cin_g + ci, ho*sh + kh*dh, wo*sw + kw*dw]``
* input gradient (scatter form, the transpose of the forward convolution):
  every ``dy[n, co, ho, wo] * W[co, ci, kh, kw]`` is added to ``dxpad[n, G*Cin_g + ci, ho*sh + kh*dh, wo*sw + kw*dw]``
  and the padding is cropped off.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from . import layout

__all__ = ["conv2d_backprop_filter", "conv2d_backprop_input", "conv2d_backprop_filter_tbe"]


def _tap_window(tap: int, dilation: int, stride: int, out: int) -> slice:
    """Positions ``o*stride + tap*dilation`` (``o < out``) of the padded input along one axis."""
    start = tap * dilation
    return slice(start, start + (out - 1) * stride + 1, stride)


def conv2d_backprop_filter(
    x: np.ndarray,
    dy: np.ndarray,
    kernel_hw: Sequence[int],
    strides: Sequence[int] = (1, 1),
    pads: Sequence[int] = (0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1),
    groups: int = 1,
) -> np.ndarray:
    """dW ``(Cout, Cin/groups, KH, KW)`` float64 from ``x (N, Cin, H, W)`` and ``dy (N, Cout, Ho, Wo)``."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    n, cin, _, _ = x.shape
    _, cout, ho, wo = dy.shape
    kh_n, kw_n = kernel_hw
    (sh, sw), (dil_h, dil_w), (pt, pb, pl, pr) = strides, dilations, pads
    xpad = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    xg = xpad.reshape(n, groups, cin // groups, *xpad.shape[2:])
    dyg = dy.reshape(n, groups, cout // groups, ho, wo)
    dw = np.empty((groups, cout // groups, cin // groups, kh_n, kw_n))
    for kh in range(kh_n):
        for kw in range(kw_n):
            window = xg[..., _tap_window(kh, dil_h, sh, ho), _tap_window(kw, dil_w, sw, wo)]
            dw[..., kh, kw] = np.einsum("ngoyx,ngiyx->goi", dyg, window, optimize=True)
    return dw.reshape(cout, cin // groups, kh_n, kw_n)


def conv2d_backprop_input(
    w: np.ndarray,
    dy: np.ndarray,
    input_hw: Sequence[int],
    strides: Sequence[int] = (1, 1),
    pads: Sequence[int] = (0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1),
    groups: int = 1,
) -> np.ndarray:
    """dX ``(N, Cin, H, W)`` float64 from the forward weight ``w (Cout, Cin/groups, KH, KW)`` and ``dy``."""
    w = np.asarray(w, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    n, cout, ho, wo = dy.shape
    _, cin_g, kh_n, kw_n = w.shape
    h, w_in = input_hw
    (sh, sw), (dil_h, dil_w), (pt, pb, pl, pr) = strides, dilations, pads
    dxpad = np.zeros((n, groups, cin_g, h + pt + pb, w_in + pl + pr))
    dyg = dy.reshape(n, groups, cout // groups, ho, wo)
    wg = w.reshape(groups, cout // groups, cin_g, kh_n, kw_n)
    for kh in range(kh_n):
        for kw in range(kw_n):
            contribution = np.einsum("ngoyx,goi->ngiyx", dyg, wg[..., kh, kw], optimize=True)
            dxpad[..., _tap_window(kh, dil_h, sh, ho), _tap_window(kw, dil_w, sw, wo)] += contribution
    return dxpad[..., pt : pt + h, pl : pl + w_in].reshape(n, groups * cin_g, h, w_in)


def conv2d_backprop_filter_tbe(
    x: np.ndarray,
    dy: np.ndarray,
    filter_sizes: Sequence[int],
    strides: Sequence[int] = (1, 1),
    pads: Sequence[int] = (0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1),
    groups: int = 1,
) -> np.ndarray:
    """TBE's whole dW result ``(real_g, cin1_g*KH*KW, cout_g, 16)`` in float64.

    TBE computes every entry of each extended group's blocks, the cross-slot ones too (they
    hold genuine correlations between different original groups, spec §2.5). That equals a
    grouped weight gradient with ``real_g`` groups over the channel-padded tensors: extended
    group ``e`` owns x channels ``[e*cin1_g*16, (e+1)*cin1_g*16)`` and dy channels
    ``[e*cout_g, (e+1)*cout_g)`` (zeros past the real channels).
    """
    cout, cin_g, kh, kw = filter_sizes
    ext = layout.group_extension(cin_g, cout // groups, groups)
    n, cin = x.shape[:2]
    x_ext = np.zeros((n, ext.g_extend * ext.cin1_g * layout.C0, *x.shape[2:]))
    x_ext[:, :cin] = x
    dy_ext = np.zeros((n, ext.g_extend * ext.cout_g_padded, *dy.shape[2:]))
    dy_ext[:, :cout] = dy
    dw_ext = conv2d_backprop_filter(x_ext, dy_ext, (kh, kw), strides, pads, dilations, ext.g_extend)
    blocks = np.split(dw_ext, ext.g_extend, axis=0)  # each (cout_g, cin1_g*16, KH, KW): groups = 1
    return np.stack([layout.oihw_to_fracz(b).reshape(-1, ext.cout_g_padded, layout.C0) for b in blocks])


def own_group_entries(filter_sizes: Sequence[int], groups: int = 1) -> np.ndarray:
    """Boolean mask of TBE's dW result ``(real_g, cin1_g*KH*KW, cout_g, 16)``: True where the
    entry pairs an output and an input channel of the same original group (spec §1.4's index
    map: slot ``j`` owns FracZ_g columns ``[j*Cout_g, (j+1)*Cout_g)`` and input lanes
    ``[j*Cin_g, (j+1)*Cin_g)``). These are the entries a consumer reads; the others are TBE's
    cross-slot correlations."""
    cout, cin_g, kh, kw = filter_sizes
    ext = layout.group_extension(cin_g, cout // groups, groups)
    mask = np.zeros(layout.shape_dw_result(filter_sizes, groups), dtype=bool)
    blocks = mask.reshape(ext.g_extend, ext.cin1_g, kh * kw, ext.cout_g_padded, layout.C0)  # [e, c1, tap, co_l, ci0]
    for group in range(groups):
        e, j = divmod(group, ext.multiple)
        for dst_cin in range(j * cin_g, (j + 1) * cin_g):
            c1, ci0 = divmod(dst_cin, layout.C0)
            blocks[e, c1, :, j * ext.cout_g : (j + 1) * ext.cout_g, ci0] = True
    return mask
