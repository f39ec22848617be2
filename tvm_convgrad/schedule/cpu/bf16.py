"""bf16 gradients on AVX512-BF16: 16 lanes of a bf16-pair mad as one ``vdpbf16ps``.

On a target whose plan has ``bf16_dot`` (:func:`tvm_convgrad.isa.isa_plan`), a bf16 gradient on
the cube is built in its bf16-pair form (:mod:`tvm_convgrad.dsl.compute.pairs`: packs of
``uint32`` words holding two bf16 values of consecutive reduction steps, the mad summing
``pair_dot``). Its schedule is the fp32 cube's (:mod:`.cube`: the same tiles, chunks and core
split, with a reduction half as long), except that each accumulator row's 16 lanes are not
vectorized but tensorized with :data:`DPBF16_INTRIN`: ``acc = dpbf16(acc, a_row, broadcast(b))``,
one ``vdpbf16ps zmm_acc, zmm_row, mem{1to16}`` (32 multiply-adds). The accumulators stay fp32.

TVM 0.27 cannot type the instruction's ``<32 x bfloat>`` operands, so the intrinsic calls a small
LLVM IR function (:data:`DPBF16_LLVM`) imported into the module through the mad's
``pragma_import_llvm`` annotation and inlined (COOKBOOK §10).

**Arithmetic** (Intel SDM, ``VDPBF16PS``): per lane, ``acc += a_odd*b_odd`` then ``acc += a_even*b_even``,
each an fp32 FMA rounded to nearest even, with bf16 denormal inputs read as zero (DAZ) and
denormal results flushed to zero (FTZ); MXCSR is neither read nor written. The products of two
bf16 values are exact in fp32, so a pair costs two roundings: one per product, as the fp32
cube's one FMA per product. What differs from the exact path is the flushing (see ``docs/isa.md``'s
bound).

A target without the instruction never gets this form (its bf16 gradients keep the exact fp32
path), except through :func:`tvm_convgrad.emulate_bf16_dot`: there the helper is
:data:`DPBF16_EMULATED_LLVM`, the same arithmetic (DAZ, two FTZ FMAs in the instruction's order)
in portable LLVM IR, so the bf16 kernels are checked on any machine.
"""

from __future__ import annotations

from dataclasses import replace

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ...dsl.compute.pairs import PAIR_DTYPE, pair_dot
from ...dsl.compute.stages import WINO_D, WINO_DP, WINO_U, WINO_UP, WINO_V, WINO_VP, WINO_WT
from ...isa import PLANS
from ...layout import C0
from ...tvmscript import fast_tvmscript
from .cube import CubeForward, CubeInputGrad
from .cube_dw import CubeFilterGrad
from .lanes import CoutLanesFilterGrad
from .loops import CpuMad, producers_named
from .winograd import WinogradConv, WinogradFilterGrad

__all__ = [
    "DPBF16", "DPBF16_EMULATED_LLVM", "DPBF16_INTRIN", "DPBF16_LLVM", "PairedCoutLanesFilterGrad", "PairedFilterGrad", "PairedForward", "PairedInputGrad", "PairedWinogradConv", "PairedWinogradFilterGrad",
    "dpbf16_llvm", "emulated_pairs_llvm",
]  # fmt: skip

DPBF16 = "tvm_convgrad_dpbf16"
"""The helper's symbol: ``(acc: float32x16, a: int32x16, b: int32x16) -> float32x16``."""

