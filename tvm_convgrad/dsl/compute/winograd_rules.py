"""When F(2x2, 3x3) is the faster way on a layer it applies to (:func:`winograd_pays`, for
``algorithm="auto"``): the thresholds, each with the measurements it rests on.

The forward and dX pay with enough tiles (:data:`WINOGRAD_MIN_TILES`) per block of weights
(:data:`WINOGRAD_TILES_PER_WEIGHTS`: every task reads the transformed weights), down to
:data:`WINOGRAD_WHOLE_TILES_PER_WEIGHTS` where the output is whole tiles; the dW with few enough
weights per tap (its sums are read and written once per chunk of tiles:
:data:`WINOGRAD_DW_MAX_WEIGHTS` and the wider AVX-512 rules); an AVX2 target's forward and dX
with enough tiles a side (:data:`WINOGRAD_NARROW_MIN_TILES`), or else enough tiles in all
(:data:`WINOGRAD_WHOLE_MIN_TILES` whole ones, :data:`WINOGRAD_NARROW_ODD_MIN_TILES` otherwise).
"""

from __future__ import annotations

from .winograd import forward_shape, input_grad_shape

__all__ = ["WINOGRAD_DW_MAX_WEIGHTS", "WINOGRAD_DW_TILES_PER_WEIGHTS", "WINOGRAD_DW_WIDE_MAX_WEIGHTS",
           "WINOGRAD_DW_WIDEST_MAX_WEIGHTS", "WINOGRAD_DW_WIDEST_MIN_TILES", "WINOGRAD_MIN_CHANNELS", "WINOGRAD_MIN_TILES",
           "WINOGRAD_NARROW_MIN_TILES", "WINOGRAD_NARROW_ODD_MIN_TILES", "WINOGRAD_TILES_PER_WEIGHTS", "WINOGRAD_WHOLE_MIN_TILES",
           "WINOGRAD_WHOLE_TILES_PER_WEIGHTS", "PAIRED_DW_MAX_WEIGHTS", "PAIRED_TILES_PER_WEIGHTS", "paired_winograd_pays", "winograd_pays"]

WINOGRAD_MIN_CHANNELS = 64
"""Fewest input and output channels a layer takes Winograd at by choice (``algorithm="auto"``):
with fewer, the transforms cost as much as the multiplies they save."""

WINOGRAD_MIN_TILES = 64
"""Fewest 2x2 tiles (all images) a layer takes Winograd at by choice: with fewer, its tasks do not
fill the cores."""

WINOGRAD_DW_MAX_WEIGHTS = 96 * 96
"""Most weights per tap (Cin x Cout) a weight gradient takes Winograd at by choice on a target whose
16-lane rows take several registers (AVX2; AVX-512: :data:`WINOGRAD_DW_WIDE_MAX_WEIGHTS`): each core's
sums of the transformed products (16 x Cin x Cout floats) are read and written once per chunk of
tiles. Zen 4, against the direct dW (before ``wino_v`` / ``wino_d`` were laid out position by
position): 64 -> 64 on 56x56 N=8 1.2-1.8x, 128 -> 128 on 28x28 0.9-1.2x, 256 -> 256 on 14x14 0.7-1.0x."""

WINOGRAD_DW_WIDE_MAX_WEIGHTS = 128 * 128
"""... on a target whose 16-lane rows are one register (AVX-512), with ``wino_v`` / ``wino_d`` laid
out position by position; past :data:`WINOGRAD_DW_MAX_WEIGHTS`, with at least
:data:`WINOGRAD_DW_TILES_PER_WEIGHTS` tiles per 64 x 64 block of weights. An Emerald Rapids
(2 cores), against the direct dW, NCHW / NHWC: 128 -> 128 on 28x28 N=8 (392 tiles per block) 1.20 / 1.23x, 14x14 N=32 (392) 1.24 / 1.24x, 16x16 N=8 (128)
1.36 / 1.22x, 8x8 N=32 (128) 1.34 / 1.18x, 14x14 N=8 (98) 1.10 / 0.97x, 8x8 N=8 (32) 0.97 /
0.76x; 256 -> 256 on 14x14 N=8 (24.5) 1.07 / 0.92x, 7x7 N=32 (32) 0.72 / 0.65x."""

WINOGRAD_DW_TILES_PER_WEIGHTS = 96
"""Fewest tiles per 64 x 64 block of weights an AVX-512 dW of more than :data:`WINOGRAD_DW_MAX_WEIGHTS`
weights per tap takes Winograd at by choice (see :data:`WINOGRAD_DW_WIDE_MAX_WEIGHTS`)."""

