"""TE compute of the forward convolution (TBE's ``conv``) on a 5HD fmap and a FracZ(_g) weight.

``y[n, co, ho, wo] = sum_{ci, kh, kw} x[n, g*Cin_g + ci, ho*sh - pt + kh*dh, wo*sw - pl + kw*dw] *
w[co, ci, kh, kw]`` (``g`` the group of ``co``; x read as 0 outside the image): the cube's third GEMM,
on the pixel-tile schedule of the dX phases (a tile of output pixels x 16 output channels on the
lanes, each reduction step one weight row times the tile's broadcast x values). Where the windows
read x's zero padding in enough of their (output, tap) pairs (a 3x3 at pad 1 on maps of 14 and
less), the 2-D mad is one ``conv_cc_<first row>_<first column>`` per live-tap region of the output
(:func:`.phases.output_runs`, :func:`.phases.region_grid`), each over its taps only, and the
result picks each pixel from its region (ResNet-50's 512 -> 512 3x3 on 7x7, N=8, Zen 4: 10.4 ->
9.5 ms); the bf16 pair form of an ungrouped layer likewise, below its own thresholds
(:func:`.phases.region_split_below`; Zen 4, bf16: ASPP 2048 -> 256 on 14x14, N=4, rate 6 20-21 ->
12.5 ms, rate 12 22-23 -> 7.6-7.9; 512 -> 512 on 4x4, N=32, 5.5-6.1 -> 4.4).

Stages, sums in fp32:

==============  ============================================  =============================================
stage           shape                                         value
==============  ============================================  =============================================
``fmap_pad``    ``(N, g_extend*cin1_g, PH, PW, Hq, Wq, 16)``  x with the zero rows / columns the taps reach,
                                                              fp32, by stride phase (left out where
                                                              there is no padding, no stride and x is
                                                              fp32 already: the mad reads x)
``w_conv``      ``(g_extend*cout1_g, cin1_g, KH, KW, 16, 16)`` the FracZ weight, ``[.., ci0, co0]`` (a row
                                                              of 16 output channels per input lane)
``conv_cc``     ``(N, g_extend*cout1_g, Ho, Wo, 16)``         the mad (``Formulation.CUBE_FWD``); by regions
                                                              ``conv_cc_<h0>_<w0>``, each its rows x columns
``C``           ``(N, ceil(Cout,16), Ho*Wo, 16)``             each output channel from its extended group
                                                              (+ bias), ``res_dtype``, tag
                                                              ``convolution_C`` (TBE's)
==============  ============================================  =============================================

with ``conv_cc[n, co1, j, i, c0] = sum_{ci1, kh, kw, ci0} xpad[n, e*cin1_g + ci1, j*sh + kh*dh,
i*sw + kw*dw, ci0] * w_conv[co1, ci1, kh, kw, ci0, c0]``, ``e = co1 // cout1_g``, ``xpad`` x with
``pt`` rows and ``pl`` columns of zeros before it. ``fmap_pad`` holds padded row ``yq*sh + rh`` at
``[.., rh, .., yq, ..]`` (``PH = sh`` phases, 1 for a one-row kernel, which reads phase 0 only), so a
tap reads consecutive rows of one phase, ``Hq = Ho + (KH-1)*dh // sh`` of them; columns likewise.
One extended group of fewer than 16 input channels (a network's first layer) sums over its real
channels only: the ``ci0`` axis has ``Cin`` steps; an fp32 Cin of one group past 16 that is not whole
blocks likewise, in ``ci1`` runs of ``gcd(Cin, 16)`` channels (:func:`.common.real_channel_run`).

**Planar** (``planar``, a frontend's NCX tensors; fp32 1x1 at stride 1, :func:`planar_forward`):
``x_rows (N, Cin, H, W)`` (x's planes, read in place), ``w_t (Cin, Cout)`` and the mad ``conv_px
(N, Cout, Ho, Wo) = sum_ci x_rows[n, ci, j, i] * w_t[ci, co]`` with the pixels on the lanes
(``Formulation.PIXEL_LANES``), read by ``C`` as any mad.

**bf16 pairs** (``bf16_pairs``, bf16 x and weight; ``Formulation.CUBE_FWD_BF16``, what a
``vdpbf16ps`` target builds): ``fmap_pad`` and ``w_conv`` hold pairs of input channels ``(2q,
2q+1)`` in one ``uint32`` (:mod:`.pairs`; their last axes ``8`` and ``(8, 16)``) and the mad sums
:func:`.pairs.pair_dot` over the 8 pairs (a stem over ``ceil(Cin/2)``).

**3-D** (``geom.depth``; x NDC1HWC0 ``(N, D, C1, H, W, 16)``, the weight FracZ_3D ``(KD*C1x*KH*KW,
cout1_g, 16, 16)``, depth tap outermost): output plane ``do`` of image ``n`` is mad row ``n*Do + do``,
and the depth taps join the channel-block reduction (``ci1 = kd*cin1_g + ci1'``); ``fmap_pad`` is
``(N, Dp, C1, PH, PW, Hq, Wq, 16)`` and the result ``(N*Do, ceil(Cout,16), Ho*Wo, 16)``.
"""

