"""TE compute of ``conv2d_backprop_input`` (dX) on a 5HD dy and a FracZ(_g) forward weight.

dX is the transposed convolution ``dX[h] = sum_kh dyd[h + pad - kh*dil]`` of the zero-inserted dy
``dyd`` (TBE's ``dy_filling``, spec §3.6). Instead of multiplying the inserted zeros, the output is
split by stride phase (sub-pixel decomposition): the rows ``h`` with ``(h + pad) % stride == r``
only meet the taps ``kh`` with ``kh*dil % stride == r``, and for them ``dyd`` lands on real dy rows
``y = j + base_r - m*(dil/g)`` (``h = h_r + j*stride``, ``kh = kh0_r + m*(stride/g)``,
``g = gcd(dil, stride)``). Each phase is a stride-1 correlation over a zero-padded dy with a
constant offset per tap; stride 1 is the single phase ``r = 0``. Where an axis's taps read dy's
zero padding in enough of its (output, tap) pairs (atrous layers; a 3x3 on a small map), the 2-D
cube splits each phase further into live-tap regions (the interior and the borders, each with
only the taps that reach real dy). See :mod:`.phases`.

Stages, inputs fp16, reduction fp32:

==================  ============================================  ==========================================
stage               shape                                         value
==================  ============================================  ==========================================
``dy_pad``          ``(N, g_extend*dy_c1_extend, Hy, Wy, 16)``    dy with the zero rows/cols the taps reach
                                                                  (fp32 dy the taps read without padding,
                                                                  a 1x1 at stride 1: dy itself, read in place)
``w_col``           ``(C1x, dy_c1_extend, KH, KW, 16, 16)``       the FracZ weight, ``[.., co0, ci0]``
``dx_cc_{rh}_{rw}`` ``(N, C1x, H_rh, W_rw, 16)``                  one phase's mad (phases with taps only)
``c_ddr``           ``(N, C1x, H*W, 16)``, ``res_dtype``          each pixel from its phase (+ bias), tag
                                                                  ``conv2d_backprop_input``
==================  ============================================  ==========================================

with ``dx_cc[n, c1, j, i, c0] = sum_{co1, mh, mw, co0} dy_pad[n, e*dy_c1_extend + co1, j + off_h(mh),
i + off_w(mw), co0] * w_col[c1, co1, kh(mh), kw(mw), co0, c0]``, ``e = c1 // dx_c1_extend``. An fp32
dX of one group whose Cout is not whole blocks sums its real channels only: ``co1`` runs of ``step =
gcd(Cout, 16)`` channels, channel ``co1*step + co0`` read at block ``channel // 16``, lane ``channel % 16``
(:func:`.common.real_channel_run`).

**Depthwise** (``Cin/groups == 1``): one ``dx_dw`` mad per phase with channels on the lanes, see
:mod:`.depthwise`.

**Pixel lanes** (few input channels in one extended group, e.g. a network's first layer): the 16
lanes hold 16 output columns instead of 16 channels, so no lane computes a padding channel:
``dy_rows (N, Cout, Hy, Wy)`` and ``w_t (Cout, Cin, KH, KW)`` fp32 (NCHW / OIHW), one
``dx_px_{rh}_{rw} (N, Cin, H_rh, W_rw)`` per phase summing ``dy_rows[n, co, j + off_h(mh), i +
off_w(mw)] * w_t[co, ci, kh(mh), kw(mw)]`` over ``(co, mh, mw)``, and ``c_ddr`` as above (0 past Cin).

**3-D** (``geom.depth``, the framework operators' rank 3; dy NDC1HWC0 ``(N, Do, C1, Ho, Wo, 16)``,
the weight FracZ_3D ``(KD*C1x*KH*KW, dy_c1_extend, 16, 16)``, depth tap outermost): the cube with
the depth folded into the batch (:class:`.phases.DepthFold`). ``dy_pad`` is ``(N*Dy, ..)`` over
dy's zero-padded planes, ``w_col`` ``(C1x, KD*dy_c1_extend, ..)``, one ``dx_cc_{rd}_{rh}_{rw}``
per depth x row x column phase with ``N*D_rd`` rows whose Cout-block reduction runs over the
phase's depth taps too (``co1 = md*dy_c1_extend + co1'``), and ``c_ddr`` ``(N*D, C1x, H*W, 16)``
(image ``n``, plane ``d`` at row ``n*D + d``). The schedules see the 2-D loop nest.
"""

