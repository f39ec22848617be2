"""TE compute of ``conv2d_backprop_filter`` (dW) on 5HD tensors.

The result is TBE's ``(real_g, cin1_g*KH*KW, cout_g, 16)``: row ``(c1, kh, kw)``, column ``co``,
lane ``ci0``. Two formulations compute it; both sum fp16 x fp16 products (exact in fp32) in fp32,
the cube's arithmetic, and both compute every entry of an extended group's blocks, the cross-slot
ones too (spec §2.5).

**Cube** (the general one): Cin on the 16 lanes.

=================  ==============================================  =========================================
stage              shape                                           value
=================  ==============================================  =========================================
``grads_2_matrix`` ``(N, real_g*cout_g/16, Ho, Wo, 16)`` fp32      dy, zero past its channel blocks
``fmap_l1``        ``(N, real_g*cin1_g, PH, PW, Hq, Wq, 16)``      x with its zero padding, stored by stride
                   fp32                                            phase: ``[.., rh, rw, hq, wq, ..] =
                                                                   xpad[hq*sh + rh, wq*sw + rw]``; only the
                                                                   phases the taps read (PH = 1 when every
                                                                   ``kh*dh`` is a multiple of ``sh``); marked
                                                                   ``convert_in_place`` when it only converts
                                                                   (no padding, one phase)
``dw_cc``          ``(real_g, cin1_g*KH*KW, cout_g, 16)`` fp32     the mad over ``(n, ho, wo)``
``dw_ddr``         same, ``res_dtype``                             the result (tag ``conv2d_backprop_filterdw_ddr``)
=================  ==============================================  =========================================

**Live-tap regions** (fp32, 2-D): where an axis's taps read x's zero padding in enough of their
(output, tap) pairs (:mod:`.filter_regions`: DeepLab's atrous layers, a 3x3 on a 1x1 map),
the taps are grouped by the outputs whose windows read real x (:func:`.phases.filter_tap_runs`),
and each group ``(row taps, column taps)`` is a mad ``dw_cc_<first kh>_<first kw>`` of its own
(rows ``(c1, kh', kw')`` over its taps) summing over those outputs only; ``dw_ddr`` picks each
row's tap from its group's mad, 0 for a tap that reads padding only. The products left out are
zeros, so the sums are the same; along a stride-1 axis ``fmap_l1`` then holds only the positions
the regions' windows read (x without its padding: ASPP rate 18, N=4, 31.2 -> 13.4 ms).

``dw_cc[g, (c1,kh,kw), co, c0] = sum_{n,ho,wo} grads_2_matrix[n, g*cout_g/16 + co//16, ho, wo, co%16]
* xpad[n, g*cin1_g + c1, ho*sh + kh*dh, wo*sw + kw*dw, c0]``, xpad read through ``fmap_l1`` so that
consecutive ``wo`` read consecutive memory whatever the stride.

**Transposed** (few input channels, one extended group, e.g. a network's first layer with
Cin = 3): Cout on the lanes, so that no lane multiplies a padding channel.

=================  ==============================================  =========================================
``fmap_l1``        ``(N, Cin, Hp, Wp)`` fp32                       x with its zero padding, NCHW
``grads_2_matrix`` ``(N, cout_g/16, Ho, Wo, 16)`` fp32             dy (0 past Cout), ``convert_in_place``
``dw_cc_t``        ``(Cin, KH, KW, cout_g)`` fp32                  ``sum_{n,ho,wo} fmap_l1[n, c, ho*sh +
                                                                   kh*dh, wo*sw + kw*dw] * dy[n, co, ho, wo]``
``dw_ddr``         TBE's shape, ``res_dtype``                      ``dw_cc_t`` transposed into TBE's layout
                                                                   (0 for the padding channels)
=================  ==============================================  =========================================

In 3-D its first axis is ``(kd, c)`` (``KD*Cin``), and its batch axes fold the depth as the cube's do.

**Depthwise** (``Cin/groups == 1``): channels on the lanes, see :mod:`.depthwise`.

**3-D** (``geom.depth``; x and dy NDC1HWC0 ``(N, D, C1, H, W, 16)``, TBE's conv3d layout): the cube
(or the transposed formulation) with the depth axis folded into the batch. ``grads_2_matrix`` is ``(N*Do, ..)`` (image ``n``,
plane ``do`` at ``n*Do + do``), ``fmap_l1`` ``(N*Dp, ..)`` over the zero-padded depth ``Dp``, the
mad sums over ``(n*Do + do, ho, wo)`` and reads fmap plane ``n*Dp + do*sd + kd*dd``; the result
has ``KD*cin1_g*KH*KW`` rows (FracZ_3D, depth tap outermost). Everything the 2-D schedules do
with the batch they do with ``N*Do`` (see :class:`_DepthFold`).

A stage marked ``convert_in_place`` only converts fp16 to fp32: a schedule for a target that
converts as it loads (F16C, NEON) inlines it, so the mad reads the fp16 input in place.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

from ... import layout
from ...layout import C0
from ...params import ConvGeometry, ConvGradParams
from .common import ACC, guarded, in_place, inside, planar_gemm
from .depthwise import depthwise, depthwise_filter_grad
from .dw_pairs import column_pairs, pair_packs
from .pairs import pair, pair_dot
from .filter_regions import from_tap_regions, read_span, tap_region_grid
from .phases import AxisPhase, whole_axis
from .stages import (DW_CC, DW_CC_T, DW_DDR, DW_TAG, FMAP_L1, FORMULATION, GRADS_2_MATRIX, KERNEL_H, KERNEL_W, MAD_TAG, READ_IN_PLACE, X_STEP, Formulation,
                     phase_name)

__all__ = ["conv2d_backprop_filter_compute", "planar_filter_lanes", "transposed_filter_grad"]

TRANSPOSED_MAX_CIN = 8  # at most half the lanes of a channel block would be real channels


ROWS_IN_PLACE = True
"""The fp32 cube dW reads x's and dy's 16-channel rows where they lie (NXC, 5HD) when its packs
would only copy them (:func:`_cube_mads`) and a step's rows lie at most :data:`ROWS_IN_PLACE_BYTES` apart."""
ROWS_IN_PLACE_BYTES = 768
"""Measured on Zen 4 (1x1 layers, N=8-32, both built in one process): rows 64-576 B apart read in
place 1.08-1.75x faster than packed (MobileNetV2's 144 -> 24 on 28x28: x's 576 B rows, 2.38 ->
2.03 ms; 64 -> 64 on 56x56 1.78 -> 1.22), 1 KB 0.94-0.96x (256 -> 64 on 56x56), 4 KB 0.93x
(1024 -> 256 on 14x14): the pack keeps a chunk's rows of a block contiguous."""


