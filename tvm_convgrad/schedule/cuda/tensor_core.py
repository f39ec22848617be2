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

The GEMM's tiles come from :func:`.gemm.gemm_config`. The schedule of one GEMM (a thread block computes a ``block_m x block_n`` tile of one ``S``):

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
its results are never stored. Where a thread block runs several K steps, the operand tiles are
double-buffered (``Config.double_buffer``: TVM's software pipeline on the K-step loop, the copies
of step ``k + 1`` in stage 1 beside the mma of step ``k``). When the output is too small to give
every SM a thread block and K is long (``Config.split_k``), K is cut into slices: ``rfactor``
makes the GEMM a batch of partial GEMMs, one slice each (the slice fused into ``blockIdx.z``),
and the sum of the slices is left to a SIMT stage (:mod:`.simt`), which also writes the result
stages.

**Emulation** (:class:`.lowering.Lowering`, ``emulate=True``): the same schedule with the thread bindings
left as serial loops and each tensor-core block left as the plain TIR the intrinsic stands for —
that each block matches the intrinsic's registered description is checked by tensorizing it on a
copy of the schedule — and the fragments stored as ordinary buffers (shared memory stays: LLVM
allocates it like any other buffer), so that LLVM builds and runs the CUDA schedule's tiling,
staging, padding and fragment layout on a CPU.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers, get_index_map

from ..common import covers, loop_extent
from .gemm import TC, WARP, GemmConfig, GemmExtents, gemm_extents
from .intrinsics import cuda_intrinsics
from .lowering import Lowering

__all__ = ["MAX_FRAGS", "MAX_K_FRAGS", "as_gemm", "mad_gemm", "narrow_packs", "tensorize_gemm"]


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


def as_gemm(sch: s_tir.Schedule, mad, config: GemmConfig) -> None:
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
    sch.pad_einsum(mad, [1, TC * config.pad_frags_m, TC * config.pad_frags_n, config.block_k * config.split_k])


def _k_major(b_map: tirx.IndexMap) -> tirx.IndexMap:
    """dlight's ``B[S, J, K]`` map as ``B[S, K, J]``: ``J`` (dW's input channels, dX's ``ci0``) is
    the inputs' contiguous axis, so the copy into shared memory reads consecutive halves."""
    s, j, k = b_map.final_indices
    return tirx.IndexMap(b_map.initial_indices, [s, k, j], None)


MAX_FRAGS = 2  # accumulators per warp along each axis: 2x2 x 8 registers per thread
MAX_K_FRAGS = 4  # 16-deep steps per shared-memory stage


def _tile(sch: s_tir.Schedule, loop, factors: list[int], max_inner: int, tunable: bool) -> tuple[list, list]:
    """Split ``loop`` (extent ``prod(factors)``) by ``factors``, or, ``tunable``, by a MetaSchedule
    sample (``sample_perfect_tile``: any factors of the extent, the innermost at most
    ``max_inner``) whose default decision is ``factors``. Returns the loops and the factors (ints
    or the sample's variables)."""
    if tunable:
        factors = list(sch.sample_perfect_tile(loop, n=len(factors), max_innermost_factor=max_inner, decision=factors))
        return list(sch.split(loop, factors)), factors
    return list(sch.split(loop, [None, *factors[1:]])), factors


