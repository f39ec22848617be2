"""bf16 dW on AMX-BF16 tiles: each 16 Cout x 16 Cin block of ``dw_cc`` one ``tdpbf16ps`` accumulator.

On a target whose plan has ``amx_bf16`` (:func:`tvm_convgrad.isa.isa_plan`: ``+amx-tile,+amx-bf16``,
Sapphire Rapids and later) a 2-D bf16 dW on the cube is built in the AMX layout of its bf16 pairs
(``Formulation.CUBE_DW_AMX``, :mod:`tvm_convgrad.dsl.compute.dw_pairs`: dy's pairs in rows along
``wo``, or along the images on small maps, the ``A`` tile; x's pairs a row of 16 Cin words per
step, the ``B`` tile). Every block ``(g, co1, c1, kh, kw)`` is a task of its own; its whole
reduction ``(n, ho, wo)`` (``(ho, wo, n)`` with image pairs: the pairs innermost) is tensorized
into one call of the helper of :mod:`.amx_llvm`, which keeps the fp32 accumulator in a tile
register and runs ``tdpbf16ps`` on ``16 x k`` pair tiles (``k`` the largest divisor of the row's
pairs up to 16: a tile row holds 16 pairs, 32 bf16 values). The tensor intrinsic is made for
each workload's reduction extents (:func:`amx_intrin`); its description is the mad's own sum of
``pair_dot``, so the two cannot disagree.

Linux gives a process the tile registers only once it asked for them
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``): :func:`request_amx` does that, and
:func:`tvm_convgrad.build` calls it before an AMX kernel runs on this machine.
"""

from __future__ import annotations

import ctypes
import platform
import sys

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ...dsl.compute.pairs import PAIR_DTYPE, amx_tile_depth
from ...dsl.compute.stages import FMAP_L1, GRADS_2_MATRIX, X_STEP
from ...layout import C0
from ...tvmscript import fast_tvmscript
from ..common import elements, loop_extent
from .amx_llvm import amx_helper, amx_llvm
from .loops import CpuMad
from .marks import OVERWRITES

__all__ = ["CHUNK_BYTES", "AmxFilterGrad", "amx_intrin", "pair_dot_source", "request_amx"]

CHUNK_BYTES = 768 * 1024
"""The dy and x a dW task reads per chunk of its reduction: every tap of the chunk reads them again."""