from __future__ import annotations

from typing import Callable

from tvm import te, tirx

from ... import layout
from ...layout import C0, ceil_div
from ...params import ConvGradParams
from .common import ACC, NEVER, channel_lanes, first_holding, guarded, inside, planar_gemm, real_channel_run
from .depthwise import depthwise_channels, depthwise_forward
from .depthwise_planar import depthwise_plane_sums, planar_depthwise
from .pairs import pair, pair_dot
from .phases import AxisPhase, output_runs, region_grid, region_split_below, tap_hull, whole_axis
from .stages import (CONV_CC, CONV_PX, CONV_RES, CONV_TAG, FMAP_PAD, FORMULATION, MAD_TAG, PHASE_AXES, READ_IN_PLACE, W_CONV, W_T, X_ROWS, Formulation,
                     phase_name)

__all__ = ["conv_compute", "conv_output_shape", "planar_forward"]

PLANAR_FORWARD = True  # (off: an NCX 1x1 forward on the cube; for A/B)


def planar_forward(params: ConvGradParams, dtype: str) -> bool:
    """An fp32 forward that is one GEMM per image over channel-planar tensors: a 1x1 kernel at
    stride 1 without padding, one group, 16 output channels or more, planes of whole 16-pixel
    vectors (``y[n, co, p] = sum_ci w[co, ci] * x[n, ci, p]``). With the pixels on the lanes it
    reads NCX x where it lies and writes NCX rows from its accumulators, as the planar dX
    (:func:`.backprop_input.planar_pixel_lanes`)."""
    g = params.geom
    return PLANAR_FORWARD and planar_gemm(g, dtype) and g.groups == 1 and g.cout >= C0 and g.ho * g.wo % C0 == 0

def conv_output_shape(params: ConvGradParams) -> tuple[int, int, int, int]:
    """TBE's result shape ``(N*Do, ceil(Cout,16), Ho*Wo, 16)`` (``Do = 1`` in 2-D)."""
    g = params.geom
    planes = g.depth.out if g.depth else 1
    return (g.batch * planes, ceil_div(g.cout, C0), g.ho * g.wo, C0)


