"""Tensor-core schedule of one gradient mad: the 16x16x16 cube on WMMA, f16 x f16 -> f32.

Every mad of the cube formulations (dW's ``dw_cc`` / ``dw_cc_t``, dX's ``dx_cc_*`` / ``dx_px_*``)
is a batched GEMM once its two operands are re-indexed by the mad's own iterators: TVM's dlight
analysis (``dlight.gpu.matmul.get_index_map``) sorts the iterators into ``S`` (in both operands
and the result: dW's group), ``I`` (the first operand and the result), ``J`` (the second operand
and the result) and ``K`` (the reduction), and fuses each kind: ``C[S, I, J] += A[S, I, K] *
B[S, K, J]``. For dW, ``I`` is Cout (dy's channels), ``J`` the ``(c1, kh, kw, c0)`` of x and ``K``
the ``(n, ho, wo)`` positions; for dX, ``I`` the pixels ``(n, j, i)`` of a stride phase, ``J`` the
input channels and ``K`` ``(co1, mh, mw, co0)``. ``B`` is stored K-major, so that its rows are the
inputs' contiguous channel axis.

The packs (``grads_2_matrix``, ``fmap_l1``, ``dy_pad``, ``w_col``, ...) hold fp16 values in an fp32
stage; :func:`narrow_packs` stores them as fp16 again (exact: every value is an fp16 input or a
zero), so that the GEMM's operands are the tensor cores' ``f16`` and its products are summed in
``f32`` — the cube's arithmetic, as on the CPU.

The schedule of one GEMM (a thread block computes a ``block_m x block_n`` tile of one ``S``):

==================  ====================  ==============================  =====================================
stage               scope                 shape per thread block          how
==================  ====================  ==============================  =====================================
``A`` copy          ``shared.dyn``        ``(block_m, 16*k_frags)`` f16   the packs' gather (padding, stride
``B`` copy          ``shared.dyn``        ``(16*k_frags, block_n)`` f16   phases) inlined; all threads,
                                          rows padded by 8 halves         vectorized; per K step
fragments           ``wmma.matrix_a/_b``  ``(16, 16)`` each               ``load_matrix_sync``
accumulators        ``wmma.accumulator``  ``frags_m x frags_n`` per warp  ``fill_fragment`` / ``mma_sync``
``C`` staging       ``shared``            ``(block_m, block_n)`` f32      ``store_matrix_sync``; the result
                                                                          stages inlined into its copy to
                                                                          global memory
==================  ====================  ==============================  =====================================

The GEMM extents are padded to whole block tiles (``pad_einsum``): the padding reads zeros and
its results are never stored.

**Emulation** (:class:`Lowering`, ``emulate=True``): the same schedule with the thread bindings
left as serial loops and each tensor-core block left as the plain TIR the intrinsic stands for —
that each block matches the intrinsic's registered description is checked by tensorizing it on a
copy of the schedule — and the fragments stored as ordinary buffers (shared memory stays: LLVM
allocates it like any other buffer), so that LLVM builds and runs the CUDA schedule's tiling,
staging, padding and fragment layout on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumers, auto_inline_producers, get_index_map
from tvm.target import Target

from .intrinsics import cuda_intrinsics

__all__ = ["Config", "GemmExtents", "Lowering", "TC", "WARP", "as_gemm", "gemm_extents", "get_config", "mad_gemm", "narrow_packs", "tensorize_gemm"]

TC = 16
"""The tensor-core block: 16x16x16 (the cube)."""

WARP = 32
SM_COUNT = {"sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132}
"""Streaming multiprocessors of the arch's flagship part (A100, RTX 30, RTX 40/L40, H100): the
thread blocks a grid should fill."""

MAX_WASTE = 1.125  # padded / real extent accepted for a larger tile
MAX_BLOCK_FRAGMENTS = 16  # 64x64 or 128x32 results per thread block
SHARED_BYTES = 48 * 1024
"""Shared memory of one thread block: what every arch gives a kernel without an opt-in. The operand
tiles are dynamic shared memory, the fp32 result tile static: in one scope TVM 0.27 would reuse the
operand tiles' bytes for the result tile with the operands' element type, which ``LowerIntrin``
rejects (``tvm_access_ptr element type must match the source buffer``)."""


@dataclass(frozen=True)
class Config:
    """The tiling of one GEMM: ``warps_m x warps_n`` warps per thread block, each holding
    ``frags_m x frags_n`` 16x16 accumulators; ``k_frags`` 16-deep steps per shared-memory stage;
    ``vector`` halves per thread per copy instruction."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    k_frags: int
    vector: int = 2  # 4 halves: small ptxas spills in strided dX phases; 8: TVM emits an invalid make_ulonglong4

    @property
    def block_m(self) -> int:
        return TC * self.warps_m * self.frags_m

    @property
    def block_n(self) -> int:
        return TC * self.warps_n * self.frags_n

    @property
    def block_k(self) -> int:
        return TC * self.k_frags

    @property
    def threads(self) -> int:
        return WARP * self.warps_m * self.warps_n

    def shared_bytes(self) -> int:
        """Shared memory of one thread block: the fp16 operand tiles (rows padded by 8 halves) and
        the fp32 result tile."""
        operands = (self.block_m + self.block_n) * (self.block_k + 8) * 2
        return operands + self.block_m * (self.block_n + 4) * 4


