"""bf16 dX on AMX-BF16 tiles: each 16-pixel x 16-channel block of a phase one ``tdpbf16ps`` accumulator.

On a target whose plan has ``amx_bf16`` a 2-D bf16 dX on the cube is built in the AMX tile plan
(``Formulation.CUBE_DX_AMX``, :mod:`tvm_convgrad.dsl.compute.dx_amx`): each stride phase a GEMM on
flat pixel rows, ``dx_amx[n, c1, q, c0]`` summing ``pair_dot`` over its taps ``(t_h, t_w)`` and Cout
pairs ``p``. Every ``(n, c1, 16 pixels)`` block is a task; its whole reduction is tensorized into
one call of the AMX helper (:data:`.amx_llvm.AMX_DW`, the dW's: the helper's two outer loops walk
the taps here, its inner one the Cout pairs in tiles of ``k``), the fp32 accumulator a tile
register from ``tilezero`` to ``tilestored``: ``A`` is 16 flat pixels of dy at one tap (rows a dy
pixel apart), ``B`` ``k`` pair rows of that tap's weights. The tensor intrinsic is made per
workload (:func:`amx_dx_intrin`); its description is the mad's own sum, so the two cannot disagree.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ...dsl.compute.dx_amx import AMX_TILE_ROWS
from ...dsl.compute.pairs import PAIR_DTYPE
from ...dsl.compute.stages import AMX_STEPS
from ...layout import C0
from ...tvmscript import fast_tvmscript
from ..common import loop_extent
from .amx import AMX_PAIRS_PER_ROW, pair_dot_source
from .amx_llvm import AMX_DW, amx_llvm
from .loops import CpuMad
from .tiles import largest_divisor

__all__ = ["AmxInputGrad", "amx_dx_intrin"]


def amx_dx_intrin(taps_h: int, taps_w: int, pairs: int, dy_h: int, dy_w: int, tap_h: int, tap_w: int) -> str:
    """The name of the tensor intrinsic (registered on first use) of one 16 x 16 block's reduction:
    ``taps_h x taps_w`` taps of ``pairs`` Cout pairs; tap ``(t_h, t_w)`` reads dy ``t_h*dy_h + t_w*dy_w``
    flat positions on and the turned weights ``(t_h*tap_h, t_w*tap_w)`` on."""
    name = f"tvm_convgrad.amx_dx_{taps_h}x{taps_w}x{pairs}_{dy_h}x{dy_w}_{tap_h}x{tap_w}"
    if name in _REGISTERED:
        return name
    k = largest_divisor(pairs, AMX_PAIRS_PER_ROW)
    span = AMX_TILE_ROWS + (taps_h - 1) * dy_h + (taps_w - 1) * dy_w
    w_h, w_w = 1 + (taps_h - 1) * tap_h, 1 + (taps_w - 1) * tap_w
    desc = tvm.script.from_source(_desc_source(taps_h, taps_w, pairs, dy_h, dy_w, tap_h, tap_w, span, w_h, w_w))

    with fast_tvmscript():  # the decorator's source lookup without scanning sys.modules
        @T.prim_func(s_tir=True)
        def impl(a_h: T.handle, b_h: T.handle, c_h: T.handle):
            sa0 = T.int64()
            sb0, sb1, sb2 = T.int64(), T.int64(), T.int64()
            sc0 = T.int64()
            a = T.match_buffer(a_h, (span, pairs), PAIR_DTYPE, offset_factor=1, strides=[sa0, 1])
            b = T.match_buffer(b_h, (w_h, w_w, pairs, C0), PAIR_DTYPE, offset_factor=1, strides=[sb0, sb1, sb2, 1])
            c = T.match_buffer(c_h, (AMX_TILE_ROWS, C0), "float32", offset_factor=1, strides=[sc0, 1])
            with T.sblock("root"):
                T.reads(b[0:w_h, 0:w_w, 0:pairs, 0:C0], a[0:span, 0:pairs])
                T.writes(c[0:AMX_TILE_ROWS, 0:C0])
                T.evaluate(
                    T.call_extern(
                        "int32", AMX_DW, c.access_ptr("w"), a.access_ptr("r"), b.access_ptr("r"),
                        T.int64(taps_h), T.int64(taps_w), T.int64(pairs // k), T.int64(k),
                        sa0 * 4 * dy_h, sa0 * 4 * dy_w, sa0 * 4, sb0 * 4 * tap_h, sb1 * 4 * tap_w, sb2 * 4, sc0 * 4,
                    )  # fmt: skip
                )

    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED.add(name)
    return name


_REGISTERED: set[str] = set()


def _desc_source(taps_h, taps_w, pairs, dy_h, dy_w, tap_h, tap_w, span, w_h, w_w) -> str:
    """The intrinsic's description: the mad's sum of ``pair_dot`` over one block, the taps of extent 1
    left out of the block's axes as the mad's block leaves them out."""
    taps = (("th", taps_h), ("tw", taps_w))
    axes = [name for name, extent in taps if extent > 1] + ["p"]
    at = {name: (f"v{name}" if extent > 1 else "0") for name, extent in taps}
    kinds = "SS" + "R" * len(axes)
    values = ", ".join(["vi", "vj", *(f"v{name}" for name in axes)])
    bound = ", ".join(["i", "j", *axes])
    a_at = f"a[vi + {at['th']} * {dy_h} + {at['tw']} * {dy_w}, vp]"
    b_at = f"b[{at['th']} * {tap_h}, {at['tw']} * {tap_w}, vp, vj]"
    return f"""