def conv_compute(data: te.Tensor, weight: te.Tensor, params: ConvGradParams, bias: te.Tensor | None = None,
                 rows_and_columns: bool = False, bf16_pairs: bool = False, planar: bool = False) -> te.Tensor:  # fmt: skip
    """``y`` of TBE's shape ``(N, ceil(Cout,16), Ho*Wo, 16)`` from 5HD ``data`` and FracZ(_g)
    ``weight`` (3-D: NDC1HWC0 and FracZ_3D, the result ``(N*Do, ..)``); ``bias`` ``(Cout,)`` or
    ``(align(Cout,16),)`` is added to the fp32 sums, and the result is rounded once to
    ``params.res_dtype``.

    ``rows_and_columns``: the same memory as 5HD ``(N, C1, Ho, Wo, 16)`` (a frontend's layout
    stage reads it with affine indices, so the schedule can write each task's output while the
    task's sums are in cache). ``bf16_pairs``: the mad on bf16 pairs of input channels (see the
    module docstring). ``planar``: a frontend's x and y lie channel-planar (NCX, the 5HD views
    layout stages), so a 1x1 at stride 1 runs with the pixels on the lanes (:func:`planar_forward`),
    and an fp32 depthwise layer plane by plane (:func:`.depthwise_planar.planar_depthwise`); any other depthwise
    layer of one output channel per group runs with its channels on the lanes (:func:`.depthwise.depthwise_forward`)."""
    g = params.geom
    ext = g.group
    pairs = bf16_pairs and data.dtype == "bfloat16" and weight.dtype == "bfloat16"
    if planar and planar_forward(params, data.dtype) and weight.dtype == ACC:
        return _result(_pixel_lane_sums(data, weight, params), params, bias, rows_and_columns, identity=True)
    if planar and planar_depthwise(params, data.dtype) and weight.dtype == ACC:
        return _result(depthwise_plane_sums(data, weight, params), params, bias, rows_and_columns, identity=True)
    if depthwise_channels(params):
        return _result(depthwise_forward(_fmap_pad(data, params)[1], weight, params), params, bias, rows_and_columns, identity=True)
    _, read_x = _fmap_pad(data, params, pairs)
    depth = g.depth
    kd_n = depth.kernel if depth else 1
    one_block = ext.g_extend == 1 and ext.cin1_g == 1 and g.cin < C0  # the real channels only
    run = real_channel_run(g.cin, data.dtype, pairs) if g.groups == 1 and depth is None and not one_block else 0  # likewise, in runs

    lanes = g.cin if one_block else run or C0
    rows = g.batch * (depth.out if depth else 1)
    kind = Formulation.CUBE_FWD_BF16 if pairs else Formulation.CUBE_FWD
    whole_h, whole_w = whole_axis(g.ho, g.kh), whole_axis(g.wo, g.kw)
    grid = [(whole_h, whole_w)]
    if depth is None and (not pairs or ext.g_extend == 1):  # by live-tap regions where they pay (see .phases; the pair form
        (sh, sw), (dh, dw), (pt, _, pl, _) = g.strides, g.dilations, g.pads  # of a grouped layer keeps one mad: its regions did not tensorize)
        below = region_split_below(pairs, g.batch, g.ho * g.wo)
        grid = region_grid(output_runs(g.ho, g.kh, sh, pt, dh, g.h, below), [whole_w], output_runs(g.wo, g.kw, sw, pl, dw, g.w, below))
    grid = grid or [(whole_h, whole_w)]  # (every output on padding only: one mad of zeros, not a result of constants)
    taps_h, taps_w = (tap_hull(axis) for axis in zip(*grid))  # taps no output reads are neither packed nor read
    w_conv = _w_conv(weight, params, pairs, taps_h, taps_w)

    def region_mad(ph: AxisPhase, pw: AxisPhase) -> te.Tensor:
        """The sums of the outputs ``ph x pw`` over their live taps ``(ph.tap0 + kh, pw.tap0 + kw)``."""
        ci1 = te.reduce_axis((0, g.cin // run if run else kd_n * ext.cin1_g), name="ci1")
        kh = te.reduce_axis((0, ph.taps), name="kh")
        kw = te.reduce_axis((0, pw.taps), name="kw")
        ci0 = te.reduce_axis((0, ceil_div(lanes, 2) if pairs else lanes), name="ci0")  # pairs: the pair q

        def mad(row, co1, j, i, c0):
            e = co1 // ext.cout1_g
            tap_h, tap_w, y, x = ph.tap0 + kh, pw.tap0 + kw, ph.first + j, pw.first + i
            w_block, lane = ci1, ci0
            if run:  # the real Cin channels only: channel ci1 * run + ci0 (2-D, one group)
                channel = ci1 * run + ci0
                w_block, lane = channel // C0, channel % C0
                x_at = read_x((row,), w_block, tap_h, tap_w, y, x, lane)
            elif depth is None:
                x_at = read_x((row,), e * ext.cin1_g + ci1, tap_h, tap_w, y, x, ci0)
            else:
                n, plane = row // depth.out, row % depth.out
                tap, block = ci1 // ext.cin1_g, ci1 % ext.cin1_g
                x_at = read_x((n, plane * depth.stride + tap * depth.dilation), e * ext.cin1_g + block, tap_h, tap_w, y, x, ci0)
            w_at = w_conv[co1, w_block, tap_h - taps_h.start, tap_w - taps_w.start, lane, c0]
            return te.sum(pair_dot(w_at, x_at) if pairs else x_at * w_at, axis=[ci1, kh, kw, ci0])

        name = CONV_CC if len(grid) == 1 else phase_name(CONV_CC, ph.first, pw.first)
        attrs = {FORMULATION: kind.value} if len(grid) == 1 else {FORMULATION: kind.value, PHASE_AXES: [1, 1, g.ho, g.wo]}
        return te.compute((rows, ext.g_extend * ext.cout1_g, ph.count, pw.count, C0), mad, name=name, tag=MAD_TAG, attrs=attrs)

    regions = [(ph, pw, region_mad(ph, pw)) for ph, pw in grid]

    def sums(row, block, h, w, c0):
        """The sums of output ``(h, w)`` from its region's mad (0 where no tap reaches it)."""
        return first_holding(((ph.holds(h, 1, g.ho) + pw.holds(w, 1, g.wo), mad[row, block, ph.index(h, 1), pw.index(w, 1), c0].asobject())
                              for ph, pw, mad in regions), tirx.const(0.0, ACC))  # fmt: skip

    identity = ext.multiple == 1 and (ext.groups == 1 or ext.cout_g % C0 == 0)
    return _result(sums, params, bias, rows_and_columns, identity)


def _result(sums: Callable, params: ConvGradParams, bias: te.Tensor | None, rows_and_columns: bool, identity: bool) -> te.Tensor:
    """TBE's result stage ``C`` from ``sums(row, block, h, w, c0)`` (a mad's sums of extended-group
    block ``block``; ``identity``: the blocks are the output channels'), + bias, rounded once."""
    g = params.geom
    ext = g.group

    def result(row, c1, *pixel):
        *pixel, c0 = pixel
        h, w = pixel if rows_and_columns else (pixel[0] // g.wo, pixel[0] % g.wo)
        channel = c1 * C0 + c0
        if identity:
            value = sums(row, c1, h, w, c0)
        else:  # the channel's column in its extended group (TBE's FracZ_g slots)
            group = tirx.min(channel, g.cout - 1) // ext.cout_g
            col = group % ext.multiple * ext.cout_g + tirx.min(channel, g.cout - 1) % ext.cout_g
            block = group // ext.multiple * ext.cout1_g + col // C0
            value = guarded([channel < g.cout] if ceil_div(g.cout, C0) * C0 > g.cout else [], sums(row, block, h, w, col % C0))
        if bias is not None:
            conds = [channel < int(bias.shape[0])] if int(bias.shape[0]) < ceil_div(g.cout, C0) * C0 else []
            value = value + guarded(conds, bias[tirx.min(channel, int(bias.shape[0]) - 1) if conds else channel].astype(ACC))
        return value.astype(params.res_dtype)

    rows, blocks, pixels, lanes = conv_output_shape(params)
    return te.compute(
        (rows, blocks, g.ho, g.wo, lanes) if rows_and_columns else (rows, blocks, pixels, lanes),
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


def _pixel_lane_sums(data: te.Tensor, weight: te.Tensor, params: ConvGradParams) -> Callable:
    """The planar forward's mad ``conv_px (N, Cout, Ho, Wo)`` (``Formulation.PIXEL_LANES``, the
    planar dX's schedule: channels x vectors of consecutive pixels) over ``x_rows (N, Cin, H, W)``
    (x's planes, ``read_in_place``: the CPU rule inlines it) and ``w_t (Cin, Cout)`` (the weight
    with each input channel's row of output channels contiguous: a tile's broadcasts); returns the
    ``sums`` the result reads (the lanes past Cout masked, the index clamped: branch-free)."""
    g = params.geom
    x_rows = te.compute((g.batch, g.cin, g.h, g.w), lambda n, ci, y, x: data[n, ci // C0, y, x, ci % C0], name=X_ROWS, tag=X_ROWS,
                        attrs={READ_IN_PLACE: 1})  # fmt: skip
    w_t = te.compute((g.cin, g.cout), lambda ci, co: weight[layout.fracz_row(ci // C0, 0, 0, 1, 1), co // C0, co % C0, ci % C0].astype(ACC),
                     name=W_T, tag=W_T)  # fmt: skip
    ci = te.reduce_axis((0, g.cin), name="ci")
    kh, kw = te.reduce_axis((0, 1), name="kh"), te.reduce_axis((0, 1), name="kw")
    conv_px = te.compute((g.batch, g.cout, g.ho, g.wo), lambda n, co, j, i: te.sum(x_rows[n, ci, j + kh, i + kw] * w_t[ci, co], axis=[ci, kh, kw]),
                         name=CONV_PX, tag=MAD_TAG, attrs={FORMULATION: Formulation.PIXEL_LANES.value})  # fmt: skip

    return channel_lanes(conv_px, g.cout)


def _phases(kernel: int, stride: int) -> int:
    """Stride phases a strided axis packs: one where a single tap reads it (every output reads
    phase 0), else all ``stride``."""
    return 1 if kernel == 1 else stride


def _holds_image(positions: int, stride: int, phases: int, before: int, size: int) -> bool:
    """Whether a phase-split axis (padded positions ``q*stride + r``, ``q < positions``, ``r <
    phases``) holds any image position ``[before, before + size)``: a strided one-tap axis holds
    phase 0 only, and may hold nothing but padding."""
    return any(before <= q * stride + r < before + size for q in range(positions) for r in range(phases))


def _fmap_pad(data: te.Tensor, params: ConvGradParams, pairs: bool = False) -> tuple[te.Tensor, Callable]:
    """``(x as the mad reads it, read)``: fp32 with the zero padding its taps reach, each strided
    axis split into its stride phases (``[.., rh, rw, yq, xq, c0]`` holds padded position ``(yq*sh +
    rh, xq*sw + rw)``, so a tap reads consecutive positions of one phase, and a 1x1 strided
    conv packs only the positions it reads); ``data`` itself where that would only copy it (fp32,
    nothing to pad, stride 1). ``read(n_index, block, kh, kw, j, i, ci0)`` is the mad's load of
    padded position ``(j*sh + kh*dh, i*sw + kw*dw)`` (``n_index``: the batch index, and in 3-D
    the padded plane). ``pairs``: bf16 pairs of channels, ``(.., 8)`` words (always packed)."""
    g = params.geom
    (sh, sw), (dh, dw), (pt, _, pl, _) = g.strides, g.dilations, g.pads
    depth = g.depth is not None
    blocks, c1_x = g.group.g_extend * g.group.cin1_g, int(data.shape[2 if depth else 1])
    reach = ((g.ho - 1) * sh + (g.kh - 1) * dh + 1, (g.wo - 1) * sw + (g.kw - 1) * dw + 1)
    plane_pad = g.depth.pad_before if depth else 0
    planes = (g.depth.out - 1) * g.depth.stride + (g.depth.kernel - 1) * g.depth.dilation + 1 if depth else 0
    if (not pairs and data.dtype == ACC and not (pt or pl or plane_pad) and reach[0] <= g.h and reach[1] <= g.w and (not depth or planes <= g.depth.size)
            and (sh, sw) == (1, 1) and blocks <= c1_x):  # fmt: skip
        if depth:
            return data, lambda lead, c1, kh, kw, j, i, c0: data[lead[0], lead[1], c1, j + kh * dh, i + kw * dw, c0]
        return data, lambda lead, c1, kh, kw, j, i, c0: data[lead[0], c1, j + kh * dh, i + kw * dw, c0]
    ph, pw = _phases(g.kh, sh), _phases(g.kw, sw)
    rows, cols = g.ho + (g.kh - 1) * dh // sh, g.wo + (g.kw - 1) * dw // sw  # positions of a phase the taps reach

    never = not (_holds_image(rows, sh, ph, pt, g.h) and _holds_image(cols, sw, pw, pl, g.w))

    def value(*index):
        n, *plane, c1, rh, rw, yq, xq, c0 = index
        y, x = yq * sh + rh, xq * sw + rw
        conds = [NEVER] if never else inside((*plane, y, x), (plane_pad, pt, pl)[-len(plane) - 2 :],
                                             ((g.depth.size,) if depth else ()) + (g.h, g.w), ((planes,) if depth else ()) + (rows * sh, cols * sw))  # fmt: skip
        conds += [c1 < c1_x] if blocks > c1_x else []
        at = (*(p - plane_pad for p in plane), y - pt, x - pl)
        read = data[(n, at[0], c1, at[1], at[2], c0)] if depth else data[n, c1, at[0], at[1], c0]
        return guarded(conds, read.astype(data.dtype if pairs else ACC))

    shape = (g.batch, *((planes,) if depth else ()), blocks, ph, pw, rows, cols)
    if pairs:
        fmap = te.compute((*shape, C0 // 2), lambda *i: pair(value(*i[:-1], 2 * i[-1]), value(*i[:-1], 2 * i[-1] + 1)), name=FMAP_PAD, tag=FMAP_PAD)
    else:
        fmap = te.compute((*shape, C0), value, name=FMAP_PAD, tag=FMAP_PAD)

    def read(lead, c1, kh, kw, j, i, c0):
        tap_h, tap_w = kh * dh, kw * dw
        return fmap[(*lead, c1, tap_h % sh if ph > 1 else 0, tap_w % sw if pw > 1 else 0, j + tap_h // sh, i + tap_w // sw, c0)]

    return fmap, read


def _w_conv(weight: te.Tensor, params: ConvGradParams, pairs: bool, taps_h: range, taps_w: range) -> te.Tensor:
    """The FracZ(_g) weight ``(KD*g_extend*cin1_g*KH*KW, cout1_g, 16 co0, 16 ci0)`` as
    ``(g_extend*cout1_g, KD*cin1_g, len(taps_h), len(taps_w), 16 ci0, 16 co0)`` fp32, the taps
    ``taps_h x taps_w`` (those some output reads: the centre tap alone of a 3x3 at pad 1 on a 1x1
    map): each input lane's row of 16 output channels contiguous (the mad's vector operand);
    ``pairs``: ``(.., 8 q, 16 co0)`` words of input lanes ``(2q, 2q+1)``."""
    g = params.geom
    ext = g.group
    per_tap = int(weight.shape[0]) // (g.kd * g.kh * g.kw)  # C1 blocks of FracZ rows per depth tap

    def value(co1, ci1, kh, kw, ci0, co0):
        e, block = co1 // ext.cout1_g, co1 % ext.cout1_g
        tap, c1 = (ci1 // ext.cin1_g, ci1 % ext.cin1_g) if g.depth is not None else (0, ci1)
        c1 = e * ext.cin1_g + c1
        conds = [c1 < per_tap] if ext.g_extend * ext.cin1_g > per_tap else []  # blocks past the channels
        row = layout.fracz_row(tap * per_tap + (tirx.min(c1, per_tap - 1) if conds else c1), kh + taps_h.start, kw + taps_w.start, g.kh, g.kw)
        return guarded(conds, weight[row, block, co0, ci0].astype(weight.dtype if pairs else ACC))

    shape = (ext.g_extend * ext.cout1_g, g.kd * ext.cin1_g, len(taps_h), len(taps_w))
    if pairs:
        return te.compute((*shape, C0 // 2, C0), lambda co1, ci1, kh, kw, q, co0: pair(value(co1, ci1, kh, kw, 2 * q, co0), value(co1, ci1, kh, kw, 2 * q + 1, co0)),
                          name=W_CONV, tag=W_CONV)  # fmt: skip
    return te.compute((*shape, C0, C0), value, name=W_CONV, tag=W_CONV)
