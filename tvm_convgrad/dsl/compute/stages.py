"""Every stage of the gradient computes, named once: the contract between the computes and the
schedule rules (TBE's habit: one stage per data movement, found by name by its schedule).

=====================  ==========================================================================
stage                  what it holds
=====================  ==========================================================================
``grads_2_matrix``     dW: dy as the cube's reduction reads it (fp32, 0 past its channels)
``fmap_l1``            dW: x with its zero padding (stored by stride phase; NCHW planes for Cout
                       on the lanes)
``dw_cc``              dW mad, the cube (Cin on the lanes)
``dw_cc_t``            dW mad with Cout on the lanes (few input channels)
``grads_dw``           depthwise dW: dy with 16 channels on the lanes
``fmap_dw``            depthwise dW: x with its padding, 16 channels on the lanes
``dw_dw``              depthwise dW mad
``dw_ddr``             the dW result (TBE's ``(real_g, cin1_g*KH*KW, cout_g, 16)``, ``res_dtype``)
``dy_pad``             dX: dy zero-padded for the stride phases (fp32)
``w_col``              dX: the weights rotated 180 degrees, 16x16 blocks transposed
``dy_rows``            dX with output columns on the lanes: dy as channel planes
``w_t``                dX with output columns on the lanes: the weights per channel
``dy_dw`` / ``w_dw``   depthwise dX: dy and the weights, 16 channels on the lanes
``dx_cc_<rh>_<rw>``    dX mad of one stride phase, the cube
                       (the cube's packs hold bf16 pairs instead of fp32 on a ``vdpbf16ps``
                       target: :mod:`.pairs`)
``dx_px_<rh>_<rw>``    dX mad of one stride phase, output columns on the lanes
``dx_dw_<rh>_<rw>``    dX mad of one stride phase, depthwise
``c_ddr``              the dX result (5HD memory ``(N, C1, H*W, 16)``, ``res_dtype``, + bias)
``fmap_pad``           forward: x zero-padded (fp32)
``w_conv``             forward: the FracZ weight, rows of 16 output channels per input lane
``conv_cc``            forward mad, the cube (output channels on the lanes)
``C``                  the forward result (``(N, C1, Ho*Wo, 16)``, ``res_dtype``, + bias)
``wino_v``             Winograd F(2x2, 3x3) (forward or stride-1 dX): the input's tiles transformed
``wino_u``             Winograd: the weights transformed
``wino_m``             Winograd mad: 16 GEMMs over Cin, one per transform position
``wino_y``             Winograd result: each 2x2 output tile (+ bias), ``res_dtype``
``wino_d``             Winograd dW: dy's 2x2 tiles transformed
``wino_dw``            Winograd dW mad: 16 GEMMs over the tiles
``wino_w``             Winograd dW result: the 3x3 weight gradient of the transformed sums
=====================  ==========================================================================

A framework operator (:mod:`tvm_convgrad.frontends`) adds layout stages around the dW compute:
``fmap`` / ``dy`` (its tensors seen as 5HD, tag ``layout_in``) and its result in the framework's
weight layout (``diff_weights``; DeconvGradFilter's ``dw``; tag ``layout_out``); around the dX
compute ``dy``, ``weights_fracz`` and ``diff_src``; around the forward ``src``, ``weights_fracz``
and ``dst``.

Each mad carries the :data:`FORMULATION` attribute naming its kind (:class:`Formulation`): the
schedule rules choose the class that schedules it by that kind, never by the stage's name.
"""

from __future__ import annotations

from enum import Enum
from typing import Iterable