# from tvm.script import tirx as T
@T.prim_func(s_tir=True)
def desc(a: T.Buffer(({span}, {pairs}), "uint32", offset_factor=1), b: T.Buffer(({w_h}, {w_w}, {pairs}, 16), "uint32", offset_factor=1),
         c: T.Buffer(({AMX_TILE_ROWS}, 16), "float32", offset_factor=1)):
    with T.sblock("root"):
        T.reads(b[0:{w_h}, 0:{w_w}, 0:{pairs}, 0:16], a[0:{span}, 0:{pairs}])
        T.writes(c[0:{AMX_TILE_ROWS}, 0:16])
        for i, j, th, tw, p in T.grid({AMX_TILE_ROWS}, 16, {taps_h}, {taps_w}, {pairs}):
            with T.sblock("update"):
                {values} = T.axis.remap("{kinds}", [{bound}])
                T.reads(c[vi, vj], {b_at}, {a_at})
                T.writes(c[vi, vj])
                with T.init():
                    c[vi, vj] = T.float32(0)
                c[vi, vj] = c[vi, vj] + ({pair_dot_source(b_at, a_at)})
"""


class AmxInputGrad(CpuMad):
    """One stride phase of dX on AMX tiles (``dx_amx_<rh>_<rw>``, ``Formulation.CUBE_DX_AMX``)."""

    def schedule(self, block):
        """Every ``(n, c1, 16 flat pixels)`` block a parallel task (a channel block's weights read
        by all of an image's pixel tiles in turn); inside it the 16 x 16 tile and its whole
        reduction, one call of the AMX helper."""
        sch = self.sch
        dy_h, dy_w, tap_h, tap_w = (int(v) for v in sch.get(block).annotations[AMX_STEPS])
        n, c1, q, c0, t_h, t_w, p = sch.get_loops(block)
        q_tile, pixels = sch.split(q, [None, AMX_TILE_ROWS])
        sch.reorder(n, c1, q_tile, pixels, c0, t_h, t_w, p)
        task = sch.fuse(n, c1, q_tile)
        sch.parallel(task)
        sch.annotate(task, "pragma_import_llvm", amx_llvm(self.plan.amx_bf16))
        intrin = amx_dx_intrin(loop_extent(sch, t_h), loop_extent(sch, t_w), loop_extent(sch, p), dy_h, dy_w, tap_h, tap_w)
        sch.tensorize(pixels, intrin)
