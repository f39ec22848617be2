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
its results are never stored. Where a thread block runs several K steps, the operand tiles are
double-buffered (``Config.double_buffer``: TVM's software pipeline on the K-step loop, the copies
of step ``k + 1`` in stage 1 beside the mma of step ``k``). When the output is too small to give
every SM a thread block and K is long (``Config.split_k``), K is cut into slices: ``rfactor``
makes the GEMM a batch of partial GEMMs, one slice each (the slice fused into ``blockIdx.z``),
and the sum of the slices is left to a SIMT stage (:mod:`.simt`), which also writes the result
stages.

**Emulation** (:class:`Lowering`, ``emulate=True``): the same schedule with the thread bindings
left as serial loops and each tensor-core block left as the plain TIR the intrinsic stands for —
that each block matches the intrinsic's registered description is checked by tensorizing it on a
copy of the schedule — and the fragments stored as ordinary buffers (shared memory stays: LLVM
allocates it like any other buffer), so that LLVM builds and runs the CUDA schedule's tiling,
staging, padding and fragment layout on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumers, auto_inline_producers, get_index_map
from tvm.target import Target

from .intrinsics import cuda_intrinsics

__all__ = ["Config", "GemmExtents", "Lowering", "MAX_FRAGS", "MAX_K_FRAGS", "TC", "WARP", "as_gemm", "gemm_extents", "get_config", "mad_gemm", "narrow_packs", "sm_count", "tensorize_gemm"]

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
    ``vector`` halves per thread per copy instruction. ``I`` and ``J`` are padded to whole
    ``pad_frags_m`` / ``pad_frags_n`` fragments (a multiple of the block's): the largest tile the
    padding allows, which the thread blocks split when the grid would not fill the GPU (and which
    bounds the block tiles a tuning run samples). ``split_k`` > 1: K is cut into as many slices,
    each summed by its own thread blocks, for outputs too small to fill the GPU (dW of early
    layers: a 64x64 output, K = ``N*Ho*Wo``)."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    k_frags: int
    pad_frags_m: int = 0  # 0: the block's own fragments
    pad_frags_n: int = 0
    split_k: int = 1  # thread blocks along K (each sums a slice; a second stage adds the slices)
    double_buffer: bool = False  # the next K step's operand tiles loaded while this one's are used
    vector: int = 2  # 4 halves: small ptxas spills in strided dX phases; 8: TVM emits an invalid make_ulonglong4

    def __post_init__(self):
        for axis in "mn":
            block, pad = getattr(self, f"block_f{axis}"), getattr(self, f"pad_frags_{axis}")
            if pad == 0:
                object.__setattr__(self, f"pad_frags_{axis}", block)
            elif pad % block:
                raise ValueError(f"pad_frags_{axis}={pad} is not a multiple of the block's {block} fragments")

    @property
    def block_fm(self) -> int:
        return self.warps_m * self.frags_m

    @property
    def block_fn(self) -> int:
        return self.warps_n * self.frags_n

    @property
    def block_m(self) -> int:
        return TC * self.block_fm

    @property
    def block_n(self) -> int:
        return TC * self.block_fn

    @property
    def block_k(self) -> int:
        return TC * self.k_frags

    @property
    def threads(self) -> int:
        return WARP * self.warps_m * self.warps_n

    def shared_bytes(self) -> int:
        """Shared memory of one thread block: the fp16 operand tiles (rows padded by 8 halves; two
        of each when double-buffered) and the fp32 result tile."""
        operands = (self.block_m + self.block_n) * (self.block_k + 8) * 2 * (2 if self.double_buffer else 1)
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


def _padding_tile(fragments: int) -> int:
    """The fragments an axis of ``fragments`` 16-wide blocks is padded to a multiple of: the
    largest of 8, 4, 2 that wastes at most 12.5% (2: 50%), else 1."""
    for tile in (8, 4, 2):
        padded = math.ceil(fragments / tile) * tile
        if padded <= fragments * MAX_WASTE or (tile == 2 and fragments >= 2 and padded <= fragments * 1.5):
            return tile
    return 1


def _fill_the_sms(tile: int, fragments: int, others: int, sm_count: int) -> int:
    """The block's fragments within a padding ``tile``: halved (down to 2) while the grid would not
    give every SM a thread block (``others``: the thread blocks along the other axes)."""
    while tile > 2 and math.ceil(fragments / tile) * others < sm_count:
        tile //= 2
    return tile


def sm_count(target: Target) -> int:
    """The streaming multiprocessors a grid for ``target`` should fill (:data:`SM_COUNT`)."""
    return SM_COUNT.get(str(target.attrs.get("arch", "sm_80")), 108)


def get_config(gemm: GemmExtents, target: Target) -> Config:
    """The tiling of ``gemm`` on ``target``: block tiles as large as padding and the SM count
    allow (up to :data:`MAX_BLOCK_FRAGMENTS`: 64x64, 4 warps of 2x2 fragments), K steps up to 64
    deep within :data:`SHARED_BYTES`, K split when the grid would leave SMs idle, and the operand
    tiles double-buffered where a thread block runs several K steps and shared memory allows."""
    sms = sm_count(target)
    fm_total, fn_total = math.ceil(gemm.i / TC), math.ceil(gemm.j / TC)
    pad_m, pad_n = _padding_tile(fm_total), _padding_tile(fn_total)
    while pad_m * pad_n > MAX_BLOCK_FRAGMENTS:  # the fp32 result tile fits static shared memory
        pad_m, pad_n = (pad_m // 2, pad_n) if pad_m >= pad_n else (pad_m, pad_n // 2)
    block_fm = _fill_the_sms(pad_m, fm_total, gemm.s * math.ceil(fn_total / pad_n), sms)
    block_fn = _fill_the_sms(pad_n, fn_total, gemm.s * math.ceil(fm_total / block_fm), sms)
    frags_m, frags_n = min(2, block_fm), min(2, block_fn)
    k_steps = math.ceil(gemm.k / TC)
    configs = [Config(block_fm // frags_m, block_fn // frags_n, frags_m, frags_n, k, pad_m, pad_n)
               for k in (4, 2, 1) if k <= max(k_steps // 2, 1)]  # fmt: skip
    config = next((c for c in configs if c.shared_bytes() <= SHARED_BYTES), configs[-1])
    blocks = gemm.s * math.ceil(fm_total / block_fm) * math.ceil(fn_total / block_fn)
    config = replace(config, split_k=_split_k(blocks, k_steps, config.k_frags, sms))
    double = replace(config, double_buffer=True)
    if k_steps // (config.k_frags * config.split_k) >= MIN_PIPELINED_STEPS and double.shared_bytes() <= SHARED_BYTES:
        return double
    return config


MIN_PIPELINED_STEPS = 4
"""K steps a thread block runs at least for its operand tiles to be double-buffered."""


MIN_SPLIT_STEPS = 4
"""K steps (of ``k_frags`` fragments) a slice of a split K runs at least."""


def _split_k(blocks: int, k_steps: int, k_frags: int, sm_count: int) -> int:
    """Slices of K that bring a grid of ``blocks`` thread blocks up to the SM count: as many as
    fill the SMs, each at least :data:`MIN_SPLIT_STEPS` K steps, padding K at most 12.5%."""
    most = min(math.ceil(sm_count / blocks), k_steps // (k_frags * MIN_SPLIT_STEPS))
    for split in range(most, 1, -1):
        if math.ceil(k_steps / (k_frags * split)) * k_frags * split <= k_steps * MAX_WASTE:
            return split
    return 1


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


def _extent(sch: s_tir.Schedule, loop) -> int:
    return int(sch.get(loop).extent)


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


def tensorize_gemm(sch: s_tir.Schedule, mad, config: Config, lowering: Lowering, tunable: bool = False) -> list[str]:
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
    k_steps = _extent(sch, k)
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
    auto_inline_consumers(sch, to_global)  # the result stages, when they read this mad only
    fused = sch.fuse(*sch.get_loops(to_global)[-2:])
    if sch.get_consumers(to_global):  # a result stage reads several phases: a plain copy of the tile
        _, tx = sch.split(fused, [None, WARP])
    else:
        _, tx, vec = sch.split(fused, [None, WARP, config.vector])
        sch.vectorize(vec)
    lowering.bind(sch, tx, "threadIdx.x")
    return left


def _inline_up_to_the_output(sch: s_tir.Schedule, block) -> None:
    """Inline the stages between ``block`` and the stage that writes the output (re-indexing,
    padding removal), so that the output stage reads ``block`` directly."""
    while len(consumers := sch.get_consumers(block)) == 1 and sch.get_consumers(consumers[0]):
        try:
            sch.compute_inline(consumers[0])
        except s_tir.ScheduleError:
            return
