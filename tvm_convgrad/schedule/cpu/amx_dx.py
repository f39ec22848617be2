"""bf16 dX on AMX-BF16 tiles: blocks of 16 pixels x 16 channels of a phase, each a ``tdpbf16ps`` accumulator.

On a target whose plan has ``amx_bf16`` a 2-D bf16 dX on the cube is built in the AMX tile plan
(``Formulation.CUBE_DX_AMX``, :mod:`tvm_convgrad.dsl.compute.dx_amx`): each stride phase a GEMM on
flat pixel rows, ``dx_amx[n, c1, q, c0]`` summing ``pair_dot`` over its taps ``(t_h, t_w)`` and Cout
pairs ``p``. A task is ``nb`` channel blocks of one image (the images inside the blocks where the
weights are the larger read: :func:`images_inside`), its pixel tiles ``ma`` at a time (2 x 2
where both pair up: four accumulators in the eight tile registers, each ``A`` tile (16 pixels of
dy at a tap) read by ``nb`` multiplies and each ``B`` tile (that tap's weights) by ``ma``); the
task is tensorized into one call of an AMX helper (:mod:`.amx_llvm`, the dW's: its step loop walks
the pixel tiles, its two outer reduction loops the taps, its inner one the Cout pairs in tiles of
``k``), each accumulator a tile register from ``tilezero`` to ``tilestored``. The tensor intrinsic
is made per workload (:func:`amx_dx_intrin`); its description is the mad's own sum, so the two
cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ...dsl.compute.dx_amx import AMX_TILE_ROWS
from ...dsl.compute.pairs import PAIR_DTYPE, amx_tile_depth
from ...dsl.compute.stages import AMX_STEPS, DY_AMX, W_AMX
from ...layout import C0
from ...tvmscript import fast_tvmscript
from ..common import buffer_bytes, loop_extent
from .amx import pair_dot_source
from .amx_llvm import amx_helper, amx_llvm
from .loops import CpuMad, producers_named
from .marks import OVERWRITES

__all__ = ["WEIGHTS_OVER_DY", "AmxDxBlock", "AmxInputGrad", "amx_dx_blocks", "amx_dx_intrin", "images_inside"]


@dataclass(frozen=True)
class AmxDxBlock:
    """One task's part of a phase's mad: ``steps`` of ``ma`` tiles of 16 flat pixels, x ``nb`` channel
    blocks, reducing ``taps_h x taps_w`` taps of ``pairs`` Cout pairs; tap ``(t_h, t_w)`` reads dy
    ``t_h*dy_h + t_w*dy_w`` flat positions on and the turned weights ``(t_h*tap_h, t_w*tap_w)`` on."""

    steps: int
    ma: int
    nb: int
    taps_h: int
    taps_w: int
    pairs: int
    dy_h: int
    dy_w: int
    tap_h: int
    tap_w: int

    @property
    def pixels(self) -> int:
        return self.steps * self.ma * AMX_TILE_ROWS

    @property
    def span(self) -> int:
        """dy's flat positions the block reads."""
        return self.pixels + (self.taps_h - 1) * self.dy_h + (self.taps_w - 1) * self.dy_w

    @property
    def weight_taps(self) -> tuple[int, int]:
        """The turned weight taps the block's region spans along each axis."""
        return 1 + (self.taps_h - 1) * self.tap_h, 1 + (self.taps_w - 1) * self.tap_w