@dataclass(frozen=True)
class GemmExtents:
    """``C[S, I, J] += A[S, I, K] * B[S, J, K]`` of a mad."""

    s: int
    i: int
    j: int
    k: int


def gemm_extents(block: tirx.SBlock) -> GemmExtents | None:
    """The GEMM extents of a mad whose operands were re-indexed, or None when it is not a GEMM
    (depthwise: the channel is in both operands and no iterator is in one operand only)."""
    maps = get_index_map(block)
    if maps is None:
        return None
    extents = {"s": 1, "i": 1, "j": 1, "k": 1}
    matmul_map = maps[0]
    for it, fused in zip(block.iter_vars, _kinds(matmul_map)):
        if fused is not None:
            extents[fused] *= int(it.dom.extent)
    return GemmExtents(**extents)


def _kinds(matmul_map: tirx.IndexMap) -> list[str | None]:
    """The GEMM axis (``s``, ``i``, ``j``, ``k``) each block iterator is fused into."""
    kinds = []
    for var in matmul_map.initial_indices:
        used = [name for name, index in zip("sijk", matmul_map.final_indices) if var in tirx.analysis.undefined_vars(index)]
        kinds.append(used[0] if used else None)
    return kinds


def _tile_fragments(fragments: int, others: int, sm_count: int) -> int:
    """Fragments of one thread block along an axis of ``fragments`` 16-wide blocks: the largest
    of 8, 4, 2 that wastes at most 12.5% to padding (2: 50%), else 1; then halved (down to 2)
    while the grid would not give every SM a thread block (``others``: the thread blocks along the
    other axes)."""
    best = 1
    for tile in (8, 4, 2):
        padded = math.ceil(fragments / tile) * tile
        if padded <= fragments * MAX_WASTE or (tile == 2 and fragments >= 2 and padded <= fragments * 1.5):
            best = tile
            break
    while best > 2 and math.ceil(fragments / best) * others < sm_count:
        best //= 2
    return best