def tensorize_gemm(sch: s_tir.Schedule, mad, config: GemmConfig, lowering: Lowering, tunable: bool = False) -> list[str]:
    """Tile a mad made a GEMM by :func:`as_gemm` onto warps and tensor cores (the module's table).
    ``tunable``: the thread blocks' and warps' tiles within ``config``'s padding tile and the K
    step are MetaSchedule samples, ``config`` their default. Returns the stages left for SIMT
    threads: with ``split_k``, the sum of the K slices' partial results (the result stages
    between it and the output inlined)."""
    batch, i, j, k = sch.get_loops(mad)
    left = []
    if config.split_k > 1:  # each thread block sums one K slice into a partial result ...
        k_slice, k = sch.split(k, [config.split_k, None])
        mad, total = sch.rfactor(k_slice, factor_axis=0), mad
        left = [sch.get(total).name_hint]  # ... which a SIMT stage adds up
        _inline_up_to_the_output(sch, total)
        batch, i, j, k_slice, k = sch.get_loops(mad)
        sch.reorder(k_slice, batch, i, j, k)
        batch = sch.fuse(k_slice, batch)
    i, i_tc = sch.split(i, [None, TC])
    j, j_tc = sch.split(j, [None, TC])
    k, k_tc = sch.split(k, [None, TC])
    sch.reorder(i, j, k, i_tc, j_tc, k_tc)
    cube = sch.blockize(i_tc)  # one 16x16x16 tensor-core operation
    i_pad, i = sch.split(i, [None, config.pad_frags_m])
    j_pad, j = sch.split(j, [None, config.pad_frags_n])
    (i0, i1, i2), (_, warps_m, _) = _tile(sch, i, [config.pad_frags_m // config.block_fm, config.warps_m, config.frags_m], MAX_FRAGS, tunable)
    (j0, j1, j2), (_, warps_n, _) = _tile(sch, j, [config.pad_frags_n // config.block_fn, config.warps_n, config.frags_n], MAX_FRAGS, tunable)
    k_steps = loop_extent(sch, k)
    (k0, k1), _ = _tile(sch, k, [k_steps // config.k_frags, config.k_frags], MAX_K_FRAGS, tunable)
    sch.reorder(i_pad, i0, j_pad, j0, i1, j1, k0, k1, i2, j2)
    lowering.bind(sch, batch, "blockIdx.z")
    lowering.bind(sch, sch.fuse(i_pad, i0, j_pad, j0), "blockIdx.x")
    warp = sch.fuse(i1, j1)
    lowering.bind(sch, warp, "threadIdx.y")

    def fetch_to_shared(index: int):
        copy = sch.cache_read(cube, index, "shared.dyn")
        sch.compute_at(copy, k0)
        fused = sch.fuse(*sch.get_loops(copy)[-2:])
        _, ty_m, ty_n, tx, vec = sch.split(fused, [None, warps_m, warps_n, WARP, config.vector])
        lowering.bind(sch, sch.fuse(ty_m, ty_n), "threadIdx.y")
        lowering.bind(sch, tx, "threadIdx.x")
        sch.vectorize(vec)
        sch.storage_align(copy, 0, axis=-2, factor=16, offset=8)  # rows 8 halves apart: no bank conflicts
        auto_inline_producers(sch, copy)  # the re-index, the padding and the pack: one gather

    fetch_to_shared(0)
    fetch_to_shared(1)
    if config.double_buffer:  # the copies of step k0 + 1 (stage 1) beside the mma of step k0
        sch.annotate(k0, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(k0, "software_pipeline_order", [0, 1, 2])
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
    _inline_result_stages(sch, to_global)
    fused = sch.fuse(*sch.get_loops(to_global)[-2:])
    if sch.get_consumers(to_global):  # a result stage reads several phases: a plain copy of the tile
        _, tx = sch.split(fused, [None, WARP])
    else:
        _, tx, vec = sch.split(fused, [None, WARP, config.vector])
        sch.vectorize(vec)
    lowering.bind(sch, tx, "threadIdx.x")
    return left


def _inline_result_stages(sch: s_tir.Schedule, to_global) -> None:
    """Inline the result stages (a cast, a layout) into the copy of the tile to global memory, when
    they read this mad only (dlight's ``auto_inline_consumers``) and write no element the GEMM has
    no point for (:func:`~..common.covers`: the zeros of a stride phase without taps, of channel
    pads); those stay a SIMT kernel of their own."""
    failed = (s_tir.ScheduleError, tvm.error.InternalError)  # (TVM 0.27 fails some layouts' index analysis internally)
    while True:
        inlined = 0
        for consumer in sch.get_consumers(to_global):
            try:
                sch.compute_inline(consumer)
                inlined += 1
            except failed:
                if not covers(sch, to_global, consumer):
                    continue
                try:
                    sch.reverse_compute_inline(consumer)
                    inlined += 1
                except failed:
                    continue
        if not inlined:
            return


def _inline_up_to_the_output(sch: s_tir.Schedule, block) -> None:
    """Inline the stages between ``block`` and the stage that writes the output (re-indexing,
    padding removal), so that the output stage reads ``block`` directly."""
    while len(consumers := sch.get_consumers(block)) == 1 and sch.get_consumers(consumers[0]):
        try:
            sch.compute_inline(consumers[0])
        except s_tir.ScheduleError:
            return