def transposed_filter_grad(params: ConvGradParams, planar: bool = False, dtype: str = ACC) -> bool:
    """Whether dW puts Cout on the lanes: one extended group holding at most 8 input channels, or
    (``planar``: the frontend's x and dy lie channel-planar, NCX) a planar 1x1 whose dy is the
    smaller operand (:func:`planar_filter_lanes`)."""
    ext = params.geom.group
    return ext.g_extend == 1 and (params.geom.cin <= TRANSPOSED_MAX_CIN or (planar and planar_filter_lanes(params, dtype)))


PLANAR_MAX_COUT = 128
"""A planar Cout-on-lanes dW has at most this many output channels: its tiles span them in one or two
columns (AVX-512), each reading every x plane; ResNet-50's 256 -> 64 on 56x56, N=8, Zen 4: 8.7 ->
7.1 ms, 512 -> 128 on 28x28 6.1 -> 5.3; 512 -> 256 on 28x28 12.0 -> 13.7, 2048 -> 512 on 7x7 4.9 ->
10.4 (x read once per column)."""


PLANAR_MIN_PIXELS = 256
"""... and maps of at least this many pixels: each image is a partial dW summed after, whose
``Cin x Cout`` sums a small map does not amortize (MobileNetV2's 576 -> 96 on 7x7, N=32: 2.5 ->
3.3 ms; its 192 -> 32 on 16x16, N=8: 0.63 -> 0.25)."""


def planar_filter_lanes(params: ConvGradParams, dtype: str = ACC) -> bool:
    """An fp32 1x1 at stride 1 without padding (2-D, one group) with more input than output
    channels (whole blocks of 16, at most :data:`PLANAR_MAX_COUT`) on a map of
    :data:`PLANAR_MIN_PIXELS` or more: ``dw[co, ci] = sum_{n, p} x[n,
    ci, p] * dy[n, co, p]`` with Cout on the lanes reads NCX x where it lies (a broadcast per input
    channel) and packs only dy, the smaller operand, where the cube packs (transposes) x."""
    g = params.geom
    return (planar_gemm(g, dtype) and g.groups == 1 and g.cout % C0 == 0 and C0 <= g.cout <= PLANAR_MAX_COUT and g.cout < g.cin
            and g.ho * g.wo >= PLANAR_MIN_PIXELS)  # fmt: skip