WINOGRAD_DW_WIDEST_MAX_WEIGHTS = 256 * 256
"""Past :data:`WINOGRAD_DW_WIDE_MAX_WEIGHTS`, the most weights per tap an AVX-512 dW takes Winograd
at by choice: where its output is whole 2x2 tiles (even rows and columns) and it has at least
:data:`WINOGRAD_DW_WIDEST_MIN_TILES` of them. The Emerald Rapids guest (2 cores, 2026-12-02),
against the direct dW, NCHW / NHWC, each two to four runs: 256 -> 256 on 14x14 N=8 (392 tiles)
1.00-1.42 / 1.16-1.22x, N=16 (784) 1.47 / 1.49x, 28x28 N=8 1.09 / 1.51x, 28x28 N=2 (392) 1.30x;
fewer tiles or a partial row of them stay the cube: 14x14 N=4 (196) 0.79-0.97 / 0.93-1.00x, 7x7
N=32 (512 tiles, 4 x 4 of them covering 8x8) 0.72 / 0.65x (earlier); 512 -> 512 on 14x14 N=8 was
mixed (1.11-1.24 / 0.90-1.13x) and stays."""

WINOGRAD_DW_WIDEST_MIN_TILES = 384
"""Fewest 2x2 tiles (all images) for :data:`WINOGRAD_DW_WIDEST_MAX_WEIGHTS`."""

WINOGRAD_TILES_PER_WEIGHTS = 8
"""... and fewest tiles per 64 x 64 block of weights: the weights' transform and every task's read
of it (16 MB for 512 x 512) outweigh the multiplies saved on few tiles. Zen 4, the forward against
the direct kernel: 256 -> 256 on 14x14 N=4 (12 tiles per block) 1.1-1.4x, N=1 (3) 0.7-0.9x; 512 ->
512 on 7x7 N=8 (2) 0.55x; 128 -> 128 on 8x8 N=8 (32) 1.1-1.3x. The same holds on a core of two
full-width FMA pipes (an Emerald Rapids, 2 cores, forward / dX NCHW, with the weights' transform
in registers and :func:`~tvm_convgrad.schedule.cpu.winograd.task_bytes`): 256 -> 256 on 14x14 N=4
(12) 1.30 / 1.30x, N=8 (24.5) 1.36 / 1.56x, 7x7 N=32 (32) 1.20 / 1.24x; 512 -> 512 on 7x7 N=8 (2)
0.96 / 1.00x; 128 -> 128 on 8x8 N=8 (32) 1.54 / 1.52x."""

WINOGRAD_WHOLE_MIN_TILES = 128
"""Fewest 2x2 tiles for a forward or dX whose output is whole tiles (even rows and columns: no
partial tile computed and cut) to take Winograd with as few as :data:`WINOGRAD_WHOLE_TILES_PER_WEIGHTS` tiles per 64 x 64 block of
weights. The Emerald Rapids guest (2 cores, 2026-12-02), 512 -> 512 against the cube, forward / dX,
NCHW then NHWC (each the median of two processes): 8x8 N=8 (128 tiles, 2 per block) 1.66 / 1.81x and 2.08 / 2.05x;
4x4 N=32 (128, ResNet-18's last stage at 112x112) 1.21 / 1.24x and 1.30 / 1.47x. Fewer tiles stay
the cube: 8x8 N=4 (64) 1.10 / 1.16x and 1.36 / 1.34x, 4x4 N=16 (64) 0.81 / 0.86x and 1.01 /
0.93x, 14x14 N=2 (98) 1.01 / 1.16x and 1.01 / 1.02x, 4x4 N=8 (32) 0.59 / 0.65x and 1.12 / 0.99x;
an odd output (7x7, its last tiles half cut) also stays (see :data:`WINOGRAD_TILES_PER_WEIGHTS`).
AVX2 on Zen 3 alike: :data:`WINOGRAD_NARROW_ODD_MIN_TILES`."""

WINOGRAD_WHOLE_TILES_PER_WEIGHTS = 2
"""Fewest tiles per 64 x 64 block of weights under :data:`WINOGRAD_WHOLE_MIN_TILES`."""

WINOGRAD_NARROW_MIN_TILES = 6
"""On a target whose 16-lane rows take two registers or more (AVX2), fewest 2x2 tiles a side of a
forward's or dX's output taking Winograd by choice on any number of tiles from
:data:`WINOGRAD_MIN_TILES`: its tiles' transforms cost more per multiply saved on a narrow map.
Zen 3 (AVX2), against the direct kernel, dX / forward (2026-11-27): 12x12 256 N=8 1.40 / 1.50x;
14x14 (7) 128 N=8 1.08x, N=32 1.28 / 1.33x, 256 N=8 1.17 / 1.06x, N=4 0.94x; 16x16 256 N=8 1.22x;
28x28 and 56x56 1.5-1.9x. Fewer tiles a side: :data:`WINOGRAD_WHOLE_MIN_TILES`,
:data:`WINOGRAD_NARROW_ODD_MIN_TILES`."""