from __future__ import annotations

from functools import partial

import tvm
from tvm import te, tirx

from ... import layout
from ...layout import C0
from ...params import ConvGradParams
from .common import ACC, first_holding, guarded, masked, planar_gemm, real_channel_run
from .depthwise import depthwise, depthwise_input_phases
from .dx_amx import amx_phases
from .pairs import pair, pair_dot
from .phases import (AxisPhase, DepthFold, DyWindow, axis_phases, depth_fold, dy_window, live_tap_regions, region_split_below,
                     phase_stage_name, region_grid)
from .stages import (C_DDR, DX_PX, DX_TAG, DY_PAD, DY_ROWS, FORMULATION, MAD_TAG, PHASE_AXES, READ_IN_PLACE, W_COL, W_T,
                     WIDE_TILES_IN_PLACE, Formulation)

__all__ = ["AxisPhase", "axis_phases", "conv2d_backprop_input_compute", "phase_stage_name", "pixel_lanes_input_grad"]

DY_IN_PLACE = True
"""An fp32 2-D dX whose taps read no padding (a 1x1 at stride 1) reads dy where it lies, no
``dy_pad`` (Zen 4, N=8, fp32, NXC / NCX: ResNet-50's 128 -> 512 1x1 on 28x28 6.9 -> 5.1 / 6.0 -> 4.9
ms, 64 -> 256 on 56x56 7.4 -> 5.6 / 7.7 -> 5.7, the stride-2 256 -> 512 on 56x56 11.7 -> 9.8 / 11.5 ->
10.2; a layer whose dy is the smaller side, 256 -> 64, unchanged)."""

PLANAR_IN_PLACE_BYTES = 1024
"""A channel-planar (NCX) dy whose planes are smaller than this is read in place only where the
schedule's tiles are wide (``WIDE_TILES_IN_PLACE``): the cube's tiles broadcast a few pixels of
every plane in turn, and on a small map each tile walks the image's whole dy again. AVX2's 6-pixel
tiles read a few words of each line (Zen 3, N=8, ResNet-50's 512 -> 2048 and 2048 -> 512 1x1 dX on
7x7 planes of 196 B: packed 1.56x and 1.38x faster, 1024 -> 256 on 14x14 (784 B) 1.01-1.08x); AVX-512's
14-pixel tiles read most of each line (Zen 4, N=8, cold: 256 -> 1024 on 14x14 4.98 -> 4.27 ms in
place, 512 -> 2048 on 7x7 4.47 -> 4.21, 2048 -> 512 on 7x7 4.80 -> 4.69). On 28x28 and 56x56 in
place is 1.2-1.4x faster on both."""

PIXEL_LANES_MAX_CIN = 8  # at most half the lanes of a channel block would be real channels


def pixel_lanes_input_grad(params: ConvGradParams, planar: bool = False, dtype: str = ACC) -> bool:
    """Whether dX puts output columns on the lanes (2-D, one extended group): at most 8 channels;
    or, where the framework's dy and dX lie channel-planar (``planar``: NCX), an fp32 1x1 at
    stride 1 without padding whose planes are whole vectors (:func:`planar_pixel_lanes`)."""
    g = params.geom
    if g.group.g_extend != 1 or g.depth is not None:
        return False
    return g.cin <= PIXEL_LANES_MAX_CIN or (planar and planar_pixel_lanes(params, dtype))


def planar_pixel_lanes(params: ConvGradParams, dtype: str = ACC) -> bool:
    """An fp32 dX that is one GEMM per image over channel-planar tensors: a 1x1 kernel at stride
    1 without padding (``dx[n, ci, p] = sum_co w[co, ci] * dy[n, co, p]``) whose planes are whole
    16-pixel vectors. With the pixels on the lanes it reads NCX dy where it lies and writes NCX
    dX rows straight from its accumulators: no dy pack, no transpose of a channel-lane result.
    (A 14x14 plane, 12 vectors and a part of one, measured 10-22% slower than the cube reading
    dy in place: every other plane starts off a cache line, and the part is a tile of its own.)"""
    g = params.geom
    return planar_gemm(g, dtype) and g.h * g.w % C0 == 0 and g.cin >= C0