@dataclass(frozen=True)
class _DepthFold:
    """The batch axis of the dW reduction, with a 3-D convolution's depth folded into it.

    2-D: ``N`` images. 3-D: dy's ``(n, do)`` as ``n*Do + do`` and the zero-padded x's ``(n, dp)``
    as ``n*Dp + dp`` (``Dp`` planes, x plane ``dp - pad_before``), so that output plane ``do``
    and depth tap ``kd`` read packed plane ``n*Dp + do*sd + kd*dd``."""

    geom: ConvGeometry

    @property
    def dy_extent(self) -> int:
        d = self.geom.depth
        return self.geom.batch * (d.out if d else 1)

    @property
    def fmap_extent(self) -> int:
        d = self.geom.depth
        return self.geom.batch * (d.padded if d else 1)

    def dy_read(self, nd) -> tuple:
        """dy's leading indices ``(n,)`` / ``(n, do)`` of reduction position ``nd``."""
        d = self.geom.depth
        return (nd // d.out, nd % d.out) if d else (nd,)

    def fmap_read(self, npad) -> tuple[tuple, list]:
        """x's leading indices of packed plane ``npad`` and the conditions that it is not padding."""
        d = self.geom.depth
        if d is None:
            return (npad,), []
        dp = npad % d.padded
        return (npad // d.padded, dp - d.pad_before), inside((dp,), (d.pad_before,), (d.size,), (d.padded,))

    def fmap_plane(self, nd, kd):
        """Packed x plane read by reduction position ``nd`` at depth tap ``kd``."""
        d = self.geom.depth
        if d is None:
            return nd
        return nd // d.out * d.padded + nd % d.out * d.stride + kd * d.dilation


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
        if self.phases > 1:
            return -(-self.reach // self.stride)
        return self.out + (self.kernel - 1) * self.dilation // self.stride

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


def conv2d_backprop_filter_compute(fmap: te.Tensor, dy: te.Tensor, params: ConvGradParams, bf16_pairs: bool = False,
                                   cout_lanes: bool = False, amx: bool = False, planar: bool = False) -> te.Tensor:  # fmt: skip
    """dW of TBE's shape ``(real_g, cin1_g*KH*KW, cout_g, 16)`` from 5HD ``fmap`` and ``dy``.

    ``bf16_pairs`` (bf16 inputs): the packs hold bf16 pairs along ``wo`` and the mad sums
    :func:`.pairs.pair_dot` (``Formulation.CUBE_DW_BF16``, or ``COUT_LANES_BF16`` with Cout on
    the lanes), the form a ``vdpbf16ps`` target runs; the depthwise formulation has no such form
    and ignores it. ``cout_lanes`` (with ``bf16_pairs``, for a consumer that reads Cout innermost,
    e.g. XIO weights): the cube's register tile is turned, 16 Cin rows x 16 Cout lanes, so that
    each of its rows is 16 consecutive Cout of the result. ``amx`` (with ``bf16_pairs``, 2-D): the
    cube in the AMX tile plan's layout (``Formulation.CUBE_DW_AMX``, see :mod:`.dw_pairs`), a stem's 3
    channels padded to 16 too (7x7 stride 2, N=32 on 112x112: 10.4 -> 8.9 ms against Cout lanes); 3-D
    keeps the ``vdpbf16ps`` form. ``planar``: the frontend's x and dy lie channel-planar (NCX): a
    1x1 whose dy is the smaller operand runs with Cout on the lanes (:func:`planar_filter_lanes`)."""
    g = params.geom
    shape = layout.shape_dw_result(g.filter_sizes, g.groups, g.kd)
    if depthwise(params):
        _, value = depthwise_filter_grad(fmap, dy, params, rows_in_place=not planar)
    elif transposed_filter_grad(params, planar, dy.dtype) and not (bf16_pairs and amx and g.depth is None):  # (AMX: the tiles, Cin padded)
        dw = _transposed_mad(fmap, dy, params, bf16_pairs and dy.dtype == "bfloat16")
        value = lambda grp, fkk, co, ci0: _from_transposed(dw, fkk, co, ci0, params)  # noqa: E731
    else:
        pairs = bf16_pairs and dy.dtype == "bfloat16"
        tiles = pairs and amx and g.depth is None
        regions = None if pairs or g.depth is not None else tap_region_grid(g)
        if regions:
            value = from_tap_regions(regions, _cube_mads(fmap, dy, params, shape, regions=regions), g)
        else:
            (dw,) = _cube_mads(fmap, dy, params, shape, pairs, turned := pairs and cout_lanes and not tiles, tiles, rows_in_place=not planar)
            value = (lambda grp, fkk, co, ci0: dw[grp, fkk, co // C0 * C0 + ci0, co % C0]) if turned else (lambda *i: dw(*i))  # noqa: E731
    mode = "f162f32" if params.res_dtype == "float32" else "f162f16"
    return te.compute(
        shape,
        lambda *i: value(*i).astype(params.res_dtype),
        name=DW_DDR,
        tag=DW_TAG,
        attrs={"kernel_name": params.kernel_name, "mode": mode, "flops": params.flops},
    )


def _cube_mads(fmap: te.Tensor, dy: te.Tensor, params: ConvGradParams, shape, pairs: bool = False, turned: bool = False,
               amx: bool = False, regions: list | None = None, rows_in_place: bool = False) -> list[te.Tensor]:  # fmt: skip
    """The cube's mad ``dw_cc[g, (c1,kh,kw), co, ci0]``; ``turned``: ``[g, (c1,kh,kw), co1*16 + ci0,
    co0]`` (Cout on the lanes: the tile's vector operand is dy's row, x is broadcast).
    ``rows_in_place``: the inputs' 16-channel rows lie contiguous (NXC or 5HD, not NCX), so fp32
    packs that only copy them (whole blocks; for x a 1x1 window without padding) are read where
    they lie (:data:`ROWS_IN_PLACE`). With
    live-tap ``regions`` (fp32, 2-D, :func:`.filter_regions.tap_region_grid`): one mad per region ``(ph, pw)``,
    ``dw_cc_<kh0>_<kw0>[g, (c1, kh', kw'), co, ci0]`` over the taps ``(ph.tap0 + kh', pw.tap0 +
    kw')`` and the outputs ``ph.first .. + ph.count`` x ``pw.first .. + pw.count``, sharing the
    packs."""
    g = params.geom
    ext = g.group
    fold = _DepthFold(g)
    c1_grads = ext.g_extend * ext.cout1_g
    dtype = dy.dtype if pairs else ACC  # the packs' values: fp32, or the bf16 inputs as they are

    def grads_value(nd, c1, ho, wo, c0):
        conds = [c1 < g.c1_y] if c1_grads > g.c1_y else []
        return guarded(conds, dy[(*fold.dy_read(nd), c1, ho, wo, c0)].astype(dtype))

    (sh, sw), (dil_h, dil_w) = g.strides, g.dilations
    rows = _StridePhases(g.ho, g.kh, sh, dil_h)
    cols = _StridePhases(g.wo, g.kw, sw, dil_w)
    c1_fmap = ext.g_extend * ext.cin1_g

    # With live-tap regions along a stride-1 axis, the pack holds only the positions their windows read
    # (x's own rows and columns, not the padding: an ASPP layer at rate 6 on 14x14 would pack 26x26).
    (top, height), (left, width) = (read_span(regions, 0, rows.stride, rows.dilation, rows.per_phase) if regions else (0, rows.per_phase),
                                    read_span(regions, 1, cols.stride, cols.dilation, cols.per_phase) if regions else (0, cols.per_phase))  # fmt: skip

    def fmap_value(npad, c1, rh, rw, hq, wq, c0):
        i, j = rows.padded_index(rh, hq + top), cols.padded_index(rw, wq + left)  # in the zero-padded x
        lead, conds = fold.fmap_read(npad)
        conds += [c1 < g.c1_x] if c1_fmap > g.c1_x else []
        conds += inside((i, j), g.pads[::2], (g.h, g.w), (rows.packed_extent, cols.packed_extent))
        return guarded(conds, fmap[(*lead, c1, i - g.pads[0], j - g.pads[2], c0)].astype(dtype))

    if pairs:
        packs = pair_packs(grads_value, fmap_value, fold, c1_grads, c1_fmap, rows, cols, g, amx)
        ho = te.reduce_axis((0, g.ho), name="ho")
        formulation = Formulation.CUBE_DW_AMX if amx else Formulation.CUBE_DW_BF16

        def paired(grp, fkk, co, c0):
            if turned:  # row (co1, ci0), lane co0
                co, c0 = co // C0 * C0 + c0, co % C0
            c1, kh, kw = layout.split_fracz_row(fkk, g.kh, g.kw)
            kd, c1 = (c1 // ext.cin1_g, c1 % ext.cin1_g) if g.depth else (0, c1)
            (rh, qh), (rw, qw) = rows.of_tap(kh), cols.of_tap(kw)
            n, wo = packs.n, packs.wo  # n or wo is the pair (see .dw_pairs)
            dy_at = packs.dy_at(n, grp * ext.cout1_g + co // C0, ho, wo, co % C0)
            x_at = packs.x_at(fold.fmap_plane(n, kd), grp * ext.cin1_g + c1, rh, rw, ho + qh, packs.x_column(wo, qw), c0)
            return te.sum(pair_dot(*((dy_at, x_at) if turned else (x_at, dy_at))), axis=packs.axes(ho))  # lanes' operand first

        attrs = {FORMULATION: formulation.value, KERNEL_H: g.kh, KERNEL_W: g.kw, X_STEP: packs.x_step}
        return [te.compute(shape, paired, name=DW_CC, tag=MAD_TAG, attrs=attrs)]

    # dy's pack only copies whole fp32 rows where no block is padding: read where it lies.
    rows_in_place = ROWS_IN_PLACE and rows_in_place
    dy_rows = rows_in_place and dy.dtype == ACC and c1_grads == g.c1_y and g.cout % C0 == 0 and g.cout * 4 <= ROWS_IN_PLACE_BYTES
    grads = te.compute((fold.dy_extent, c1_grads, g.ho, g.wo, C0), grads_value, name=GRADS_2_MATRIX, tag=GRADS_2_MATRIX,
                       attrs={READ_IN_PLACE: 1} if dy_rows else None)  # fmt: skip
    # With no padding and one phase, fmap_l1 is a plain fp32 copy of (a stride-subsample of) x: a
    # target that converts fp16 as it loads reads x in place instead (the schedule inlines it), and
    # so does every target where x is fp32 rows of whole blocks.
    direct = rows.phases == cols.phases == 1 and not any(g.pads) and c1_fmap == g.c1_x and g.depth is None
    x_rows = rows_in_place and direct and fmap.dtype == ACC and g.cin % C0 == 0 and g.cin * 4 * sw <= ROWS_IN_PLACE_BYTES
    packed = (fold.fmap_extent, c1_fmap, rows.phases, cols.phases, height, width, C0)
    fmap_l1 = te.compute(packed, fmap_value, name=FMAP_L1, tag=FMAP_L1, attrs={READ_IN_PLACE: 1} if x_rows else in_place(fmap, direct))

    def region_mad(ph: AxisPhase, pw: AxisPhase, name: str) -> te.Tensor:
        """The sums of taps ``(ph.tap0 + kh', pw.tap0 + kw')`` over outputs ``ph x pw``."""
        n = te.reduce_axis((0, fold.dy_extent), name="n")
        ho = te.reduce_axis((0, ph.count), name="ho")
        wo = te.reduce_axis((0, pw.count), name="wo")

        def mad(grp, fkk, co, c0):
            c1, kh, kw = layout.split_fracz_row(fkk, ph.taps, pw.taps)
            kd, c1 = (c1 // ext.cin1_g, c1 % ext.cin1_g) if g.depth else (0, c1)
            (rh, qh), (rw, qw) = rows.of_tap(ph.tap0 + kh), cols.of_tap(pw.tap0 + kw)
            y, x = ph.first + ho, pw.first + wo
            dy_at = grads[n, grp * ext.cout1_g + co // C0, y, x, co % C0]
            x_at = fmap_l1[fold.fmap_plane(n, kd), grp * ext.cin1_g + c1, rh, rw, y + qh - top, x + qw - left, c0]
            return te.sum(dy_at * x_at, axis=[n, ho, wo])

        region_shape = (shape[0], shape[1] // (g.kh * g.kw) * ph.taps * pw.taps, *shape[2:])
        attrs = {FORMULATION: Formulation.CUBE_DW.value, KERNEL_H: ph.taps, KERNEL_W: pw.taps}
        return te.compute(region_shape, mad, name=name, tag=MAD_TAG, attrs=attrs)

    if regions is None:
        return [region_mad(whole_axis(g.ho, g.kh), whole_axis(g.wo, g.kw), DW_CC)]
    return [region_mad(ph, pw, phase_name(DW_CC, ph.tap0, pw.tap0)) for ph, pw in regions]


def _transposed_mad(fmap: te.Tensor, dy: te.Tensor, params: ConvGradParams, pairs: bool = False) -> te.Tensor:
    g = params.geom
    fold = _DepthFold(g)
    (sh, sw), (dil_h, dil_w) = g.strides, g.dilations
    reach = ((g.ho - 1) * sh + g.kh_dilated, (g.wo - 1) * sw + g.kw_dilated)
    dtype = dy.dtype if pairs else ACC

    def fmap_value(npad, c, i, j):
        lead, conds = fold.fmap_read(npad)
        conds += inside((i, j), g.pads[::2], (g.h, g.w), (reach[0], reach[1] + sw if pairs else reach[1]))  # (a pair's odd half reads on)
        return guarded(conds, fmap[(*lead, c // C0, i - g.pads[0], j - g.pads[2], c % C0)].astype(dtype))

    cout = g.group.cout_g_padded

    def grads_value(nd, c1, ho, wo, c0):
        return guarded([c1 * C0 + c0 < g.cout] if cout > g.cout else [], dy[(*fold.dy_read(nd), c1, ho, wo, c0)].astype(dtype))

    n = te.reduce_axis((0, fold.dy_extent), name="n")
    ho = te.reduce_axis((0, g.ho), name="ho")
    if pairs:  # wo is the pair p: dy's columns (2p, 2p+1) on the lanes, x's (j, j + sw) broadcast
        pairs_out = -(-g.wo // 2)
        fmap_l1 = te.compute(
            (fold.fmap_extent, g.cin, reach[0], (2 * pairs_out - 2) * sw + g.kw_dilated),
            lambda npad, c, i, j: pair(fmap_value(npad, c, i, j), fmap_value(npad, c, i, j + sw)),
            name=FMAP_L1,
            tag=FMAP_L1,
        )
        grads = te.compute((fold.dy_extent, cout // C0, g.ho, pairs_out, C0), column_pairs(grads_value, g.wo), name=GRADS_2_MATRIX, tag=GRADS_2_MATRIX)
        wo = te.reduce_axis((0, pairs_out), name="wo")
        formulation = Formulation.COUT_LANES_BF16
    else:  # (x itself where there is nothing to pad or convert: its planes, read where they lie)
        unpadded = fmap.dtype == ACC and g.depth is None and not any(g.pads) and reach == (g.h, g.w)
        fmap_l1 = te.compute((fold.fmap_extent, g.cin, *reach), fmap_value, name=FMAP_L1, tag=FMAP_L1, attrs={READ_IN_PLACE: 1} if unpadded else None)
        grads = te.compute((fold.dy_extent, cout // C0, g.ho, g.wo, C0), grads_value, name=GRADS_2_MATRIX, tag=GRADS_2_MATRIX, attrs=in_place(dy))
        wo = te.reduce_axis((0, g.wo), name="wo")
        formulation = Formulation.COUT_LANES

    def mad(kc, kh, kw, co):  # kc: the channel, or (kd, channel) in 3-D
        kd, c = (kc // g.cin, kc % g.cin) if g.depth else (0, kc)
        dy_at = grads[n, co // C0, ho, wo, co % C0]
        if pairs:
            return te.sum(pair_dot(dy_at, fmap_l1[fold.fmap_plane(n, kd), c, ho * sh + kh * dil_h, 2 * wo * sw + kw * dil_w]), axis=[n, ho, wo])
        return te.sum(fmap_l1[fold.fmap_plane(n, kd), c, ho * sh + kh * dil_h, wo * sw + kw * dil_w] * dy_at, axis=[n, ho, wo])

    return te.compute((g.kd * g.cin, g.kh, g.kw, cout), mad, name=DW_CC_T, tag=MAD_TAG, attrs={FORMULATION: formulation.value})


def _from_transposed(dw_t: te.Tensor, fkk, co, ci0, params: ConvGradParams):
    """TBE's ``dw[0, (c1,kh,kw), co, ci0]`` from ``dw_cc_t[c, kh, kw, co]`` (0 past Cin); in 3-D
    row ``(kd*cin1_g + c1, kh, kw)`` from ``dw_cc_t[kd*Cin + c, kh, kw, co]``."""
    g = params.geom
    c1, kh, kw = layout.split_fracz_row(fkk, g.kh, g.kw)
    kd, c1 = (c1 // g.group.cin1_g, c1 % g.group.cin1_g) if g.depth else (0, c1)
    c = c1 * C0 + ci0
    return te.if_then_else(c < g.cin, dw_t[kd * g.cin + c if g.depth else c, kh, kw, co], tirx.const(0.0, ACC))