WINOGRAD_NARROW_ODD_MIN_TILES = 512
"""On an AVX2 target, fewest 2x2 tiles for a forward or dX of fewer than
:data:`WINOGRAD_NARROW_MIN_TILES` tiles a side whose output is not whole tiles (a 7x7 map: its last
row and column of tiles half cut); with whole tiles :data:`WINOGRAD_WHOLE_MIN_TILES` suffice. The
same Zen 3 (2 cores, 2026-12-02, after the transforms in registers and the position-major
layouts), forward / dX against the cube, each the median of 7 alternating calls, NCHW then NHWC:
whole tiles, 8x8 N=8 at 64, 128, 256 and 512 channels 1.23 / 1.68x, 1.03-1.27 / 1.36-1.41x and
1.12 / 1.27x, 1.29 / 1.16x, 1.12 / 1.22x and 1.07 / 1.23x; 4x4 N=32 at 256 and 512 channels 1.40 /
1.27x and 1.06 / 1.48x, 1.20 / 1.27x and 1.04 / 1.33x. An odd output, 7x7 N=32 (512 tiles): 128
channels 1.23 / 1.18x, 256 1.01-1.27 / 1.14-1.31x and 1.18 / 1.09x, 512 1.02 / 1.17x; 7x7 N=8
(128 tiles) stays the cube: 256 channels 1.02 / 0.91x and 0.66 / 1.06x, 512 0.77 / 0.89x."""


def winograd_pays(geom, input_grad: bool = False, filter_grad: bool = False, narrow: bool = False, planar: bool = False) -> bool:
    """Whether F(2x2, 3x3) is the faster of the two on a layer it applies to: at least
    :data:`WINOGRAD_MIN_CHANNELS` channels each side, :data:`WINOGRAD_MIN_TILES` tiles, and
    :data:`WINOGRAD_TILES_PER_WEIGHTS` tiles per 64 x 64 block of weights (every task reads the
    transformed weights, 16 / 9 of the weights' size; a forward or dX of at least
    :data:`WINOGRAD_WHOLE_MIN_TILES` whole tiles: :data:`WINOGRAD_WHOLE_TILES_PER_WEIGHTS`); the
    weight gradient (``filter_grad``) at most :data:`WINOGRAD_DW_MAX_WEIGHTS` weights per tap (AVX-512: :data:`WINOGRAD_DW_WIDE_MAX_WEIGHTS`
    and :data:`WINOGRAD_DW_TILES_PER_WEIGHTS`, or up to :data:`WINOGRAD_DW_WIDEST_MAX_WEIGHTS` on
    :data:`WINOGRAD_DW_WIDEST_MIN_TILES` whole tiles); the forward and dX for a target whose
    16-lane rows take several registers (``narrow``: AVX2) at least
    :data:`WINOGRAD_NARROW_MIN_TILES` tiles a side, or :data:`WINOGRAD_WHOLE_MIN_TILES` whole
    tiles, or :data:`WINOGRAD_NARROW_ODD_MIN_TILES` tiles; there the dW over channel-planar (``planar``:
    NCX) activations keeps the cube (its transforms gather each vector from 16 planes; Zen 3, 64
    channels: 56x56 N=8 0.87x the direct kernel, 28x28 N=32 0.91x, 16x16 N=8 0.86x; over NXC
    activations 1.13x, 1.15x, 1.03x)."""
    shape = input_grad_shape(geom) if input_grad else forward_shape(geom)
    th, tw = shape.tiles
    tiles = shape.n * th * tw
    weight_blocks = geom.cin * geom.cout / (64 * 64)
    widest = filter_grad and not narrow and geom.cin * geom.cout > WINOGRAD_DW_WIDE_MAX_WEIGHTS
    whole = shape.ho % 2 == 0 and shape.wo % 2 == 0
    if widest and not (geom.cin * geom.cout <= WINOGRAD_DW_WIDEST_MAX_WEIGHTS and whole and tiles >= WINOGRAD_DW_WIDEST_MIN_TILES):
        return False
    if filter_grad and narrow and geom.cin * geom.cout > WINOGRAD_DW_MAX_WEIGHTS:
        return False
    if filter_grad and not widest and geom.cin * geom.cout > WINOGRAD_DW_MAX_WEIGHTS and tiles < WINOGRAD_DW_TILES_PER_WEIGHTS * weight_blocks:
        return False
    many_whole = whole and tiles >= WINOGRAD_WHOLE_MIN_TILES
    few_a_side = min(th, tw) < WINOGRAD_NARROW_MIN_TILES
    if narrow and not filter_grad and few_a_side and not (many_whole or tiles >= WINOGRAD_NARROW_ODD_MIN_TILES):
        return False
    if narrow and filter_grad and planar:
        return False
    per_weights = WINOGRAD_WHOLE_TILES_PER_WEIGHTS if many_whole and not filter_grad else WINOGRAD_TILES_PER_WEIGHTS
    return min(geom.cin, geom.cout) >= WINOGRAD_MIN_CHANNELS and tiles >= max(WINOGRAD_MIN_TILES, per_weights * weight_blocks)