def conv2d_backprop_input_compute(
    filters: te.Tensor, dy: te.Tensor, params: ConvGradParams, bias: te.Tensor | None = None, bf16_pairs: bool = False, planar: bool = False,
    amx: bool = False,
) -> te.Tensor:
    """dX of TBE's shape ``(N, ceil(Cin,16), H*W, 16)`` from FracZ ``filters`` and 5HD ``dy``
    (3-D: ``(N*D, ..)`` from FracZ_3D and NDC1HWC0 dy, see the module docstring).

    ``planar``: a frontend's dy and dX lie channel-planar (NCX, the 5HD views layout stages), so
    a 1x1 at stride 1 runs with the pixels on the lanes (:func:`planar_pixel_lanes`).

    ``bf16_pairs`` (bf16 inputs on the cube): the packs hold bf16 pairs of Cout lanes and the mads
    sum :func:`.pairs.pair_dot` (``Formulation.CUBE_DX_BF16``), the form a ``vdpbf16ps`` target
    runs; the depthwise and pixel-lane formulations ignore it. ``amx`` (with ``bf16_pairs``, 2-D cube):
    each phase one GEMM on flat pixel rows in AMX tiles (``Formulation.CUBE_DX_AMX``, :mod:`.dx_amx`)."""
    g = params.geom
    (sh, sw), (dil_h, dil_w), (pu, _, pl, _) = g.strides, g.dilations, g.pads
    rows = axis_phases(g.h, g.kh, sh, pu, dil_h)
    cols = axis_phases(g.w, g.kw, sw, pl, dil_w)
    pairs = bf16_pairs and dy.dtype == "bfloat16" and filters.dtype == "bfloat16"
    grid = [(ph, pw) for ph in rows for pw in cols]
    pixel_lanes = pixel_lanes_input_grad(params, planar, dy.dtype)
    tiles = pairs and amx and g.depth is None and not depthwise(params) and not pixel_lanes  # whole phases: a tile costs the same with zeros in it
    if g.depth is None and not depthwise(params) and not pixel_lanes and not tiles:  # the 2-D cube: by live-tap regions where they pay
        below = region_split_below(pairs, g.batch, g.h * g.w)
        grid = region_grid(live_tap_regions(rows, sh, g.ho, below), cols, live_tap_regions(cols, sw, g.wo, below))

    window = dy_window([ph for ph, _ in grid], [pw for _, pw in grid], g.ho, g.wo)
    if g.depth is not None:
        d = g.depth
        fold = depth_fold(d.size, d.kernel, d.stride, d.pad_before, d.dilation, d.out)
        phases, read = _cube_phases(filters, dy, params, grid, window, fold, pairs)
    else:
        if depthwise(params):
            phase_mads = depthwise_input_phases
        elif pixel_lanes:
            phase_mads = _pixel_lane_phases
        elif tiles:
            phase_mads = amx_phases
        else:
            phase_mads = partial(_cube_phases, pairs=pairs, planar=planar)
        fold = None
        found, read = phase_mads(filters, dy, params, grid, window)
        phases = [(None, ph, pw, mad) for ph, pw, mad in found]

    def result(n, c1, hw, c0):  # 3-D: n is image x plane
        h, w = hw // g.w, hw % g.w
        image, plane = (n // fold.size, n % fold.size) if fold else (n, None)
        def choice(pd, ph, pw, mad):  # each pixel reads its own phase
            row = n if pd is None else image * pd.count + plane // g.depth.stride
            conds = ph.holds(h, sh, g.h) + pw.holds(w, sw, g.w)
            conds += [plane % g.depth.stride == pd.first] if pd is not None and g.depth.stride > 1 else []
            return conds, read(mad, row, c1, ph.index(h, sh), pw.index(w, sw), c0)

        value = first_holding((choice(*phase) for phase in phases), tirx.const(0.0, ACC))
        if bias is not None:
            channel = c1 * C0 + c0
            conds = [channel < int(bias.shape[0])] if int(bias.shape[0]) < g.c1_x * C0 else []
            value = value + guarded(conds, bias[channel].astype(ACC))
        return value.astype(params.res_dtype)

    planes = g.depth.size if g.depth else 1
    return te.compute(
        layout.shape_dx_result((g.batch * planes, g.cin, g.h, g.w)),
        result,
        name=C_DDR,
        tag=DX_TAG,
        attrs={
            "kernel_name": params.kernel_name,
            "output_shape": list(layout.shape_5hd(g.batch * planes, g.cin, g.h, g.w)),
            "output_dtype": params.res_dtype,
            "flops": params.flops,
        },
    )


def _cube_phases(filters: te.Tensor, dy: te.Tensor, params: ConvGradParams, grid, window: DyWindow, fold: DepthFold | None = None,
                 pairs: bool = False, planar: bool = False):  # fmt: skip
    """One ``dx_cc`` mad per phase, 16 input channels on the lanes (3-D: per depth phase too,
    its taps folded into the Cout-block reduction, see :class:`.phases.DepthFold`). With
    ``pairs``, ``dy_pad`` and ``w_col`` hold bf16 pairs of Cout ``(2q, 2q+1)`` (:mod:`.pairs`);
    ``planar``: dy's 5HD view is of an NCX tensor (see :data:`PLANAR_IN_PLACE_BYTES`)."""
    g = params.geom
    ext = g.group
    top, left = window.top, window.left
    c1_dy = ext.g_extend * ext.cout1_g
    dtype = dy.dtype if pairs else ACC

    if fold is None:
        def pad_value(n, c1, y, x, c0):
            conds = ([c1 < g.c1_y] if c1_dy > g.c1_y else []) + window.conds(y, x)
            return guarded(conds, dy[n, c1, y - top, x - left, c0].astype(dtype))

        def col_value(c1, co1, kh, kw, co0, ci0):
            return filters[layout.fracz_row(c1, kh, kw, g.kh, g.kw), co1, co0, ci0].astype(dtype)

        dy_rows, col_blocks = g.batch, ext.cout1_g
    else:
        def pad_value(ny, c1, y, x, c0):
            n, plane = ny // fold.planes, ny % fold.planes
            conds = ([c1 < g.c1_y] if c1_dy > g.c1_y else []) + fold.conds(plane) + window.conds(y, x)
            return guarded(conds, dy[n, plane - fold.top, c1, y - top, x - left, c0].astype(dtype))

        def col_value(c1, kco, kh, kw, co0, ci0):  # FracZ_3D: the depth tap outermost in the rows
            kd, co1 = kco // ext.cout1_g, kco % ext.cout1_g
            return filters[layout.fracz_row(kd * g.c1_x + c1, kh, kw, g.kh, g.kw), co1, co0, ci0].astype(dtype)

        dy_rows, col_blocks = g.batch * fold.planes, g.kd * ext.cout1_g

    if pairs:  # the Cout lanes in pairs: 8 words per block
        dy_pad = te.compute((dy_rows, c1_dy, *window.shape, C0 // 2), lambda n, c1, y, x, q: pair(pad_value(n, c1, y, x, 2 * q), pad_value(n, c1, y, x, 2 * q + 1)),
                            name=DY_PAD, tag=DY_PAD)  # fmt: skip
        w_col = te.compute((g.c1_x, col_blocks, g.kh, g.kw, C0 // 2, C0),
                           lambda c1, co1, kh, kw, q, ci0: pair(col_value(c1, co1, kh, kw, 2 * q, ci0), col_value(c1, co1, kh, kw, 2 * q + 1, ci0)),
                           name=W_COL, tag=W_COL)  # fmt: skip
    else:  # fp32 dy that the taps read without padding is read in place, as the forward reads an unpadded x
        small_planes = planar and g.ho * g.wo * tvm.DataType(ACC).bits // 8 < PLANAR_IN_PLACE_BYTES
        in_place = DY_IN_PLACE and fold is None and dy.dtype == ACC and window.unpadded and c1_dy <= g.c1_y
        attrs = {WIDE_TILES_IN_PLACE: 1} if in_place else None  # (small planes: the schedule's tiles decide)
        packed = (dy_rows, c1_dy, *window.shape, C0)
        dy_pad = dy if in_place and not small_planes else te.compute(packed, pad_value, name=DY_PAD, tag=DY_PAD, attrs=attrs)
        w_col = te.compute((g.c1_x, col_blocks, g.kh, g.kw, C0, C0), col_value, name=W_COL, tag=W_COL)

    step = real_channel_run(g.cout, dy.dtype, pairs) if fold is None and g.groups == 1 else 0  # (2-D, one group)

    def phase_mad(ph: AxisPhase, pw: AxisPhase, pd: AxisPhase | None = None) -> te.Tensor:
        co1 = te.reduce_axis((0, g.cout // step if step else ext.cout1_g * (1 if pd is None else pd.taps)), name="co1")
        mh = te.reduce_axis((0, ph.taps), name="mh")
        mw = te.reduce_axis((0, pw.taps), name="mw")
        co0 = te.reduce_axis((0, step or (C0 // 2 if pairs else C0)), name="co0")  # pairs: the pair q

        def mad(n, c1, j, i, c0):
            e = c1 // ext.cin1_g
            lane = co0
            if step:  # the real Cout channels only: channel co1 * step + co0 (2-D, one group)
                channel = co1 * step + co0
                row, block, lane = n, channel // C0, channel % C0
                w_block = block
            elif pd is None:
                row, block, w_block = n, e * ext.cout1_g + co1, co1
            else:  # n: image x depth-phase plane; co1: depth tap x Cout block
                md, block_g = co1 // ext.cout1_g, co1 % ext.cout1_g
                image, plane = n // pd.count, n % pd.count
                row, block = fold.dy_row(image, pd.dy_index(plane, md, fold.top)), e * ext.cout1_g + block_g
                w_block = pd.tap(md) * ext.cout1_g + block_g
            dy_at = dy_pad[row, block, ph.dy_index(j, mh, top), pw.dy_index(i, mw, left), lane]
            w_at = w_col[c1, w_block, ph.tap(mh), pw.tap(mw), lane, c0]
            return te.sum(pair_dot(w_at, dy_at) if pairs else dy_at * w_at, axis=[co1, mh, mw, co0])

        batch = g.batch * (1 if pd is None else pd.count)
        kind = Formulation.CUBE_DX_BF16 if pairs else Formulation.CUBE_DX
        return te.compute((batch, g.c1_x, ph.count, pw.count, C0), mad, name=phase_stage_name(ph, pw, pd=pd), tag=MAD_TAG,
                          attrs={FORMULATION: kind.value, PHASE_AXES: [*g.strides, g.h, g.w]})  # fmt: skip

    if fold is None:
        phases = [(ph, pw, phase_mad(ph, pw)) for ph, pw in grid]
    else:
        phases = [(pd, ph, pw, phase_mad(ph, pw, pd)) for pd in fold.phases for ph, pw in grid]
    return phases, lambda mad, n, c1, j, i, c0: mad[n, c1, j, i, c0]


def _pixel_lane_phases(filters: te.Tensor, dy: te.Tensor, params: ConvGradParams, grid, window: DyWindow):
    """One ``dx_px`` mad per phase, 16 output columns on the lanes (see the module docstring)."""
    g = params.geom
    top, left = window.top, window.left

    def rows_value(n, co, y, x):
        return guarded(window.conds(y, x), dy[n, co // C0, y - top, x - left, co % C0].astype(ACC))

    in_place = DY_IN_PLACE and dy.dtype == ACC and window.unpadded  # (a channel-planar dy's planes are these rows)
    dy_rows = te.compute((g.batch, g.cout, *window.shape), rows_value, name=DY_ROWS, tag=DY_ROWS, attrs={READ_IN_PLACE: 1} if in_place else None)
    w_t = te.compute(
        (g.cout, g.cin, g.kh, g.kw),
        lambda co, ci, kh, kw: filters[layout.fracz_row(ci // C0, kh, kw, g.kh, g.kw), co // C0, co % C0, ci % C0].astype(ACC),
        name=W_T,
        tag=W_T,
    )

    def phase_mad(ph: AxisPhase, pw: AxisPhase) -> te.Tensor:
        co = te.reduce_axis((0, g.cout), name="co")
        mh = te.reduce_axis((0, ph.taps), name="mh")
        mw = te.reduce_axis((0, pw.taps), name="mw")
        return te.compute(
            (g.batch, g.cin, ph.count, pw.count),
            lambda n, ci, j, i: te.sum(
                dy_rows[n, co, ph.dy_index(j, mh, top), pw.dy_index(i, mw, left)] * w_t[co, ci, ph.tap(mh), pw.tap(mw)],
                axis=[co, mh, mw],
            ),
            name=phase_stage_name(ph, pw, DX_PX),
            tag=MAD_TAG,
            attrs={FORMULATION: Formulation.PIXEL_LANES.value},
        )

    phases = [(ph, pw, phase_mad(ph, pw)) for ph, pw in grid]

    def read(mad, n, c1, j, i, c0):  # branch-free, inside the mad (the index clamped, the lanes past Cin masked): vectorizes over c0
        channel = c1 * C0 + c0
        return masked(mad[n, tirx.min(channel, g.cin - 1), j, i], channel < g.cin) if g.c1_x * C0 > g.cin else mad[n, channel, j, i]

    return phases, read