__all__ = [
    "AMX_STEPS", "ARGUMENT_STAGES", "C_DDR", "CONVERT_IN_PLACE", "CONV_PX", "CONV_DW", "CONV_DW_PX", "READ_IN_PLACE", "X_ROWS", "X_PLANE", "W_PLANE", "DIFF_SRC", "DIFF_WEIGHTS", "DST", "SRC_5HD", "DSP_DW", "DW_CC", "DW_CC_T", "DW_DDR", "DW_DW", "DX_CC", "DX_DW", "DX_PHASE_PREFIXES",
    "DX_PX", "DX_AMX", "DY_5HD", "DY_AMX", "W_AMX", "DY_DW", "DY_PACKS", "DY_PAD", "DY_ROWS", "DW_TAG", "DX_TAG", "FMAP_5HD", "FMAP_DW", "FMAP_L1", "FORMULATION", "Formulation",
    "GRADS_2_MATRIX", "GRADS_DW", "KERNEL_H", "KERNEL_W", "PAD_CUTS_H", "PAD_CUTS_W", "LAYOUT_ADAPTER", "LAYOUT_IN_TAG", "LAYOUT_OUT_TAG", "MAD_TAG", "PACK_STAGES", "WEIGHTS_FRACZ", "W_COL", "W_DW", "WIDE_TILES_IN_PLACE", "W_T", "WINO_D", "WINO_DP", "WINO_DW", "WINO_DYW", "WINO_M", "WINO_U", "WINO_UP", "WINO_V", "WINO_VP", "WINO_W", "WINO_WT", "WINO_X", "WINO_Y",
    "X_STEP", "formulation", "phase_firsts", "phase_name", "PHASE_AXES", "FMAP_PAD", "W_CONV", "CONV_CC", "CONV_RES", "CONV_TAG",
]  # fmt: skip

# dW
GRADS_2_MATRIX = "grads_2_matrix"
FMAP_L1 = "fmap_l1"
DW_CC = "dw_cc"
DW_CC_T = "dw_cc_t"
GRADS_DW = "grads_dw"
FMAP_DW = "fmap_dw"
DW_DW = "dw_dw"
DW_DDR = "dw_ddr"
# dX (each mad is one per stride phase: :func:`phase_name`)
DY_PAD = "dy_pad"
W_COL = "w_col"
DY_ROWS = "dy_rows"
W_T = "w_t"
DY_DW = "dy_dw"
W_DW = "w_dw"
DX_CC = "dx_cc"
DX_PX = "dx_px"
DX_DW = "dx_dw"
DY_AMX = "dy_amx"  # the AMX tile plan's (:mod:`.dx_amx`)
W_AMX = "w_amx"
DX_AMX = "dx_amx"
C_DDR = "c_ddr"
# the forward convolution
FMAP_PAD = "fmap_pad"
W_CONV = "w_conv"
CONV_CC = "conv_cc"
X_ROWS = "x_rows"
CONV_PX = "conv_px"
X_PLANE = "x_plane"  # the planar depthwise forward's (:mod:`.depthwise_planar`)
W_PLANE = "w_plane"
CONV_DW_PX = "conv_dw_px"
CONV_DW = "conv_dw"  # the depthwise forward with the channels on the lanes (:func:`.depthwise.depthwise_forward`)
CONV_RES = "C"
# a 3x3 stride-1 convolution by Winograd's F(2x2, 3x3) (the forward or dX: :mod:`.winograd`)
WINO_V = "wino_v"
WINO_U = "wino_u"
WINO_VP = "wino_vp"
WINO_UP = "wino_up"
WINO_M = "wino_m"
WINO_Y = "wino_y"
WINO_D = "wino_d"
WINO_DP = "wino_dp"
WINO_DW = "wino_dw"
WINO_DYW = "wino_dyw"
WINO_W = "wino_w"
WINO_WT = "wino_wt"
WINO_X = "wino_x"
# a framework operator's layout stages
FMAP_5HD = "fmap"
DY_5HD = "dy"
DIFF_WEIGHTS = "diff_weights"
DSP_DW = "dw"
WEIGHTS_FRACZ = "weights_fracz"
DIFF_SRC = "diff_src"
SRC_5HD = "src"
DST = "dst"
LAYOUT_IN_TAG, LAYOUT_OUT_TAG = "layout_in", "layout_out"

DW_TAG = "conv2d_backprop_filterdw_ddr"
"""TBE's tag of the dW result stage."""
DX_TAG = "conv2d_backprop_input"
"""TBE's tag of the dX result stage."""
CONV_TAG = "convolution_C"
"""TBE's tag of the forward result stage."""
MAD_TAG = "mad"

