"""LLVM (CPU) schedule rule: 16-lane fp32 rows held in vector registers, fed by broadcast FMAs.

Both gradients are GEMMs whose N axis is a block of 16 lanes (a C0 row); every mad runs as
register tiles of accumulator rows, each reduction step one row load and one broadcast FMA per
accumulator row. How many rows a tile holds comes from the target's vector ISA (:class:`CpuConfig`
from :func:`tvm_convgrad.isa.isa_plan`): a C0 row is one zmm on AVX-512 (tiles of 16 rows, FMAs
with a ``{1to16}`` broadcast operand), two ymm on AVX2 (tiles of 4-6 rows, 8-12 accumulators of
the 16 registers), four 128-bit registers on SSE / NEON. The cube structure (C0 blocks, stride
phases, chunks) is the same on every ISA; only the tiles change.

Each mad is scheduled by the class of its kind (:data:`FORMULATIONS`):

=====================  =============================  ===========================================
formulation            mad                            class
=====================  =============================  ===========================================
cube dW                ``dw_cc``                      :class:`.cube_dw.CubeFilterGrad`
cube dX                ``dx_cc_<rh>_<rw>``            :class:`.cube.CubeInputGrad`
cube dW, bf16 pairs    ``dw_cc``                      :class:`.bf16.PairedFilterGrad` (``vdpbf16ps``)
cube dX, bf16 pairs    ``dx_cc_<rh>_<rw>``            :class:`.bf16.PairedInputGrad` (``vdpbf16ps``)
cube dW, AMX tiles     ``dw_cc``                      :class:`.amx.AmxFilterGrad` (``tdpbf16ps``)
cube dX, AMX tiles     ``dx_amx_<rh>_<rw>``           :class:`.amx_dx.AmxInputGrad` (``tdpbf16ps``)
Cout on the lanes      ``dw_cc_t``                    :class:`.lanes.CoutLanesFilterGrad`
Cout on the lanes,     ``dw_cc_t``                    :class:`.bf16.PairedCoutLanesFilterGrad` (``vdpbf16ps``)
bf16 pairs
pixels on the lanes    ``dx_px_<rh>_<rw>``            :class:`.lanes.PixelLanesInputGrad`
depthwise dW / dX      ``dw_dw`` / ``dx_dw_<..>``     :class:`.depthwise.DepthwiseFilterGrad` /
                                                      :class:`.depthwise.DepthwiseInputGrad`
cube forward           ``conv_cc``                    :class:`.cube.CubeForward` (a dX phase's tiles)
Winograd F(2x2, 3x3)   ``wino_m``                     :class:`.winograd.WinogradConv` (forward, dX)
Winograd dW            ``wino_dw``                    :class:`.winograd.WinogradFilterGrad`
Winograd, bf16 pairs   ``wino_m``                     :class:`.bf16.PairedWinogradConv` (``vdpbf16ps``)
Winograd dW, bf16      ``wino_dw``                    :class:`.bf16.PairedWinogradFilterGrad` (``vdpbf16ps``)
=====================  =============================  ===========================================

The fp16 -> fp32 conversion happens once: in the packing stages (``fmap_l1``, ``grads_2_matrix``,
``dy_pad``, ``w_col``, ``dy_rows``, ``w_t``; parallel, vectorized or walked in source order), or
as vector operands load (``vcvtph2ps``) where a pack would only have converted. With
``tunable=True`` the sizes become MetaSchedule samples (``sample_perfect_tile``, the default a
divisor among them): the dW cube's Cout rows per tile and its reduction chunk (images x row
bands), the dX cube's pixel tiles and channel-block groups, the transposed dW's taps x Cout
vectors, the pixel-lane dX's rows, the depthwise tiles' lanes, pixels and unrolled columns.

A strided depthwise dX runs plane by plane: every phase and the dy pack under a task of the
result's image x 16 channels (:func:`.depthwise.phases_plane_by_plane`). Another strided dX of a
batch whose dy outgrows the cache runs image by image: every phase (and the dy pack) under the
result's batch loop (:func:`.loops.phases_image_by_image`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.target import Target

from ...dsl.compute.stages import CONVERT_IN_PLACE, DY_ROWS, FMAP_L1, READ_IN_PLACE, WIDE_TILES_IN_PLACE, Formulation
from ...isa import IsaPlan, isa_plan
from ..base import Config, Rule, mads
from ..common import inline_layout_stages, stage_blocks, target_cores
from .amx import AmxFilterGrad
from .amx_dx import AmxInputGrad
from .bf16 import PairedCoutLanesFilterGrad, PairedFilterGrad, PairedForward, PairedInputGrad, PairedWinogradConv, PairedWinogradFilterGrad
from .cube import CubeForward, CubeInputGrad
from .cube_dw import CubeFilterGrad
from .depthwise import DepthwiseFilterGrad, DepthwiseForward, DepthwiseInputGrad, phases_plane_by_plane
from .depthwise_planar import PlanarDepthwiseForward
from .lanes import CoutLanesFilterGrad, PixelLanesInputGrad
from .elementwise import elementwise, planar_pack, region_sums_result
from .loops import PHASES_PER_IMAGE, CpuMad, phases_image_by_image
from .regions import regions_one_by_one
from .winograd import WinogradConv, WinogradFilterGrad

__all__ = ["FORMULATIONS", "CpuConfig", "CpuRule"]

FORMULATIONS: dict[Formulation, type[CpuMad]] = {
    Formulation.CUBE_DW: CubeFilterGrad,
    Formulation.CUBE_DX: CubeInputGrad,
    Formulation.CUBE_DW_BF16: PairedFilterGrad,
    Formulation.CUBE_DX_BF16: PairedInputGrad,
    Formulation.CUBE_DW_AMX: AmxFilterGrad,
    Formulation.CUBE_DX_AMX: AmxInputGrad,
    Formulation.COUT_LANES: CoutLanesFilterGrad,
    Formulation.COUT_LANES_BF16: PairedCoutLanesFilterGrad,
    Formulation.PIXEL_LANES: PixelLanesInputGrad,
    Formulation.DEPTHWISE_DW: DepthwiseFilterGrad,
    Formulation.DEPTHWISE_DX: DepthwiseInputGrad,
    Formulation.CUBE_FWD: CubeForward,
    Formulation.DEPTHWISE_FWD: PlanarDepthwiseForward,
    Formulation.DEPTHWISE_CHANNELS_FWD: DepthwiseForward,
    Formulation.CUBE_FWD_BF16: PairedForward,
    Formulation.WINOGRAD: WinogradConv,
    Formulation.WINOGRAD_DW: WinogradFilterGrad,
    Formulation.WINOGRAD_BF16: PairedWinogradConv,
    Formulation.WINOGRAD_DW_BF16: PairedWinogradFilterGrad,
}
"""The class that schedules each kind of mad."""


@dataclass(frozen=True)
class CpuConfig(Config):
    """The CPU rule's choices for a target: the vector-ISA plan its register tiles are sized for,
    and the threads its kernels run on."""

    plan: IsaPlan
    cores: int


class CpuRule(Rule):
    """Schedule rule for ``llvm`` targets (usable in ``dlight.ApplyDefaultSchedule``)."""

    kind = "llvm"

    def get_config(self, target: Target, func: tirx.PrimFunc | None = None) -> CpuConfig:
        """The target's ISA plan (from its ``mtriple`` / ``mcpu`` / ``mattr``) and cores."""
        return CpuConfig(isa_plan(target), target_cores(target))

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False, config: CpuConfig | None = None) -> s_tir.Schedule:
        config = config or self.get_config(target)
        inline_layout_stages(sch)
        wide = config.plan.registers_per_row == 1  # (a channel block one register: tiles wide enough to read small planes)
        for block in stage_blocks(sch):  # the mads read those inputs in place (converting as they load, where the target does)
            annotations = sch.get(block).annotations
            if (READ_IN_PLACE in annotations or (wide and WIDE_TILES_IN_PLACE in annotations)
                    or (config.plan.converts_fp16 and CONVERT_IN_PLACE in annotations)):
                sch.compute_inline(block)
        placed: set[str] = set()
        if not tunable:
            placed = phases_plane_by_plane(sch, config.cores) | regions_one_by_one(sch, config.cores, config.plan)
        per_image = phases_image_by_image(sch) if PHASES_PER_IMAGE and not placed else set()
        found = mads(sch)
        on_mads = {sch.get(mad).name_hint for mad, _ in found}
        others = [sch.get(b).name_hint for b in stage_blocks(sch) if sch.get(b).name_hint not in on_mads]  # before rfactor adds any
        for mad, kind in found:
            FORMULATIONS[kind](sch, config, tunable, placed).schedule(mad)
        for name in others:  # the packs and results the mads did not place in their loops
            if name in placed:
                continue
            block = sch.get_sblock(name)
            shared = int(name in per_image)
            if name == DY_ROWS or (name == FMAP_L1 and len(sch.get_loops(block)) == 4):
                planar_pack(sch, block, shared)
            elif not region_sums_result(sch, block):
                elementwise(sch, block, shared)
        return sch