def get_config(gemm: GemmExtents, target: Target) -> Config:
    """The tiling of ``gemm`` on ``target``: block tiles as large as padding and the SM count
    allow (up to 64x64: 4 warps of 2x2 fragments), K steps up to 64 deep within
    :data:`SHARED_BYTES`."""
    sm_count = SM_COUNT.get(str(target.attrs.get("arch", "sm_80")), 108)
    fm_total, fn_total = math.ceil(gemm.i / TC), math.ceil(gemm.j / TC)
    block_fm = _tile_fragments(fm_total, gemm.s * math.ceil(fn_total / 8), sm_count)
    block_fn = _tile_fragments(fn_total, gemm.s * math.ceil(fm_total / block_fm), sm_count)
    while block_fm * block_fn > MAX_BLOCK_FRAGMENTS:  # the fp32 result tile fits static shared memory
        block_fm, block_fn = (block_fm // 2, block_fn) if block_fm >= block_fn else (block_fm, block_fn // 2)
    frags_m, frags_n = min(2, block_fm), min(2, block_fn)
    k_steps = math.ceil(gemm.k / TC)
    configs = [Config(block_fm // frags_m, block_fn // frags_n, frags_m, frags_n, k) for k in (4, 2, 1) if k <= max(k_steps // 2, 1)]
    return next((c for c in configs if c.shared_bytes() <= SHARED_BYTES), configs[-1])


@dataclass(frozen=True)
class Lowering:
    """The device-specific steps of the schedule: binding loops to threads, memory scopes and
    tensor-core intrinsics on CUDA; serial loops, plain buffers and the intrinsics' own TIR in
    the CPU emulation."""

    emulate: bool = False

    def bind(self, sch: s_tir.Schedule, loop, thread: str):
        if not self.emulate:
            sch.bind(loop, thread)

    def finish(self, sch: s_tir.Schedule):
        """Emulated: store the fragments (``wmma.*`` scopes, which LLVM cannot allocate) as ordinary buffers."""
        if not self.emulate:
            return
        for block in _all_blocks(sch):
            for index, region in enumerate(sch.get(block).writes):
                if region.source.scope().startswith("wmma."):
                    sch.set_scope(block, index, "global")

    def tensorize(self, sch: s_tir.Schedule, target, intrin: str):
        """Replace ``target`` (a loop or block) by ``intrin``; emulated: check that it matches
        the intrinsic's description (on a copy) and keep it as plain TIR."""
        if self.emulate:
            sch.copy().tensorize(target, intrin)
        else:
            sch.tensorize(target, intrin)


def _all_blocks(sch: s_tir.Schedule) -> list:
    blocks, stack = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while stack:
        block = stack.pop()
        blocks.append(block)
        stack.extend(sch.get_child_blocks(block))
    return blocks


def narrow_packs(sch: s_tir.Schedule, packs) -> None:
    """Store the packing stages as fp16: their values are fp16 inputs (or zeros) held in fp32, so
    the mad's operands become the tensor cores' f16 and the mad reads ``f32(pack)``."""
    for block in packs:
        sch.unsafe_set_dtype(block, 0, "float16")


def mad_gemm(sch: s_tir.Schedule, mad) -> GemmExtents | None:
    """The GEMM a mad is once re-indexed (tried on a copy of ``sch``), or None."""
    probe = sch.copy()
    probe_mad = probe.get_sblock(sch.get(mad).name_hint)
    try:
        for buffer in (("read", 0), ("read", 1), ("write", 0)):
            probe.reindex(probe_mad, buffer)
    except s_tir.ScheduleError:
        return None
    return gemm_extents(probe.get(probe_mad))


def as_gemm(sch: s_tir.Schedule, mad, config: Config) -> None:
    """Re-index ``mad`` into ``C[S, I, J] += A[S, I, K] * B[S, K, J]`` padded to whole tiles of
    ``config``. Every mad of a function is re-indexed before any is tiled (tiling inlines the
    packs they share), and after the packs are fp16 (the re-indexed copies take their dtype)."""
    reindex_a = sch.reindex(mad, ("read", 0))
    reindex_b = sch.reindex(mad, ("read", 1))
    reindex_c = sch.reindex(mad, ("write", 0))
    matmul_map, a_map, b_map, c_map = get_index_map(sch.get(mad))
    sch.transform_layout(reindex_a, ("write", 0), a_map)
    sch.transform_layout(reindex_b, ("write", 0), _k_major(b_map))
    sch.transform_layout(reindex_c, ("read", 0), c_map)
    sch.transform_block_layout(mad, matmul_map)
    sch.pad_einsum(mad, [1, config.block_m, config.block_n, config.block_k])


def _k_major(b_map: tirx.IndexMap) -> tirx.IndexMap:
    """dlight's ``B[S, J, K]`` map as ``B[S, K, J]``: ``J`` (dW's input channels, dX's ``ci0``) is
    the inputs' contiguous axis, so the copy into shared memory reads consecutive halves."""
    s, j, k = b_map.final_indices
    return tirx.IndexMap(b_map.initial_indices, [s, k, j], None)


def tensorize_gemm(sch: s_tir.Schedule, mad, config: Config, lowering: Lowering) -> None:
    """Tile a mad made a GEMM by :func:`as_gemm` onto warps and tensor cores (the module's table)."""
    batch, i, j, k = sch.get_loops(mad)
    i, i_tc = sch.split(i, [None, TC])
    j, j_tc = sch.split(j, [None, TC])
    k, k_tc = sch.split(k, [None, TC])
    sch.reorder(i, j, k, i_tc, j_tc, k_tc)
    cube = sch.blockize(i_tc)  # one 16x16x16 tensor-core operation
    i0, i1, i2 = sch.split(i, [None, config.warps_m, config.frags_m])
    j0, j1, j2 = sch.split(j, [None, config.warps_n, config.frags_n])
    k0, k1 = sch.split(k, [None, config.k_frags])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    lowering.bind(sch, batch, "blockIdx.z")
    lowering.bind(sch, sch.fuse(i0, j0), "blockIdx.x")
    warp = sch.fuse(i1, j1)
    lowering.bind(sch, warp, "threadIdx.y")

    def fetch_to_shared(index: int):
        copy = sch.cache_read(cube, index, "shared.dyn")
        sch.compute_at(copy, k0)
        fused = sch.fuse(*sch.get_loops(copy)[-2:])
        _, ty, tx, vec = sch.split(fused, [None, config.warps_m * config.warps_n, WARP, config.vector])
        lowering.bind(sch, ty, "threadIdx.y")
        lowering.bind(sch, tx, "threadIdx.x")
        sch.vectorize(vec)
        sch.storage_align(copy, 0, axis=-2, factor=16, offset=8)  # rows 8 halves apart: no bank conflicts
        auto_inline_producers(sch, copy)  # the re-index, the padding and the pack: one gather

    fetch_to_shared(0)
    fetch_to_shared(1)
    frag_a = sch.cache_read(cube, 0, "wmma.matrix_a")
    frag_b = sch.cache_read(cube, 1, "wmma.matrix_b")
    sch.compute_at(frag_a, k1)
    sch.compute_at(frag_b, k1)
    to_global = sch.cache_write(cube, 0, "shared")
    sch.storage_align(to_global, 0, -2, 16, 4)
    accumulate = sch.cache_write(cube, 0, "wmma.accumulator")
    sch.reverse_compute_at(accumulate, warp)
    sch.reverse_compute_at(to_global, warp)
    init = sch.decompose_reduction(cube, k0)

    intrins = cuda_intrinsics().get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared", in_dtype="float16", out_dtype="float32", trans_b=False)
    for block, name in ((frag_a, "load_a"), (frag_b, "load_b"), (accumulate, "store")):
        rows, cols = sch.get_loops(block)[-2:]
        r0, r1 = sch.split(rows, [None, TC])
        c0, c1 = sch.split(cols, [None, TC])
        sch.reorder(r0, c0, r1, c1)
        sch.unroll(r0)  # constant fragment indices: the fragments stay in registers
        sch.unroll(c0)
        lowering.tensorize(sch, r1, intrins[name])
    fill = sch.get_child_blocks(init)[0]
    for loop in sch.get_loops(fill)[-4:-2]:  # the warp's fragments
        sch.unroll(loop)
    lowering.tensorize(sch, sch.get_loops(fill)[-2], intrins["init"])
    lowering.tensorize(sch, sch.get_loops(mad)[-3], intrins["compute"])

    sch.unroll(i2)
    sch.unroll(j2)
    auto_inline_consumers(sch, to_global)  # the result stages, when they read this mad only
    fused = sch.fuse(*sch.get_loops(to_global)[-2:])
    if sch.get_consumers(to_global):  # a result stage reads several phases: a plain copy of the tile
        _, tx = sch.split(fused, [None, WARP])
    else:
        _, tx, vec = sch.split(fused, [None, WARP, config.vector])
        sch.vectorize(vec)
    lowering.bind(sch, tx, "threadIdx.x")