DX_PHASE_PREFIXES = (DX_CC, DX_PX, DX_DW)
PACK_STAGES = (GRADS_2_MATRIX, FMAP_L1, DY_PAD, W_COL, DY_ROWS, W_T, GRADS_DW, FMAP_DW, DY_DW, W_DW, FMAP_PAD, W_CONV, X_ROWS, X_PLANE, W_PLANE, DY_AMX, W_AMX)
"""The stages that cast (and pad) the inputs to fp32: elementwise, read by the mads."""
DY_PACKS = (DY_PAD, DY_ROWS, DY_DW)
"""dX's packs of dy (every stride phase reads one)."""

ARGUMENT_STAGES = {
    DW_TAG: ((FMAP_L1, FMAP_DW, DW_CC), (GRADS_2_MATRIX, GRADS_DW, DW_CC_T, DW_DW)),
    DX_TAG: ((W_COL, W_T, W_DW, W_AMX), (DY_PAD, DY_ROWS, DY_DW, DY_AMX), (C_DDR,)),  # filters, dy, bias
    CONV_TAG: ((FMAP_PAD, CONV_CC, X_ROWS, X_PLANE), (W_CONV, W_T, W_PLANE), (CONV_RES,)),  # data (read by the mad where it needs no pad), weight, bias
}
"""Result tag -> per input in TBE argument order, the stages (of any formulation) that read it."""

# Stage attributes
FORMULATION = "convgrad.formulation"
"""Attribute of every mad: its :class:`Formulation`."""
PHASE_AXES = "convgrad.phase_axes"
"""Attribute of a cube dX phase's or live-tap region's mad (a forward's too):
``[stride_h, stride_w, H, W]``, its output ``j`` along an axis is ``first + j*stride`` of the
result's ``H x W`` pixels."""
KERNEL_H, KERNEL_W = "kernel_h", "kernel_w"
"""Attributes of the dW cube's mad: the kernel's extents (its ``(c1, kh, kw)`` row axis is fused)."""
AMX_STEPS = "amx_steps"
"""Attribute of an AMX dX phase's mad: ``[dy_h, dy_w, tap_h, tap_w, grouped]``, the flat dy positions
and the turned weight taps between consecutive taps of its rows and columns (:mod:`.dx_amx`), and
whether its channel blocks belong to more than one group."""
PAD_CUTS_H, PAD_CUTS_W = "pad_cuts_h", "pad_cuts_w"
"""Attributes of the planar depthwise forward's ``x_plane``: the lengths of the parts of its rows
(columns) axis before the last where padding starts or ends (:func:`.depthwise_planar.padding_cuts`)."""
X_STEP = "x_step"
"""Attribute of a bf16-pair dW cube mad: the packed x columns between consecutive pair steps (:mod:`.dw_pairs`)."""
CONVERT_IN_PLACE = "convert_in_place"
"""Attribute of a stage that only converts its input to fp32 (no padding, no reordering that a
load could not do), so a schedule may inline it where the target converts fp16 as it loads."""
READ_IN_PLACE = "read_in_place"
"""Attribute of a pack whose every value is one fp32 input element (no padding, no conversion):
the planar pixel-lane dX's ``dy_rows`` of a dy it reads without padding, the forward's ``x_rows``. The CPU schedule
inlines it (its mad reads the input where it lies); a CUDA schedule keeps it a pack."""
WIDE_TILES_IN_PLACE = "wide_tiles_in_place"
"""Attribute of a pack whose every value is one fp32 input element but whose input's planes are small:
a cube dX's ``dy_pad`` of an NCX dy under ``PLANAR_IN_PLACE_BYTES`` a plane. A CPU schedule whose
channel block is one vector register (AVX-512: tiles of up to 14 pixels x 2 blocks, most of a
small plane's line each) inlines it; with narrower vectors (AVX2: 6-pixel tiles, each walking
every plane again for a few words) and on CUDA it stays a pack."""
LAYOUT_ADAPTER = "layout_adapter"
"""Attribute of a frontend's layout stage: ``"in"`` (a framework-layout input seen as 5HD, inlined
into the compute's packing stage) or ``"out"`` (the compute's result written in the framework's
weight layout; the result stage before it is inlined into it)."""


