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

__all__ = [
    "auto_pad",
    "conv2d_backprop_filter",
    "conv2d_backprop_filter_tbe",
    "conv2d_backprop_input",
    "conv_backprop_filter_nd",
    "conv_backward_data_nd",
    "conv_forward_nd",
    "conv_transpose_backward_weights",
    "deconv_grad_filter",
    "from_data_format",
    "from_weights_format",
    "post_ops",
    "to_data_format",
    "to_weights_format",
]


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


# ---------------------------------------------------------------------------------------------
# The framework operators (framework_ops/*.md), spatial rank 1-3, NC* / OI* arrays
# ---------------------------------------------------------------------------------------------


def _weight_correlation(a: np.ndarray, b: np.ndarray, kernel, strides, pads_begin, dilations, groups: int) -> np.ndarray:
    """``out[g*Ag + j, l, k] = sum_n sum_p a[n, g*Ag + j, p] * b[n, g*Bg + l, p*s - pb + k*d]``
    over the positions ``p`` of ``a``'s spatial grid, ``b`` read as 0 outside its extent: the
    weight gradient's sum, for any spatial rank (``a``, ``b``: ``(N, C, *S)``)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    n, ca, *grid = a.shape
    cb, extent = b.shape[1], b.shape[2:]
    ends = [max(0, (o - 1) * s + (k - 1) * d + 1 - pb - e) for o, k, s, d, pb, e in zip(grid, kernel, strides, dilations, pads_begin, extent)]
    bpad = np.pad(b, [(0, 0), (0, 0)] + [(pb, end) for pb, end in zip(pads_begin, ends)])
    ag = a.reshape(n, groups, ca // groups, -1)
    out = np.empty((groups, ca // groups, cb // groups, *kernel))
    for taps in np.ndindex(*kernel):
        window = bpad[(slice(None), slice(None)) + tuple(_tap_window(k, d, s, o) for k, d, s, o in zip(taps, dilations, strides, grid))]
        bg = window.reshape(n, groups, cb // groups, -1)
        out[(Ellipsis, *taps)] = np.einsum("ngjp,nglp->gjl", ag, bg, optimize=True)
    return out.reshape(ca, cb // groups, *kernel)


def conv_backprop_filter_nd(x, dy, kernel, strides, pads_begin, dilations, groups: int = 1) -> np.ndarray:
    """ConvolutionBackpropFilters (spec §5): ``dW[g*OCg + o, i, k] = sum_n sum_p dy[n, g*OCg + o, p]
    * x[n, g*ICg + i, p*s - pb + k*d]`` (x = 0 outside), float64 OIX from NCX ``x`` and ``dy``."""
    return _weight_correlation(dy, x, kernel, strides, pads_begin, dilations, groups)


def conv_transpose_backward_weights(src, diff_dst, kernel, strides, pads_begin, dilations, groups: int = 1) -> np.ndarray:
    """ConvTransposeBackwardWeights (spec §4): ``dW[g*ICg + i, o, k] = sum_n sum_h src[n, g*ICg + i,
    h] * diff_dst[n, g*OCg + o, h*s - pb + k*d]`` (diff_dst = 0 outside), float64 IOX from NCX."""
    return _weight_correlation(src, diff_dst, kernel, strides, pads_begin, dilations, groups)


def conv_backward_data_nd(diff_dst, w, spatial_in, strides, pads_begin, dilations, groups: int = 1) -> np.ndarray:
    """ConvolutionBackwardData: ``dX[n, g*ICg + i, p*s - pb + k*d] += dY[n, g*OCg + o, p] *
    W[g*OCg + o, i, k]`` over every output position ``p`` and tap ``k`` (scatter form, positions
    outside ``[0, S_in)`` dropped), float64 NCX ``(N, C_in, *spatial_in)`` from NCX ``diff_dst`` and
    the OIX forward weight ``w``; any spatial rank."""
    dy = np.asarray(diff_dst, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n, cout, *grid = dy.shape
    _, cin_g, *kernel = w.shape
    reach = [(o - 1) * s + (k - 1) * d + 1 for o, k, s, d in zip(grid, kernel, strides, dilations)]
    padded = [max(size + pb, r) for size, pb, r in zip(spatial_in, pads_begin, reach)]
    dxpad = np.zeros((n, groups, cin_g, *padded))
    dyg = dy.reshape(n, groups, cout // groups, -1)
    wg = w.reshape(groups, cout // groups, cin_g, *kernel)
    for taps in np.ndindex(*kernel):
        contribution = np.einsum("ngop,goi->ngip", dyg, wg[(Ellipsis, *taps)], optimize=True).reshape(n, groups, cin_g, *grid)
        window = tuple(_tap_window(k, d, s, o) for k, d, s, o in zip(taps, dilations, strides, grid))
        dxpad[(Ellipsis, *window)] += contribution
    crop = tuple(slice(pb, pb + size) for pb, size in zip(pads_begin, spatial_in))
    return dxpad[(Ellipsis, *crop)].reshape(n, groups * cin_g, *spatial_in)


def conv_forward_nd(x, w, strides, pads_begin, dilations, groups: int = 1, pads_end=None, bias=None) -> np.ndarray:
    """The forward convolution (oneDNN's ``Convolution``, TBE's ``conv``): ``y[n, g*OCg + o, p] =
    sum_{i, k} x[n, g*ICg + i, p*s - pb + k*d] * w[g*OCg + o, i, k] (+ bias[g*OCg + o])``, x read
    as 0 outside its extent, over the output grid ``S_out = floor((S_in + pb + pe - (K-1)*d - 1)
    / s) + 1`` (``pads_end`` default: ``pads_begin``); float64 NCX from NCX ``x`` and OIX ``w``,
    any spatial rank (gather form)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n, cin, *extent = x.shape
    cout, cin_g, *kernel = w.shape
    pads_end = pads_begin if pads_end is None else pads_end
    grid = [(size + pb + pe - (k - 1) * d - 1) // s + 1
            for size, k, s, d, pb, pe in zip(extent, kernel, strides, dilations, pads_begin, pads_end)]  # fmt: skip
    ends = [max(0, (o - 1) * s + (k - 1) * d + 1 - pb - size) for o, k, s, d, pb, size in zip(grid, kernel, strides, dilations, pads_begin, extent)]
    xpad = np.pad(x, [(0, 0), (0, 0)] + [(pb, end) for pb, end in zip(pads_begin, ends)])
    wg = w.reshape(groups, cout // groups, cin_g, *kernel)
    y = np.zeros((n, groups, cout // groups, int(np.prod(grid, dtype=np.int64))))
    for taps in np.ndindex(*kernel):
        window = xpad[(slice(None), slice(None)) + tuple(_tap_window(k, d, s, o) for k, d, s, o in zip(taps, dilations, strides, grid))]
        xg = window.reshape(n, groups, cin_g, -1)
        y += np.einsum("ngip,goi->ngop", xg, wg[(Ellipsis, *taps)], optimize=True)
    y = y.reshape(n, cout, *grid)
    if bias is not None:
        y += np.asarray(bias, dtype=np.float64).reshape((1, cout) + (1,) * len(grid))
    return y


def post_ops(dst: np.ndarray, ops: Sequence[tuple]) -> np.ndarray:
    """oneDNN's post-ops on ``dst`` (float64, in its own layout), in order; each op is ``(alg,
    alpha, beta, src1)``: eltwise ``relu`` (``x > 0 ? x : alpha x``), ``clip`` (``min(max(x,
    alpha), beta)``), ``linear`` (``alpha x + beta``), ``logistic`` (``1 / (1 + e^-x)``), ``swish``
    (``x / (1 + e^(-alpha x))``), ``tanh``; binary ``add``, ``sub``, ``mul``, ``div``, ``max``,
    ``min`` with ``src1`` broadcast to ``dst`` (numpy's rules)."""
    y = np.asarray(dst, dtype=np.float64)
    for alg, alpha, beta, src1 in ops:
        if src1 is not None:
            b = np.broadcast_to(np.asarray(src1, dtype=np.float64), y.shape)
            binary = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum, "min": np.minimum}
            y = binary[alg](y, b)
        elif alg == "relu":
            y = np.where(y > 0, y, alpha * y)
        elif alg == "clip":
            y = np.minimum(np.maximum(y, alpha), beta)
        elif alg == "linear":
            y = alpha * y + beta
        elif alg == "logistic":
            y = 1.0 / (1.0 + np.exp(-y))
        elif alg == "swish":
            y = y / (1.0 + np.exp(-alpha * y))
        elif alg == "tanh":
            y = np.tanh(y)
        else:
            raise ValueError(f"post-op {alg!r}")
    return y


def auto_pad(size: int, kernel: int, stride: int, dilation: int, mode: str) -> tuple[int, int]:
    """``(begin, end)`` pads of oneDNN's auto_pad on an input of ``size`` (spec §4, the ceil form):
    ``total = max(0, (ceil(size/s) - 1)*s + eff - size)``, the odd pad at the end (same_upper) or
    the beginning (same_lower); valid: none."""
    if mode.lower() == "valid":
        return 0, 0
    total = max(0, (-(-size // stride) - 1) * stride + (kernel - 1) * dilation + 1 - size)
    begin = total // 2 if mode.lower() == "same_upper" else -(-total // 2)
    return begin, total - begin


def from_data_format(a: np.ndarray, data_format: str) -> np.ndarray:
    """NXC -> NCX (NCX unchanged)."""
    return a if data_format == "NCX" else np.moveaxis(a, -1, 1)


def to_data_format(a: np.ndarray, data_format: str) -> np.ndarray:
    """NCX -> NXC (NCX unchanged): the inverse of :func:`from_data_format`."""
    return a if data_format == "NCX" else np.moveaxis(a, 1, -1)


def from_weights_format(w: np.ndarray, weights_format: str) -> np.ndarray:
    """XIO (XOI) or OXI -> OIX (IOX): the inverse of :func:`to_weights_format`."""
    if weights_format == "OXI":
        return np.moveaxis(w, -1, 1)
    return w if weights_format in ("OIX", "IOX") else np.moveaxis(w, (-1, -2), (0, 1))


def to_weights_format(w: np.ndarray, weights_format: str) -> np.ndarray:
    """OIX (or the deconvolution's IOX) -> XIO (XOI): the two channel axes last, swapped; -> OXI:
    I last; OIX / IOX unchanged."""
    if weights_format == "OXI":
        return np.moveaxis(w, 1, -1)
    return w if weights_format in ("OIX", "IOX") else np.moveaxis(w, (0, 1), (-1, -2))


def deconv_grad_filter(dy: np.ndarray, x: np.ndarray, params, layout: str = "dsp") -> np.ndarray:
    """DeconvGradFilter (spec §3) from NHWC ``dy`` and ``x`` and the 18 ``params``, as the DSP
    library states it: per image and group, ``dW_g += A_g(dy) @ X_g`` where ``A_g`` is dy's
    im2row (row ``(c*kh + kr)*kw + kc``, column ``h*in_w + w``, value ``dy[h*sh - pu + kr*dh,
    w*sw - pl + kc*dw, g*OCg + c]``, 0 outside) and ``X_g[(h, w), i] = x[h, w, g*m + i]``.

    ``layout="dsp"``: ``[group, OCg*kh*kw, m]``; ``"mindspore"``: MindSpore's ``[OCg*kh*kw, in_c]``
    (group g at columns ``g*m``)."""
    (_, in_h, in_w, in_c, batch, out_h, out_w, out_c, kh, kw, sh, sw, pu, pl, dh, dw, group, _) = (int(v) for v in params)
    dy = np.asarray(dy, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    ocg, m = out_c // group, in_c // group
    rows = np.arange(ocg * kh * kw)
    c, kr, kc = rows // (kh * kw), rows // kw % kh, rows % kw
    hh, ww = np.meshgrid(np.arange(in_h), np.arange(in_w), indexing="ij")
    y = hh.reshape(1, -1) * sh - pu + kr[:, None] * dh  # (rows, in_h*in_w)
    xcol = ww.reshape(1, -1) * sw - pl + kc[:, None] * dw
    inside = (y >= 0) & (y < out_h) & (xcol >= 0) & (xcol < out_w)
    yc, xc = np.clip(y, 0, out_h - 1), np.clip(xcol, 0, out_w - 1)
    out = np.zeros((group, ocg * kh * kw, m))
    for b in range(batch):
        for g in range(group):
            a = np.where(inside, dy[b, yc, xc, g * ocg + c[:, None]], 0.0)
            out[g] += a @ x[b].reshape(in_h * in_w, in_c)[:, g * m : (g + 1) * m]
    if layout == "mindspore":
        return np.concatenate(list(out), axis=1)
    return out