DPBF16_LLVM = r"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define internal <16 x float> @tvm_convgrad_dpbf16(<16 x float> %c, <16 x i32> %a, <16 x i32> %b) alwaysinline {
  %av = bitcast <16 x i32> %a to <32 x bfloat>
  %bv = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %av, <32 x bfloat> %bv)
  ret <16 x float> %r
}
"""
"""One ``vdpbf16ps``: lane ``i`` adds ``a[2i]*b[2i] + a[2i+1]*b[2i+1]`` (the int32 lanes hold bf16 pairs)."""


def _splat(value: int) -> str:
    return "<" + ", ".join([f"i32 {value}"] * 16) + ">"


def emulated_pairs_llvm(name: str, odd_first: bool) -> str:
    """Portable LLVM IR of a bf16-pair dot on 16 lanes, ``@{name}(acc: <16 x float>, a: <16 x i32>,
    b: <16 x i32>)``: DAZ on every input (and the accumulator), the two products of each lane's
    pair as FTZ fp32 FMAs, odd first (``vdpbf16ps``) or even first (AMX's ``tdpbf16ps``); its flush
    helper is ``@{name}_flush``."""
    flush = f"{name}_flush"
    first, second = ("o", "e") if odd_first else ("e", "o")
    return f"""
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
define internal <16 x float> @{flush}(<16 x i32> %x) alwaysinline {{
  %exp = and <16 x i32> %x, {_splat(0x7F800000)}
  %tiny = icmp eq <16 x i32> %exp, zeroinitializer
  %sign = and <16 x i32> %x, {_splat(-0x80000000)}
  %kept = select <16 x i1> %tiny, <16 x i32> %sign, <16 x i32> %x
  %f = bitcast <16 x i32> %kept to <16 x float>
  ret <16 x float> %f
}}
define internal <16 x float> @{name}(<16 x float> %c, <16 x i32> %a, <16 x i32> %b) alwaysinline {{
  %a_even = shl <16 x i32> %a, {_splat(16)}
  %b_even = shl <16 x i32> %b, {_splat(16)}
  %a_odd = and <16 x i32> %a, {_splat(-0x10000)}
  %b_odd = and <16 x i32> %b, {_splat(-0x10000)}
  %ae = call <16 x float> @{flush}(<16 x i32> %a_even)
  %be = call <16 x float> @{flush}(<16 x i32> %b_even)
  %ao = call <16 x float> @{flush}(<16 x i32> %a_odd)
  %bo = call <16 x float> @{flush}(<16 x i32> %b_odd)
  %c_bits = bitcast <16 x float> %c to <16 x i32>
  %acc = call <16 x float> @{flush}(<16 x i32> %c_bits)
  %t = call <16 x float> @llvm.fma.v16f32(<16 x float> %a{first}, <16 x float> %b{first}, <16 x float> %acc)
  %t_bits = bitcast <16 x float> %t to <16 x i32>
  %t_ftz = call <16 x float> @{flush}(<16 x i32> %t_bits)
  %r = call <16 x float> @llvm.fma.v16f32(<16 x float> %a{second}, <16 x float> %b{second}, <16 x float> %t_ftz)
  %r_bits = bitcast <16 x float> %r to <16 x i32>
  %r_ftz = call <16 x float> @{flush}(<16 x i32> %r_bits)
  ret <16 x float> %r_ftz
}}
"""


DPBF16_EMULATED_LLVM = emulated_pairs_llvm(DPBF16, odd_first=True)
"""``vdpbf16ps``'s arithmetic in portable LLVM IR (any CPU): DAZ on every input, the odd pair's FMA
then the even pair's, each result flushed to zero when denormal."""


def dpbf16_llvm(bf16_dot: bool) -> str:
    """The helper a kernel imports: the instruction where the target has it, else its emulation."""
    return DPBF16_LLVM if bf16_dot else DPBF16_EMULATED_LLVM


with fast_tvmscript():  # the decorator's source lookup without scanning sys.modules

    @T.prim_func(s_tir=True)
    def _dpbf16_desc(a: T.Buffer((C0,), PAIR_DTYPE, offset_factor=1), b: T.Buffer((1,), PAIR_DTYPE, offset_factor=1),
                     c: T.Buffer((C0,), "float32", offset_factor=1)):  # fmt: skip
        with T.sblock("root"):
            T.reads(c[0:C0], a[0:C0], b[0:1])
            T.writes(c[0:C0])
            for i in T.serial(C0):
                with T.sblock("update"):
                    vi = T.axis.remap("S", [i])
                    c[vi] = c[vi] + pair_dot(a[vi], b[0])

    @T.prim_func(s_tir=True)
    def _dpbf16_impl(a: T.Buffer((C0,), PAIR_DTYPE, offset_factor=1), b: T.Buffer((1,), PAIR_DTYPE, offset_factor=1),
                     c: T.Buffer((C0,), "float32", offset_factor=1)):  # fmt: skip
        with T.sblock("root"):
            T.reads(c[0:C0], a[0:C0], b[0:1])
            T.writes(c[0:C0])
            c[T.ramp(0, 1, C0)] = T.call_pure_extern("float32x16", DPBF16, c[T.ramp(0, 1, C0)], a[T.ramp(0, 1, C0)], T.broadcast(b[0], C0))


DPBF16_INTRIN = "tvm_convgrad.dpbf16_16x2"
"""16 fp32 accumulators += a row of 16 bf16 pairs x one broadcast pair (``pair_dot`` per lane)."""
TensorIntrin.register(DPBF16_INTRIN, _dpbf16_desc, _dpbf16_impl, override=True)


class _Pairs(CpuMad):
    """A bf16-pair mad: the fp32 cube's schedule on the AVX-512 register tiles (16 rows of one
    zmm; also where the emulation runs on another ISA), each row's lanes one ``dpbf16``."""

    block_tiles = False  # (a tile of one channel block: the pair's tensorized row)

    @property
    def plan(self):
        plan = self.config.plan
        if plan.name == "avx512":
            return plan
        return replace(PLANS["avx512"], bf16_dot=plan.bf16_dot)  # the emulation: the tiles a vdpbf16ps target gets

    def register_tile(self, block, unrolled, lanes, first_reduce):
        sch = self.sch
        for loop in unrolled:
            sch.unroll(loop)
        init = sch.decompose_reduction(block, first_reduce)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.annotate(sch.get_loops(block)[0], "pragma_import_llvm", dpbf16_llvm(self.plan.bf16_dot))
        sch.tensorize(lanes, DPBF16_INTRIN)


class PairedFilterGrad(_Pairs, CubeFilterGrad):
    """dW on the cube in bf16 pairs (``dw_cc``, ``Formulation.CUBE_DW_BF16``): with too few tiles
    for the cores, the reduction splits into parts that divide it (a ragged split predicates the
    mad, which a tensor intrinsic cannot match)."""

    ragged_parts = False


class PairedInputGrad(_Pairs, CubeInputGrad):
    """One stride phase of dX on the cube in bf16 pairs (``dx_cc_<rh>_<rw>``, ``Formulation.CUBE_DX_BF16``):
    whole pixel tiles only (an edge tile's copy of the mad, made by ``loop_partition``, reads
    whole buffers as far as the schedule can tell, which a tensor intrinsic cannot match)."""

    edge_tiles = False


class PairedForward(_Pairs, CubeForward):
    """The forward convolution on the cube in bf16 pairs (``conv_cc``, ``Formulation.CUBE_FWD_BF16``):
    a paired dX phase's schedule, each row a weight row of 16 output channels times one broadcast
    pair of input channels; whole pixel tiles only."""

    edge_tiles = False


class PairedCoutLanesFilterGrad(_Pairs, CoutLanesFilterGrad):
    """dW with Cout on the lanes in bf16 pairs (``dw_cc_t``, ``Formulation.COUT_LANES_BF16``: few
    input channels, e.g. a network's first layer): each tile row a Cout vector of dy pairs times
    one broadcast x pair. Its pair packs keep their own placement (not band by band)."""

    packs_per_band = False


class _PairedTransforms(_Pairs):
    """What both Winograd mads on bf16 pairs do with their pair stages."""

    def _pack(self, pack, loop):
        """A pair stage (``wino_vp``, ``wino_dp``) under ``loop``, its positions unrolled, and the
        fp32 transform it rounds (``wino_v``, ``wino_d``) under its tile loop."""
        sch = self.sch
        self._positions_unrolled(pack, loop)
        (values,) = producers_named(sch, pack, (WINO_V, WINO_D))
        self._positions_unrolled(values, sch.get_loops(pack)[-3])  # (under the pack's tile loop: *rows, tile, xi, lanes)
        self._rows_in_task(values, loop)


class PairedWinogradConv(_PairedTransforms, WinogradConv):
    """F(2x2, 3x3)'s 16 GEMMs on bf16 pairs of input channels (``wino_m``, ``Formulation.WINOGRAD_BF16``):
    the fp32 Winograd schedule, each Cout row of a register tile one ``vdpbf16ps`` per pair, whole
    register tiles only (a tensorized mad has no edge tile's copy). The weights' pairs
    (``wino_up``) are the weights' pass, each from its taps in registers (``wino_u`` inlined); a
    task's pairs (``wino_vp``) are made tile by tile from its 16 transformed positions
    (``wino_v``, computed under the tile: in registers)."""

    whole_tiles = True

    def _weights(self, up):
        sch = self.sch
        (u,) = producers_named(sch, up, (WINO_U,))
        for staged in producers_named(sch, u, (WINO_WT,)):
            self._lanes_last(staged)
        sch.compute_inline(u)
        co1, xi, p, co0 = sch.get_loops(up)
        p_o, p_i = sch.split(p, [None, C0 // 2])  # (16 input channels a task: Winograd takes whole blocks)
        sch.reorder(co1, p_o, p_i, xi, co0)
        sch.parallel(sch.fuse(co1, p_o))
        sch.unroll(xi)
        sch.vectorize(co0)
        self.placed.update({WINO_U, WINO_UP})


class PairedWinogradFilterGrad(_PairedTransforms, WinogradFilterGrad):
    """F(2x2, 3x3)'s dW GEMMs on bf16 pairs of tiles (``wino_dw``, ``Formulation.WINOGRAD_DW_BF16``):
    the fp32 Winograd dW schedule, each Cout row of a register tile one ``vdpbf16ps`` per pair of
    tiles (the input channel's pair broadcast). A chunk's pairs (``wino_vp``, ``wino_dp``) are made
    pair by pair from the two tiles' 16 transformed positions (``wino_v``, ``wino_d``, computed under
    the pair: in L1)."""

    packs = (WINO_VP, WINO_DP)
