"""The tiling of one gradient GEMM on tensor cores: its extents, and the thread-block, warp and K
tiles, split K and double buffering the CUDA rule picks for it from the problem size and the
GPU's SM count (:func:`gemm_config`).

A mad is ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` once re-indexed (see :mod:`.tensor_core`); its
extents decide the tiles: thread-block tiles of up to 64x64 from 2x2 fragments per warp, padding
to whole tiles at most 12.5%, a thread block per SM where the output allows, K steps up to 64 deep
within :data:`SHARED_BYTES`, K split when the grid would leave SMs idle, the operand tiles
double-buffered where a thread block runs several K steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tvm import tirx
from tvm.s_tir.dlight.gpu.matmul import get_index_map

__all__ = [
    "MAX_BLOCK_FRAGMENTS", "MIN_PIPELINED_STEPS", "MIN_SPLIT_STEPS", "SHARED_BYTES", "SM_COUNT", "TC", "WARP", "GemmConfig",
    "GemmExtents", "gemm_config", "gemm_extents",
]  # fmt: skip

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
class GemmConfig:
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



def gemm_config(gemm: GemmExtents, sms: int) -> GemmConfig:
    """The tiling of ``gemm`` on a GPU of ``sms`` SMs: block tiles as large as padding and the SM
    count allow (up to :data:`MAX_BLOCK_FRAGMENTS`: 64x64, 4 warps of 2x2 fragments), K steps up to
    64 deep within :data:`SHARED_BYTES`, K split when the grid would leave SMs idle, and the operand
    tiles double-buffered where a thread block runs several K steps and shared memory allows."""
    fm_total, fn_total = math.ceil(gemm.i / TC), math.ceil(gemm.j / TC)
    pad_m, pad_n = _padding_tile(fm_total), _padding_tile(fn_total)
    while pad_m * pad_n > MAX_BLOCK_FRAGMENTS:  # the fp32 result tile fits static shared memory
        pad_m, pad_n = (pad_m // 2, pad_n) if pad_m >= pad_n else (pad_m, pad_n // 2)
    block_fm = _fill_the_sms(pad_m, fm_total, gemm.s * math.ceil(fn_total / pad_n), sms)
    block_fn = _fill_the_sms(pad_n, fn_total, gemm.s * math.ceil(fm_total / block_fm), sms)
    frags_m, frags_n = min(2, block_fm), min(2, block_fn)
    k_steps = math.ceil(gemm.k / TC)
    configs = [GemmConfig(block_fm // frags_m, block_fn // frags_n, frags_m, frags_n, k, pad_m, pad_n)
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