def amx_dx_intrin(block: AmxDxBlock) -> str:
    """The name of the tensor intrinsic (registered on first use) of one task's block and its
    whole reduction (see :class:`AmxDxBlock`)."""
    b = block
    name = f"tvm_convgrad.amx_dx_{b.steps}x{b.ma}x{b.nb}_{b.taps_h}x{b.taps_w}x{b.pairs}_{b.dy_h}x{b.dy_w}_{b.tap_h}x{b.tap_w}"
    if name in _REGISTERED:
        return name
    k = amx_tile_depth(b.pairs)
    w_h, w_w = b.weight_taps
    desc = tvm.script.from_source(_desc_source(b))
    span, pairs, pixels, nb = b.span, b.pairs, b.pixels, b.nb

    with fast_tvmscript():  # the decorator's source lookup without scanning sys.modules
        @T.prim_func(s_tir=True)
        def impl(a_h: T.handle, b_h: T.handle, c_h: T.handle):
            sa0 = T.int64()
            sbc, sb0, sb1, sb2 = T.int64(), T.int64(), T.int64(), T.int64()
            scc, sc0 = T.int64(), T.int64()
            a = T.match_buffer(a_h, (span, pairs), PAIR_DTYPE, offset_factor=1, strides=[sa0, 1])
            w = T.match_buffer(b_h, (nb, w_h, w_w, pairs, C0), PAIR_DTYPE, offset_factor=1, strides=[sbc, sb0, sb1, sb2, 1])
            c = T.match_buffer(c_h, (nb, pixels, C0), "float32", offset_factor=1, strides=[scc, sc0, 1])
            with T.sblock("root"):
                T.reads(w[0:nb, 0:w_h, 0:w_w, 0:pairs, 0:C0], a[0:span, 0:pairs])
                T.writes(c[0:nb, 0:pixels, 0:C0])
                T.evaluate(
                    T.call_extern(
                        "int32", amx_helper(b.ma, b.nb), c.access_ptr("w"), a.access_ptr("r"), w.access_ptr("r"),
                        T.int64(b.taps_h), T.int64(b.taps_w), T.int64(pairs // k), T.int64(k),
                        sa0 * 4 * b.dy_h, sa0 * 4 * b.dy_w, sa0 * 4, sb0 * 4 * b.tap_h, sb1 * 4 * b.tap_w, sb2 * 4, sc0 * 4,
                        sa0 * 4 * AMX_TILE_ROWS, sbc * 4, sc0 * 4 * AMX_TILE_ROWS, scc * 4,
                        T.int64(b.steps), sa0 * 4 * AMX_TILE_ROWS * b.ma, sc0 * 4 * AMX_TILE_ROWS * b.ma,
                    )  # fmt: skip
                )

    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED.add(name)
    return name


_REGISTERED: set[str] = set()


def _desc_source(b: AmxDxBlock) -> str:
    """The intrinsic's description: the mad's sum of ``pair_dot`` over one block, the taps of extent 1
    (and a single channel block) left out of the block's axes as the mad's block leaves them out."""
    w_h, w_w = b.weight_taps
    spatial = (["cb"] if b.nb > 1 else []) + ["i", "j"]
    taps = (("th", b.taps_h), ("tw", b.taps_w))
    axes = [name for name, extent in taps if extent > 1] + ["p"]
    at = {name: (f"v{name}" if extent > 1 else "0") for name, extent in taps}
    cb = "vcb" if b.nb > 1 else "0"
    kinds = "S" * len(spatial) + "R" * len(axes)
    values = ", ".join(f"v{name}" for name in spatial + axes)
    bound = ", ".join(spatial + axes)
    a_at = f"a[vi + {at['th']} * {b.dy_h} + {at['tw']} * {b.dy_w}, vp]"
    w_at = f"w[{cb}, {at['th']} * {b.tap_h}, {at['tw']} * {b.tap_w}, vp, vj]"
    c_at = f"c[{cb}, vi, vj]"
    loops = ", ".join(["cb"] * (b.nb > 1) + ["i", "j", "th", "tw", "p"])
    extents = ", ".join([str(b.nb)] * (b.nb > 1) + [str(b.pixels), "16", str(b.taps_h), str(b.taps_w), str(b.pairs)])
    return f"""
# from tvm.script import tirx as T
@T.prim_func(s_tir=True)
def desc(a: T.Buffer(({b.span}, {b.pairs}), "uint32", offset_factor=1), w: T.Buffer(({b.nb}, {w_h}, {w_w}, {b.pairs}, 16), "uint32", offset_factor=1),
         c: T.Buffer(({b.nb}, {b.pixels}, 16), "float32", offset_factor=1)):
    with T.sblock("root"):
        T.reads(w[0:{b.nb}, 0:{w_h}, 0:{w_w}, 0:{b.pairs}, 0:16], a[0:{b.span}, 0:{b.pairs}])
        T.writes(c[0:{b.nb}, 0:{b.pixels}, 0:16])
        for {loops} in T.grid({extents}):
            with T.sblock("update"):
                {values} = T.axis.remap("{kinds}", [{bound}])
                T.reads({c_at}, {w_at}, {a_at})
                T.writes({c_at})
                with T.init():
                    {c_at} = T.float32(0)
                {c_at} = {c_at} + ({pair_dot_source(w_at, a_at)})
"""


def amx_dx_blocks(pixel_tiles: int, channel_blocks: int, grouped: bool) -> tuple[int, int]:
    """``(ma, nb)`` of a phase: 2 x 2 where the pixel tiles and the channel blocks pair up (a pair of
    channel blocks of a grouped layer could straddle two groups' dy: 1 there)."""
    return (2 if pixel_tiles % 2 == 0 else 1), (2 if channel_blocks % 2 == 0 and not grouped else 1)


WEIGHTS_OVER_DY = 4
"""How many times the bytes of dy the images' weight reads must be before a dX walks the images
inside its channel blocks (:func:`images_inside`)."""


def images_inside(images: int, blocks: int, weight_bytes: int, dy_bytes: int) -> bool:
    """Whether a dX's tasks walk the images inside the channel blocks (``blocks`` of them): the
    images outside, every image reads all the weights (``images x weights``; its dy stays in
    cache); inside, every block reads all of dy (``blocks x dy``; its weights stay in cache).
    Inside where the weights' reads are :data:`WEIGHTS_OVER_DY` times dy's or more: weights that
    fit a core's L2 are read from there again, at less than memory's cost. Sapphire Rapids-class
    core (2 MB L2), bf16, ms outside / inside: 512 -> 512 3x3 on 2x2 maps at N=8 (37.7 MB of
    weight reads against 0.5 MB of dy) 1.32 / 0.81, on 4x4 at N=32 (6x) 3.99 / 2.09, 256 -> 256 on
    4x4 at N=8 (6x) 0.33 / 0.24; 256 -> 256 on 7x7 at N=32 (3x, 1.2 MB of weights) 1.08 / 1.17,
    128 -> 128 on 14x14 (1.1x) 1.23 / 1.44."""
    return images > 1 and blocks > 1 and images * weight_bytes >= WEIGHTS_OVER_DY * blocks * dy_bytes


class AmxInputGrad(CpuMad):
    """One stride phase of dX on AMX tiles (``dx_amx_<rh>_<rw>``, ``Formulation.CUBE_DX_AMX``)."""

    def schedule(self, block):
        """Every ``(n, nb channel blocks)`` of the phase a parallel task: one call of the AMX helper,
        its pixel tiles ``ma`` at a time (the blocks' weights in cache), each step's whole
        reduction in tile registers. The tasks walk the images outside the channel blocks, or
        inside them where the images' weight reads outweigh dy's (:func:`images_inside`: each
        core's run of tasks then reads its blocks' weights once for all the images; each task
        packs them itself where it can, :meth:`_weights_per_task`)."""
        sch = self.sch
        dy_h, dy_w, tap_h, tap_w, grouped = (int(v) for v in sch.get(block).annotations[AMX_STEPS])
        n, c1, q, c0, t_h, t_w, p = sch.get_loops(block)
        tiles = loop_extent(sch, q) // AMX_TILE_ROWS
        ma, nb = amx_dx_blocks(tiles, loop_extent(sch, c1), bool(grouped))
        c1_task, channels = sch.split(c1, [None, nb])
        images, blocks = loop_extent(sch, n), loop_extent(sch, c1_task)
        inside = images_inside(images, blocks, buffer_bytes(sch, W_AMX), buffer_bytes(sch, DY_AMX))
        outer = [c1_task, n] if inside else [n, c1_task]
        sch.reorder(*outer, channels, q, c0, t_h, t_w, p)
        pack = self._weights_per_task(block, blocks) if inside else None
        task = c1_task if pack is not None else sch.fuse(*outer)
        at = channels if nb > 1 else q
        if pack is not None:
            self.pack_at(pack, c1_task)
        sch.parallel(task)  # (the result stays a pass of its own: TVM cannot invert its flat-pixel reads over a task)
        sch.annotate(task, "pragma_import_llvm", amx_llvm(self.plan.amx_bf16, ma, nb))
        shape = AmxDxBlock(tiles // ma, ma, nb, loop_extent(sch, t_h), loop_extent(sch, t_w), loop_extent(sch, p), dy_h, dy_w, tap_h, tap_w)
        tiled = sch.blockize(at)
        sch.annotate(tiled, OVERWRITES, 1)  # the helper writes every tile: no zeros before it (.marks)
        sch.tensorize(tiled, amx_dx_intrin(shape))

    def _weights_per_task(self, block, blocks: int):
        """The weight pack (``w_amx``) to make inside each task, where the tasks walk the images
        inside the channel blocks, this phase is its only reader and the ``blocks`` tasks are at
        least two a core: each task packs its blocks' weights into cache and the images' tiles
        read them there, instead of the whole pack written to memory and read back. 512 -> 512 3x3
        on 2x2 maps at N=8, caches flushed before each call: 1.38-1.62 -> 1.05-1.09 ms (hot 0.76 ->
        0.71); on 4x4 at N=32 3.05-3.28 -> 2.74-2.78 (hot 2.10 -> 2.19-2.25; Sapphire Rapids-class
        core). None where it does not apply."""
        packs = producers_named(self.sch, block, (W_AMX,))
        if len(packs) != 1 or len(self.sch.get_consumers(packs[0])) != 1 or blocks < 2 * self.cores:
            return None
        return packs[0]
