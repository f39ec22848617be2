"""Both gradients of a channels-last fp32 1x1 layer in one pass over dy, written as TIR.

A 1x1 layer at stride 1 without padding is two GEMMs over its ``M = N * H * W`` pixels: dX ``(M, C)
= dy (M, O) . w (O, C)`` and dW ``(O, C) = dy^T . x (M, C)``. The package's dX and dW kernels each
read dy; in a training step it comes from memory both times (MobileNetV2's 16 -> 96 expand layer at
32 x 56x56: dy 38.5 MB, x and dX 6.4 MB each). This kernel runs the two on the same pixels in turn:
a task is a chunk of :func:`chunk_pixels` pixels; its dW is added into the core's sums, then its dX
written, reading the chunk's dy rows from cache.

Loops are written out here (``tvm.script.ir_builder``), as in :mod:`.depthwise_backward`. Input
channels are on the vector lanes (:attr:`PointwiseBackward.vector_lanes`: the ISA's, or fewer
where ``C`` is not a multiple of them), each a contiguous run of NHWC memory; no pack, no pad.

* dW: a register tile of ``rows`` output channels x ``vectors`` vectors of input channels, summed
  over the chunk's pixels (``dy`` broadcast, ``x`` loaded), then added into the core's sums.
* dX: a register tile of ``pixels`` x ``vectors`` vectors, summed over the output channels (``dy``
  broadcast, ``w`` loaded); a chunk's vector groups outermost, so that a group's rows of ``w``
  stay in cache while the chunk's pixels run (a 1280 x 320 weight is 1.6 MB).
* Where dy or x is a stream (:func:`stream_ahead`), dW's steps ask for the runs they read of the
  pixel a chunk further on (each run once: dy's in the first vector group, x's in the first rows),
  into L2 (:mod:`.prefetch`): the chunks follow one another in memory, the hardware prefetchers do
  not run that far ahead of 6-14 strided runs. A Sapphire Rapids-class Xeon, 2 cores, N=32, ms,
  from memory (256 MB written before each call): 16 -> 96 on 56x56 5.6 -> 4.1, 32 -> 16 on 56x56
  2.2 -> 1.8, 24 -> 144 on 28x28 3.1 -> 2.4, 96 -> 24 2.2 -> 1.9, 144 -> 24 2.8 -> 2.6; called
  again on the same tensors (this guest's L3 keeps them): 16 -> 96 4.5-5.1 -> 3.1-3.4, 32 -> 16
  1.15-1.24 -> 1.04-1.15, the 28x28 layers within the noise (asking for each run in every pass, or
  dy's only, made 144 -> 24 slower: 1.60-1.87 against 1.52-1.56).
* The two run as the two branches of one loop (step ``2k``: chunk ``k``'s dW, ``2k + 1``: its dX).
  Written one after the other in the loop's body, LLVM allocated the two parts' registers together
  and spilled one part's tile on every FMA (Zen 4, N=8, 256 -> 64 on 56x56: 18.5 ms; as branches
  8.2; the package's two kernels 9.9).

Zen 4, 2 cores, ms, hot / cold (a 96 MB buffer written before each call), against the package's dX
and dW kernels: N=32, 32 -> 16 on 56x56 1.20 / 1.42 (1.71 / 2.00); 16 -> 96 on 56x56 4.22 / 4.35
(4.67 / 4.79); 24 -> 144 on 28x28 2.11 / 2.48 (2.74 / 3.99); 576 -> 96 on 7x7 1.69 / 1.95 (1.92 /
2.49). Inside MobileNetV2's channels-last f32 step at 32 x 112x112 (profiled, ``"auto"``) the
convolutions' backward kernels take 67-71 ms a step against 73-74 with the two kernels, and its
layers' backward (``training.torch_backward``) went 1.24 -> 1.30x stock's, every call counted; the
steps are within the host's noise. With chunks of 32, 128 or 256 pixels: the same times.

Arguments (NHWC activations, the weight ``(O, C, 1, 1)`` or ``(O, 1, 1, C)``: the same memory):
``(x, dy, w, dx, dw)``; ``dw`` in the weight's layout. dW's sums: each core its own chunks', the
cores' sums added in order after (the same bits from run to run on a machine).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from ...layout import ceil_div
from .one_pass import kernel_arguments, parts_total
from . import prefetch

__all__ = ["CHUNK_PIXELS", "MAX_WEIGHTS", "MIN_REGISTERS", "PointwiseBackward", "PointwiseWriter", "Tiles", "chunk_pixels",
           "pointwise_backward_func", "stream_ahead", "tiles"]

CHUNK_PIXELS = 64
"""Pixels a task, about (a multiple of dX's tile rows): their dy rows stay in cache from dW to dX."""

MAX_WEIGHTS = 1 << 19
"""The most weights (``O * C``) a layer may have: every chunk adds its dW into the core's sums, and
larger sums leave the caches. Zen 4, N=8, cold: 2048 -> 512 on 7x7 (4 MB of sums) 9.9 ms against
the two kernels' 9.0; 320 -> 1280 on 4x4 at N=32 (1.6 MB) 4.40 against 4.55."""

MIN_REGISTERS = 32
"""The vector registers an ISA needs for this kernel: both tiles' accumulators, loads and
broadcasts in registers. With AVX2's 16 its tiles shrink to 3 x 2 and it loses to the separate
kernels (Zen 4 built for ``haswell``, N=32, cold: 16 -> 96 on 56x56 5.99 ms against 5.10, 576 ->
96 on 7x7 2.23 against 2.36; larger tiles spilled: 7.35 and 3.95)."""


@dataclass(frozen=True)
class PointwiseBackward:
    """One layer: ``x`` is ``(n, h, w, c)`` NHWC, ``dy`` ``(n, h, w, o)``; ``lanes`` fp32 lanes a
    vector of the ISA, ``registers`` its vector registers, ``cores`` the parts dW is summed in."""

    n: int
    h: int
    w: int
    c: int
    o: int
    weights_last: bool
    lanes: int
    registers: int
    cores: int

    @property
    def m(self) -> int:
        """Pixels: the GEMMs' long dimension."""
        return self.n * self.h * self.w

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        """The weight as it lies in memory: ``(O, C, 1, 1)``, or ``(O, 1, 1, C)`` (channels-last)."""
        return (self.o, 1, 1, self.c) if self.weights_last else (self.o, self.c, 1, 1)

    @property
    def vector_lanes(self) -> int:
        """Lanes of the vectors along the input channels: the most of ``lanes``, its halves, down to
        4, that divides ``c``; 0 where none does."""
        lanes = self.lanes
        while lanes >= 4 and self.c % lanes:
            lanes //= 2
        return lanes if lanes >= 4 else 0

    def fits(self) -> bool:
        """Whether this kernel takes the layer: an ISA of :data:`MIN_REGISTERS` vector registers,
        input channels a multiple of 4, at most :data:`MAX_WEIGHTS` weights, two chunks a core or
        more, int32 indices."""
        return (self.registers >= MIN_REGISTERS and self.vector_lanes > 0 and self.o * self.c <= MAX_WEIGHTS
                and self.m >= 2 * self.cores * CHUNK_PIXELS and self.m * max(self.c, self.o) < 2**31)  # fmt: skip


@dataclass(frozen=True)
class Tiles:
    """Register tiles: dX's ``pixels x input_vectors``, dW's ``rows x weight_vectors`` (rows of output channels)."""

    pixels: int
    input_vectors: int
    rows: int
    weight_vectors: int


def tiles(layer: PointwiseBackward) -> Tiles:
    """The largest tiles whose accumulators, loads and broadcasts take 3/4 of the registers (the
    rest for addresses' spills and the scheduler): ``a * b + a + b <= budget`` for an ``a x b`` tile,
    ``b`` a divisor of the vector count up to 6, dW's ``a`` a divisor of ``o``, dX's up to 12; the
    most accumulators, then the most rows. (With ``b`` up to 4, 160 channels took 7 x 2, not 3 x 5:
    160 -> 960 on 4x4 at N=32 1.68 ms cold against 1.59, the two kernels' 1.56.)"""
    budget = layer.registers * 3 // 4
    vectors = [v for v in range(1, 7) if (layer.c // layer.vector_lanes) % v == 0]

    def best(sizes) -> tuple[int, int]:
        fitting = [(a, b) for b in vectors for a in sizes if a * b + a + b <= budget]
        return max(fitting, key=lambda ab: (ab[0] * ab[1], ab[0]))

    pixels, input_vectors = best(range(1, 13))
    rows, weight_vectors = best([d for d in range(1, layer.o + 1) if layer.o % d == 0])
    return Tiles(pixels, input_vectors, rows, weight_vectors)


def chunk_pixels(layer: PointwiseBackward) -> int:
    """Pixels a task: :data:`CHUNK_PIXELS` rounded up to a multiple of dX's tile rows."""
    rows = tiles(layer).pixels
    return rows * ceil_div(CHUNK_PIXELS, rows)


def stream_ahead(layer: PointwiseBackward, row: int, chunk: int) -> int:
    """How many pixels ahead a kernel over ``layer``'s pixels asks for the rows of ``row`` floats it
    streams: a chunk's (``chunk`` pixels), where those rows are a stream (:data:`.prefetch.STREAM_BYTES`
    or more), else 0."""
    return chunk if prefetch.is_stream(layer.m * row * 4) else 0


class PointwiseWriter:
    """The function's statements, written into the open ``IRBuilder`` frame; ``x``, ``dy``, ``w``,
    ``dx``, ``sums`` are 2-D views: ``(M, C)``, ``(M, O)``, ``(O, C)``, ``(M, C)``, ``(cores, O, C)``;
    ``bias``: ``(C,)`` added to each dX row as it is stored, or None. (:mod:`.pointwise_forward`
    writes the forward as this dX GEMM, its roles swapped: no ``x``, no ``sums``.) ``ahead``: where
    not 0, the pass that first reads a chunk's rows from memory (dW's; dX's where there is no dW)
    asks for those ``ahead`` pixels further on as it goes (:func:`.prefetch.prefetch_run`)."""

    def __init__(self, layer: PointwiseBackward, x, dy, w, dx, sums, bias=None, ahead: int = 0):
        self.layer, self.tiles, self.L = layer, tiles(layer), layer.vector_lanes
        self.x, self.dy, self.w, self.dx, self.sums, self.bias, self.ahead = x, dy, w, dx, sums, bias, ahead
        self.zero = tirx.const(0, "float32")

    def _zeroed(self, count: int):
        acc = T.alloc_buffer((count, self.L), "float32", scope="local")
        with T.unroll(0, count) as i, T.vectorized(0, self.L) as lane:
            T.buffer_store(acc, self.zero, [i, lane])
        return acc

    def weight_grad(self, part, m0, count):
        """The products of pixels ``[m0, m0 + count)`` added into the core's sums ``sums[part]``."""
        g, L, t = self.layer, self.L, self.tiles
        rows, vectors = t.rows, t.weight_vectors
        with T.serial(0, g.o // rows) as o1, T.serial(0, g.c // L // vectors) as c1:
            acc = self._zeroed(rows * vectors)
            with T.serial(0, count) as i:
                if self.ahead:  # (this step's runs of the pixel `ahead` on, each once: dy's in the first c1, x's in the first o1)
                    pixel = m0 + i + self.ahead
                    with T.If(c1 == 0), T.Then():
                        prefetch.prefetch_run(self.dy, pixel * g.o + o1 * rows, rows)
                    with T.If(o1 == 0), T.Then():
                        prefetch.prefetch_run(self.x, pixel * g.c + c1 * vectors * L, vectors * L)
                for v in range(vectors):
                    for r in range(rows):
                        with T.vectorized(0, L) as lane:
                            product = self.dy[m0 + i, o1 * rows + r] * self.x[m0 + i, (c1 * vectors + v) * L + lane]
                            T.buffer_store(acc, acc[r * vectors + v, lane] + product, [r * vectors + v, lane])
            for v in range(vectors):
                for r in range(rows):
                    with T.vectorized(0, L) as lane:
                        at = [part, o1 * rows + r, (c1 * vectors + v) * L + lane]
                        T.buffer_store(self.sums, self.sums[tuple(at)] + acc[r * vectors + v, lane], at)

    def input_grad(self, m0, count):
        """dX of pixels ``[m0, m0 + count)``: tiles of ``pixels`` pixels, then the rest one by one."""
        pixels, vectors = self.tiles.pixels, self.tiles.input_vectors
        with T.serial(0, self.layer.c // self.L // vectors) as c1:
            with T.serial(0, count // pixels) as block:
                if self.ahead and self.sums is None:  # (the rows of the tile `ahead` pixels on, in the first vector group)
                    with T.If(c1 == 0), T.Then():
                        prefetch.prefetch_run(self.dy, (m0 + block * pixels + self.ahead) * self.layer.o, pixels * self.layer.o)
                self.input_grad_tile(m0 + block * pixels, pixels, c1)
            with T.serial(0, count % pixels) as i:
                self.input_grad_tile(m0 + count // pixels * pixels + i, 1, c1)

    def input_grad_tile(self, first, pixels, c1):
        """dX of pixels ``[first, first + pixels)`` (``pixels`` a Python int), vector group ``c1``."""
        g, L, vectors = self.layer, self.L, self.tiles.input_vectors
        acc = self._zeroed(pixels * vectors)
        with T.serial(0, g.o) as o:
            for v in range(vectors):
                for p in range(pixels):
                    with T.vectorized(0, L) as lane:
                        product = self.dy[first + p, o] * self.w[o, (c1 * vectors + v) * L + lane]
                        T.buffer_store(acc, acc[p * vectors + v, lane] + product, [p * vectors + v, lane])
        for v in range(vectors):
            for p in range(pixels):
                with T.vectorized(0, L) as lane:
                    c = (c1 * vectors + v) * L + lane
                    value = acc[p * vectors + v, lane] if self.bias is None else acc[p * vectors + v, lane] + self.bias[c]
                    T.buffer_store(self.dx, value, [first + p, c])


def pointwise_backward_func(layer: PointwiseBackward, name: str = "pointwise_backward") -> tirx.PrimFunc:
    """The kernel of ``layer`` (:meth:`PointwiseBackward.fits`): ``(x, dy, w, dx, dw)``, see the module docstring."""
    g, L = layer, layer.vector_lanes
    size = chunk_pixels(layer)
    chunks = ceil_div(g.m, size)
    with IRBuilder() as builder:
        with T.prim_func():
            arguments = kernel_arguments(name, (g.n, g.h, g.w, g.c), (g.n, g.h, g.w, g.o), g.weight_shape)
            views = [T.decl_buffer(shape, "float32", data=t.data) for t, shape in
                     zip(arguments, ((g.m, g.c), (g.m, g.o), (g.o, g.c), (g.m, g.c), (g.o, g.c)))]  # fmt: skip
            sums = T.alloc_buffer((g.cores, g.o, g.c), "float32")
            writer = PointwiseWriter(layer, *views[:4], sums, ahead=stream_ahead(layer, g.o, size))
            with T.parallel(0, g.cores) as part:
                with T.serial(0, g.o) as o, T.serial(0, g.c // L) as c1, T.vectorized(0, L) as lane:
                    T.buffer_store(sums, tirx.const(0, "float32"), [part, o, c1 * L + lane])
                first, end = part * chunks // g.cores, (part + 1) * chunks // g.cores
                with T.serial(2 * first, 2 * end) as step:  # (even: a chunk's dW; odd: its dX)
                    m0 = step // 2 * size
                    count = T.min(size, g.m - m0)
                    with T.If(step % 2 == 0):
                        with T.Then():
                            writer.weight_grad(part, m0, count)
                        with T.Else():
                            writer.input_grad(m0, count)
            with T.serial(0, g.o) as o, T.serial(0, g.c) as c:
                T.buffer_store(views[4], parts_total(sums, g.cores, (o, c)), [o, c])
    return builder.get()