PAIRED_TILES_PER_WEIGHTS = 12
"""Fewest 2x2 tiles per 64 x 64 block of weights a bf16 forward or dX takes F(2x2, 3x3) on bf16
pairs at by choice (:func:`paired_winograd_pays`): the GEMMs run at the pairs' rate, twice the fp32
FMA's, so the transforms and every task's read of the transformed weights weigh twice what they
weigh in fp32 (:data:`WINOGRAD_TILES_PER_WEIGHTS`). Zen 4 (2 cores, 2026-12-03), against the
bf16-pair cube, dX / forward, NCHW and NHWC (``layers/dec03g-pairs.txt``): 64 -> 64 on 28x28 N=32
(6,272 tiles a block) 1.14-1.44x / 1.53-1.99x, 128 on 14x14 N=32 (392) 1.65-1.75x / 1.56-1.87x,
128 on 8x8 N=8 (32) 1.31-1.37x / 1.53-1.95x, 256 on 7x7 N=32 (32) 1.36-1.38x / 1.30-1.33x, N=16
(16) 1.10-1.11x / 1.08-2.26x, 256 on 14x14 N=4 (12.25) 1.51-2.43x / 1.27-1.51x; below, the cube:
256 on 14x14 N=2 (6.1) 1.17-1.21x / 0.68-1.23x, 256 on 7x7 N=8 (8) 0.57-1.19x / 0.53-0.78x, 512
on 4x4 N=32 (2) 0.67-0.71x / 0.81-1.10x, N=8 (0.5) 0.51-0.71x / 0.32-0.53x."""


PAIRED_DW_MAX_WEIGHTS = 128 * 128
"""Most weights per tap (Cin x Cout) a bf16 dW takes F(2x2, 3x3) on bf16 pairs of tiles at by choice
(where :func:`winograd_pays` takes the fp32 one): each core's sums of the transformed products
(16 x Cin x Cout floats) are read and written once per chunk, which weighs twice as much against
GEMMs at the pairs' rate. Zen 4 (2 cores, 2026-12-04), against the bf16-pair cube, NCHW / NHWC, two
calls of each in turn: 64 -> 64 on 28x28 N=32 1.33-1.51 / 1.51-1.76x, 64 on 56x56 N=8 1.23-1.37 /
1.49-1.60x, 64 on 32x32 N=8 1.36 / 1.38-1.46x, 64 on 16x16 N=8 1.09-1.22 / 1.15-1.38x, 128 on
14x14 N=32 1.28-1.37 / 1.37x, 128 on 28x28 N=8 1.19-1.43 / 1.47-2.17x; past it the cube: 256 on
14x14 N=16 1.09-1.14 / 1.08-1.10x, N=8 0.72-0.83 / 0.80-0.84x, N=4 1.01-1.10 / 0.90-0.94x, 256 on
7x7 N=32 0.94-1.16 / 0.74-0.75x, 512 on 7x7 N=8 0.32-0.56 / 0.39-0.41x, 512 on 4x4 N=32 0.31-0.54 /
0.58-0.60x."""


def paired_winograd_pays(geom, input_grad: bool = False, filter_grad: bool = False) -> bool:
    """Whether F(2x2, 3x3) on bf16 pairs (``vdpbf16ps``) is the faster way of a bf16 forward or dX
    (``input_grad``) it applies to, against the direct bf16-pair cube: where :func:`winograd_pays`
    (on AVX-512) and with :data:`PAIRED_TILES_PER_WEIGHTS` tiles per block of weights; of a bf16 dW
    (``filter_grad``): where :func:`winograd_pays` and up to :data:`PAIRED_DW_MAX_WEIGHTS` weights per tap."""
    if filter_grad:
        return geom.cin * geom.cout <= PAIRED_DW_MAX_WEIGHTS and winograd_pays(geom, filter_grad=True)
    shape = input_grad_shape(geom) if input_grad else forward_shape(geom)
    th, tw = shape.tiles
    blocks = geom.cin * geom.cout / (64 * 64)
    return winograd_pays(geom, input_grad) and shape.n * th * tw >= PAIRED_TILES_PER_WEIGHTS * blocks