def amx_intrin(images: int, rows: int, pairs: int, x_step: int, ma: int = 1, accumulate: bool = False) -> str:
    """The name of the tensor intrinsic (registered on first use) of ``ma`` Cout blocks' reduction
    with one Cin block: ``images x rows x pairs`` steps, x's pair ``p`` at packed column ``p * x_step``
    (``accumulate``: a chunk of the reduction, added to the blocks' sums)."""
    name = f"tvm_convgrad.amx_dw_{ma}_{images}x{rows}x{pairs}x{x_step}" + ("_acc" if accumulate else "")
    if name in _REGISTERED:
        return name
    span = (pairs - 1) * x_step + 1
    k = amx_tile_depth(pairs)
    a_shape, b_shape = (images, ma, rows, C0, pairs), (images, 1, 1, 1, rows, span, C0)  # as the mad's regions (a match drops leading dims only)
    desc = tvm.script.from_source(_desc_source(images, rows, pairs, x_step, span, ma))

    with fast_tvmscript():  # the decorator's source lookup without scanning sys.modules
        @T.prim_func(s_tir=True)
        def impl(a_h: T.handle, b_h: T.handle, c_h: T.handle):
            sa0, sa1, sa2, sa3 = T.int64(), T.int64(), T.int64(), T.int64()
            sb0, sb1, sb2, sb3, sb4, sb5 = T.int64(), T.int64(), T.int64(), T.int64(), T.int64(), T.int64()
            sc0 = T.int64()
            a = T.match_buffer(a_h, a_shape, PAIR_DTYPE, offset_factor=1, strides=[sa0, sa1, sa2, sa3, 1])
            b = T.match_buffer(b_h, b_shape, PAIR_DTYPE, offset_factor=1, strides=[sb0, sb1, sb2, sb3, sb4, sb5, 1])
            c = T.match_buffer(c_h, (ma * C0, C0), "float32", offset_factor=1, strides=[sc0, 1])
            with T.sblock("root"):
                T.reads(b[0:images, 0, 0, 0, 0:rows, 0:span, 0:C0], a[0:images, 0:ma, 0:rows, 0:C0, 0:pairs])
                T.writes(c[0 : ma * C0, 0:C0])
                T.evaluate(
                    T.call_extern(
                        "int32", amx_helper(ma, 1, accumulate), c.access_ptr("rw" if accumulate else "w"), a.access_ptr("r"), b.access_ptr("r"),
                        T.int64(images), T.int64(rows), T.int64(pairs // k), T.int64(k),
                        sa0 * 4, sa2 * 4, sa3 * 4, sb0 * 4, sb4 * 4, sb5 * 4 * x_step, sc0 * 4,
                        sa1 * 4, T.int64(0), sc0 * 4 * C0, T.int64(0), T.int64(1), T.int64(0), T.int64(0),
                    )  # fmt: skip
                )

    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED.add(name)
    return name


_REGISTERED: set[str] = set()


def pair_dot_source(x: str, y: str) -> str:
    """TVMScript of :func:`~tvm_convgrad.dsl.compute.pairs.pair_dot` of two pair words ``x`` and
    ``y`` (expressions), for a tensor intrinsic's description."""
    return (f'T.reinterpret("float32", {x} << T.uint32(16)) * T.reinterpret("float32", {y} << T.uint32(16)) + '
            f'T.reinterpret("float32", {x} & T.uint32(4294901760)) * T.reinterpret("float32", {y} & T.uint32(4294901760))')  # fmt: skip


def _desc_source(images: int, rows: int, pairs: int, x_step: int, span: int, ma: int) -> str:
    """The intrinsic's description: the mad's sum of ``pair_dot`` over ``ma`` 16 x 16 blocks, with the
    reduction axes of extent 1 (and a single Cout block) left out as the mad's block leaves them out."""
    reduction = (("n", images), ("h", rows), ("p", pairs))
    axes = [name for name, extent in reduction if extent > 1]  # (the mad's loops keep them all)
    at = {name: (f"v{name}" if extent > 1 else "0") for name, extent in reduction}
    loops = ", ".join([*(["ci"] if ma > 1 else []), "i", "j", *(name for name, _ in reduction)])
    extents = ", ".join([*([str(ma)] if ma > 1 else []), "16", "16", *(str(extent) for _, extent in reduction)])
    extent = dict(reduction)
    bindings = "\n                ".join(  # one Cout iterator, as the mad's
        [f"vco = T.axis.spatial({ma * 16}, {'ci * 16 + i' if ma > 1 else 'i'})", "vj = T.axis.spatial(16, j)"]
        + [f"v{name} = T.axis.reduce({extent[name]}, {name})" for name in axes]
    )
    b_at = f"b[{at['n']}, 0, 0, 0, {at['h']}, {at['p']} * {x_step}, vj]"
    a_at = f"a[{at['n']}, vco // 16, {at['h']}, vco % 16, {at['p']}]" if ma > 1 else f"a[{at['n']}, 0, {at['h']}, vco, {at['p']}]"
    c_at = "c[vco, vj]"
    product = pair_dot_source(b_at, a_at)
    return f"""
# from tvm.script import tirx as T
@T.prim_func(s_tir=True)
def desc(a: T.Buffer(({images}, {ma}, {rows}, 16, {pairs}), "uint32", offset_factor=1), b: T.Buffer(({images}, 1, 1, 1, {rows}, {span}, 16), "uint32", offset_factor=1),
         c: T.Buffer(({ma * 16}, 16), "float32", offset_factor=1)):
    with T.sblock("root"):
        T.reads(b[0:{images}, 0, 0, 0, 0:{rows}, 0:{span}, 0:16], a[0:{images}, 0:{ma}, 0:{rows}, 0:16, 0:{pairs}])
        T.writes(c[0:{ma * 16}, 0:16])
        for {loops} in T.grid({extents}):
            with T.sblock("update"):
                {bindings}
                T.reads({c_at}, {b_at}, {a_at})
                T.writes({c_at})
                with T.init():
                    {c_at} = T.float32(0)
                {c_at} = {c_at} + ({product})
"""


class AmxFilterGrad(CpuMad):
    """dW on AMX tiles (``dw_cc``, ``Formulation.CUBE_DW_AMX``)."""

    write_back_in_task = True

    def schedule(self, block):
        """Every ``(g, ma Cout blocks, c1)`` a parallel task (two Cout blocks where a group has an
        even number: two accumulators sharing each x tile) that walks its reduction in chunks of
        its first axis (images, or output rows with image pairs) whose dy and x stay in cache
        (:meth:`_images_per_chunk`), every tap of a chunk in
        turn, each one call of the AMX helper (the first chunk's writing the sums, the others'
        adding to them); with fewer such tasks than twice the cores, every tap a task of its own.
        Each task writes its result (cast, relayout) from cache (:meth:`CpuMad.write_back_in`):
        ResNet-18's 512 -> 512 3x3 on 2x2 maps at N=8, float32 dW of bf16 tensors, 1.21 -> 0.70 ms
        (its 9.4 MB of sums no longer written to memory and read back; Sapphire Rapids-class core)."""
        sch = self.sch
        attrs = sch.get(block).annotations
        kh, kw, x_step = (int(attrs[key]) for key in ("kernel_h", "kernel_w", X_STEP))
        g, fkk, co, c0, n, ho, wo = sch.get_loops(block)
        c1, tap_h, tap_w = sch.split(fkk, [None, kh, kw])
        ma = 2 if loop_extent(sch, co) % (2 * C0) == 0 else 1
        co1, blocks, co0 = sch.split(co, [None, ma, C0])
        images = loop_extent(sch, n)
        chunk = self._images_per_chunk(block, images, ma)
        chunks, n_in = sch.split(n, [None, chunk])
        tasks = loop_extent(sch, g) * loop_extent(sch, co1) * loop_extent(sch, c1)
        if tasks >= self.cores:  # a chunk's dy and x read by every tap while in cache
            sch.reorder(g, co1, c1, chunks, tap_h, tap_w, blocks, co0, c0, n_in, ho, wo)
            task = sch.fuse(g, co1, c1)
        else:
            sch.reorder(g, co1, c1, tap_h, tap_w, chunks, blocks, co0, c0, n_in, ho, wo)
            task = sch.fuse(g, co1, c1, tap_h, tap_w)
        sch.parallel(task)
        self.write_back_in(block, task)  # (first: the tensorized block is replaced)
        accumulate = chunk < images
        sch.annotate(task, "pragma_import_llvm", amx_llvm(self.config.plan.amx_bf16, ma, 1, accumulate))
        intrin = amx_intrin(chunk, loop_extent(sch, ho), loop_extent(sch, wo), x_step, ma, accumulate)
        tiled = sch.blockize(blocks if ma > 1 else co0)
        if not accumulate:
            sch.annotate(tiled, OVERWRITES, 1)  # the helper writes every tile: no zeros before it (.marks)
        sch.tensorize(tiled, intrin)

    def _images_per_chunk(self, block, images: int, ma: int) -> int:
        """The most images (output rows with image pairs; a divisor of their number) whose dy of
        ``ma`` Cout blocks and x of one Cin block a task reads take at most :data:`CHUNK_BYTES` (at least one)."""
        stmt = self.sch.get(block)
        (dy,) = [r.source for r in stmt.reads if r.source.name == GRADS_2_MATRIX]
        (x,) = [r.source for r in stmt.reads if r.source.name == FMAP_L1]
        per_image = 4 * (ma * elements(dy) // (int(dy.shape[0]) * int(dy.shape[1])) + elements(x) // (int(x.shape[0]) * int(x.shape[1])))
        return max([d for d in range(1, images + 1) if images % d == 0 and d * per_image <= CHUNK_BYTES] or [1])


_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64


def request_amx() -> bool:
    """Ask Linux for this process's AMX tile data (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``); True once granted (asking again is harmless), False where it is not
    (not Linux on x86-64, or a kernel or CPU without AMX)."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False