class Formulation(str, Enum):
    """The kind of a mad, and so which schedule takes it (see each compute's docstring)."""

    CUBE_DW = "cube-dw"  # dW: 16x16 blocks, Cin on the lanes
    CUBE_DX = "cube-dx"  # dX: one 16x16-block mad per stride phase
    CUBE_DW_BF16 = "cube-bf16-dw"  # dW on the cube, bf16 pairs along wo (a vdpbf16ps target's)
    CUBE_DX_BF16 = "cube-bf16-dx"  # dX on the cube, bf16 pairs along Cout (a vdpbf16ps target's)
    CUBE_DW_AMX = "cube-amx-dw"  # dW on the cube, bf16 pairs in AMX tiles (an AMX-BF16 target's)
    CUBE_DX_AMX = "cube-amx-dx"  # dX on flat pixel rows, bf16 pairs in AMX tiles (an AMX-BF16 target's)
    COUT_LANES = "cout-lanes"  # dW, few input channels: Cout on the lanes
    COUT_LANES_BF16 = "cout-lanes-bf16"  # dW, few input channels, bf16 pairs along wo (a vdpbf16ps target's)
    PIXEL_LANES = "pixel-lanes"  # dX, few input channels: output columns on the lanes
    DEPTHWISE_DW = "depthwise-dw"  # dW, one input channel per group: channels on the lanes
    DEPTHWISE_DX = "depthwise-dx"  # dX, one input channel per group: one mad per stride phase
    CUBE_FWD = "cube-fwd"  # the forward convolution: pixel tiles x 16 output channels, as a dX phase
    DEPTHWISE_FWD = "depthwise-fwd"  # the forward, one channel per group, NCX: each plane's columns on the lanes
    DEPTHWISE_CHANNELS_FWD = "depthwise-channels-fwd"  # the forward, one channel per group: channels on the lanes
    CUBE_FWD_BF16 = "cube-bf16-fwd"  # the forward on the cube, bf16 pairs along Cin (a vdpbf16ps target's)
    WINOGRAD = "winograd"  # a 3x3 stride-1 forward or dX by F(2x2, 3x3): 16 GEMMs over Cin, Cout on the lanes
    WINOGRAD_DW = "winograd-dw"  # its dW: 16 GEMMs over the 2x2 tiles of dy, Cout on the lanes
    WINOGRAD_BF16 = "winograd-bf16"  # F(2x2, 3x3)'s GEMMs on bf16 pairs of Cin (a vdpbf16ps target's bf16 forward or dX)
    WINOGRAD_DW_BF16 = "winograd-bf16-dw"  # its dW's GEMMs on bf16 pairs of tiles (a vdpbf16ps target's bf16 dW)

    @property
    def family(self) -> str:
        """``cube``, ``cube-bf16``, ``cout-lanes``, ``pixel-lanes`` or ``depthwise``: what ``Kernel.formulation`` says."""
        family = self.value.removesuffix("-dw").removesuffix("-dx").removesuffix("-fwd")
        return "depthwise" if family.startswith("depthwise") else family


def phase_name(prefix: str, rh: int, rw: int, rd: int | None = None) -> str:
    """The stage name of a dX mad of stride phase ``(rh, rw)``: ``<prefix>_<rh>_<rw>``; of a
    3-D dX's phase ``(rd, rh, rw)``: ``<prefix>_<rd>_<rh>_<rw>``."""
    return f"{prefix}_{rh}_{rw}" if rd is None else f"{prefix}_{rd}_{rh}_{rw}"


def phase_firsts(name: str) -> tuple[int, ...]:
    """The first output positions ``(rh, rw)`` (3-D ``(rd, rh, rw)``) of a phase's mad named by
    :func:`phase_name`: a stride phase's residues, or a live-tap region's first row and column."""
    return tuple(int(part) for part in name.split("_")[2:])


NO_MAD = "zero"
"""The family of a gradient without a mad: a dX no tap reaches (every window lies in the padding),
identically 0."""


def formulation(attrs: Iterable) -> str:
    """The family of the gradient whose stages have attribute maps ``attrs`` (:data:`NO_MAD`
    without a mad)."""
    for stage_attrs in attrs:
        if stage_attrs is not None and FORMULATION in stage_attrs:
            return Formulation(str(stage_attrs[FORMULATION])).family
    return NO_MAD
