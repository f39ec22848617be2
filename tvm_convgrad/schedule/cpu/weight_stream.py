"""dX and the forward of a weight-bound fp32 layer, its weights read once where they lie, written as TIR.

A layer with megabytes of weights over a few dozen output pixels (ResNet-18's 512 -> 512 3x3 on
2x2 maps at N=8: 9.4 MB of weights, 32 pixels) is a read of its weights: the cube packs them into
16 x 16 blocks first (gathers at the taps' stride, then the pack read back per live-tap region).
Here each GEMM is two phases over the weights as they lie, ``w`` seen as ``(O, M)`` with ``M = C *
kh * kw`` in its memory's order (OIHW: ``m = c * taps + tap``; OHWI: ``m = tap * C + c``). dX
(:func:`streamed_input_grad_func`):

1. **Columns**: ``cols (P, M) = dy (P, O) . w (O, M)`` over the ``P = N * Ho * Wo`` output
   pixels, the dX GEMM of :mod:`.pointwise_backward` (:meth:`.PointwiseWriter.input_grad_tile`:
   register tiles of pixels x vectors of ``M``, dy broadcast, w's rows loaded where they lie); the
   tasks split ``M``, so each weight is read once, by one core.
2. **Col2im**: ``dx[n, c, h, w]`` is the sum of ``cols[(n, ho, wo), m(c, tap)]`` over the taps
   that reach ``(h, w)`` (``h = ho * sh - pt + kh * dh``), each dX element written once.

The forward (:func:`streamed_forward_func`): **im2col** ``cols (P, M)`` from x (zeros where a tap
reads padding), then ``y (P, O) = cols . w^T``: register tiles of output channels x pixels whose
vectors run along ``M`` in both operands (each row of w read where it lies, the tasks splitting
``O``), each sum's lanes added once at its store (:func:`forward_tile`).

The columns count dead taps too (a 2x2 map's corner pixels read 4 of 9): ``2 * P * O * M`` FLOPs
against the live taps' fewer, cheap beside the weights' read where :func:`weight_bound` holds.
ResNet-18's 512 -> 512 on 2x2 at N=8 (the Sapphire Rapids-class guest, 2 cores, ms hot / with 64 MB
written before each call): dX 0.78 / 1.02 against the cube's 1.26 / 1.44 and PyTorch's 1.23 / 1.52;
the forward 0.85 / 1.03 against 1.09 / 1.70 and 1.11 / 1.62. Arguments as the package's other
kernels take them: dX ``(dy, w, dx)``, the forward ``(x, w[, bias], y)``; NCHW or NHWC
activations, OIHW or OHWI weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from ...params import out_size
from .one_pass import forward_arguments
from .pointwise_backward import PointwiseBackward, PointwiseWriter, tiles

__all__ = ["COLD_PIXELS", "COLD_WEIGHT_BYTES", "StreamedLayer", "forward_tile", "streamed_forward_func",
           "streamed_input_grad_func", "weight_bound"]

COLD_PIXELS = 64
"""Most output pixels (images x rows x columns) of a :func:`weight_bound` layer."""
COLD_WEIGHT_BYTES = 4 << 20
"""Fewest bytes of weights of a :func:`weight_bound` layer (more than any x86 core's L2)."""


def weight_bound(pixels: int, weight_bytes: int) -> bool:
    """Whether a layer of ``pixels`` output pixels (images x rows x columns) and ``weight_bytes``
    bytes of weights reads more bytes of weights than it does work: at least :data:`COLD_WEIGHT_BYTES`
    over at most :data:`COLD_PIXELS` pixels (each weight is used twice per pixel)."""
    return pixels <= COLD_PIXELS and weight_bytes >= COLD_WEIGHT_BYTES


@dataclass(frozen=True)
class StreamedLayer:
    """One layer: x ``(n, c, h, w)`` logical, the weight ``(o, c, kh, kw)``; ``pads`` ``(top,
    bottom, left, right)``; ``channels_last``: NHWC activations; ``weights_last``: OHWI weights;
    ``lanes`` fp32 lanes a vector of the ISA, ``registers`` its vector registers, ``cores`` tasks."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilation: tuple[int, int]
    channels_last: bool
    weights_last: bool
    lanes: int
    registers: int
    cores: int

    @property
    def ho(self) -> int:
        (sh, _), (dh, _), (pt, pb, _, _) = self.strides, self.dilation, self.pads
        return out_size(self.h, self.kh, sh, pt, pb, dh)

    @property
    def wo(self) -> int:
        (_, sw), (_, dw), (_, _, pl, pr) = self.strides, self.dilation, self.pads
        return out_size(self.w, self.kw, sw, pl, pr, dw)

    def memory_shapes(self) -> tuple[tuple, tuple, tuple]:
        """The shapes of x (and dX), y (and dy) and the weight as they lie in memory: NCHW or NHWC, OIHW or OHWI."""
        g = self
        x = (g.n, g.h, g.w, g.c) if g.channels_last else (g.n, g.c, g.h, g.w)
        y = (g.n, g.ho, g.wo, g.o) if g.channels_last else (g.n, g.o, g.ho, g.wo)
        return x, y, (g.o, g.kh, g.kw, g.c) if g.weights_last else (g.o, g.c, g.kh, g.kw)

    @property
    def pixels(self) -> int:
        """``P``: the columns GEMM's rows."""
        return self.n * self.ho * self.wo

    @property
    def columns(self) -> int:
        """``M = C * kh * kw``: the columns GEMM's vector dimension."""
        return self.c * self.kh * self.kw

    def gemm(self) -> PointwiseBackward:
        """The columns GEMM as :mod:`.pointwise_backward`'s dX takes it: ``P`` pixels, ``O`` sums, ``M`` on the lanes."""
        return PointwiseBackward(1, 1, self.pixels, self.columns, self.o, False, self.lanes, self.registers, self.cores)

    def fits(self) -> bool:
        """Whether these kernels take the layer: :func:`weight_bound` in float32, a kernel of more than
        one tap (a 1x1's weights are no gather for the cube, which then ran ResNet-50's 512 -> 2048 and
        1024 -> 2048 / 2 at N=1 in half this kernel's time), ``M`` a multiple of 4 (vectors of 4 lanes
        or more), each GEMM two tasks a core or more, at least 16 vector registers, int32 indices."""
        gemm = self.gemm()
        if not (weight_bound(self.pixels, self.o * self.columns * 4) and self.kh * self.kw > 1 and self.registers >= 16
                and gemm.vector_lanes > 0 and self.o * self.columns < 2**31):  # fmt: skip
            return False
        column_tasks = self.columns // gemm.vector_lanes // tiles(gemm).input_vectors
        return min(column_tasks, self.o // forward_tile(self)[0]) >= 2 * self.cores


def forward_tile(layer: StreamedLayer) -> tuple[int, int]:
    """The forward's register tile ``(rows, pixels)``: rows of output channels (a divisor of ``O``)
    by pixels, up to 8 each, whose accumulators, loads and broadcasts take 3/4 of the registers
    (``r * a + r + a``, as :func:`.pointwise_backward.tiles`): the most sums, then the squarest.
    (4 x 4 on AVX-512; 8 x 2 and 2 x 8 ran the forward 4-22% slower.)"""
    budget = layer.registers * 3 // 4
    fitting = [(r, a) for r in range(1, 9) if layer.o % r == 0 for a in range(1, 9) if r * a + r + a <= budget]
    return max(fitting, key=lambda ra: (ra[0] * ra[1], -abs(ra[0] - ra[1])))


class _PixelRows:
    """dy or y as ``(P, O)`` rows: NHWC memory as it lies, NCHW through its images' planes."""

    def __init__(self, t, layer: StreamedLayer):
        g = layer
        self.plane = g.ho * g.wo
        shape = (g.pixels, g.o) if g.channels_last else (g.n, g.o, self.plane)
        self.flat, self.channels_last = T.decl_buffer(shape, "float32", data=t.data), g.channels_last

    def at(self, pixel, o) -> list:
        """The indices of ``[pixel, o]`` in :attr:`flat`."""
        return [pixel, o] if self.channels_last else [pixel // self.plane, o, pixel % self.plane]

    def __getitem__(self, at):
        return self.flat[tuple(self.at(*at))]


def _column(layer: StreamedLayer, c, tap: int):
    """``m`` of input channel ``c``, kernel tap ``tap`` (``row * kw + column``) in the weight's memory order."""
    taps = layer.kh * layer.kw
    return tap * layer.c + c if layer.weights_last else c * taps + tap


def _col2im(layer: StreamedLayer, cols, dx) -> None:
    """``dx`` from the columns: each element the sum of its taps' columns (see the module docstring)."""
    g = layer
    (sh, sw), (dh, dw), (pt, _, pl, _) = g.strides, g.dilation, g.pads
    zero = tirx.const(0, "float32")
    with T.parallel(0, g.c) as c, T.serial(0, g.n) as n, T.serial(0, g.h) as h, T.serial(0, g.w) as w:
        total = zero
        for kh in range(g.kh):
            for kw in range(g.kw):
                rows, columns = h + pt - kh * dh, w + pl - kw * dw  # (ho * sh, wo * sw) where the tap reaches (h, w)
                ho, wo = tirx.floordiv(rows, sh), tirx.floordiv(columns, sw)
                reaches = tirx.all(rows >= 0, columns >= 0, rows % sh == 0, columns % sw == 0, ho < g.ho, wo < g.wo)
                pixel = (n * g.ho + T.min(T.max(ho, 0), g.ho - 1)) * g.wo + T.min(T.max(wo, 0), g.wo - 1)
                total = total + tirx.if_then_else(reaches, cols[pixel, _column(g, c, kh * g.kw + kw)], zero)
        T.buffer_store(dx, total, [n, h, w, c] if g.channels_last else [n, c, h, w])


def streamed_input_grad_func(layer: StreamedLayer, name: str = "streamed_input_grad") -> tirx.PrimFunc:
    """dX of ``layer`` (:meth:`StreamedLayer.fits`): ``(dy, w, dx)``, see the module docstring."""
    g, gemm = layer, layer.gemm()
    lanes, t = gemm.vector_lanes, tiles(gemm)
    groups = g.columns // lanes // t.input_vectors
    full, rest = divmod(g.pixels, t.pixels)
    x_shape, dy_shape, w_shape = g.memory_shapes()
    with IRBuilder() as builder:
        with T.prim_func():
            T.func_name(name)
            T.func_attr({"global_symbol": name, "tirx.noalias": True})
            dy = T.arg("dy", T.buffer(dy_shape, "float32"))
            w = T.arg("w", T.buffer(w_shape, "float32"))
            dx = T.arg("dx", T.buffer(x_shape, "float32"))
            w2 = T.decl_buffer((g.o, g.columns), "float32", data=w.data)
            cols = T.alloc_buffer((g.pixels, g.columns), "float32")
            writer = PointwiseWriter(gemm, None, _PixelRows(dy, g), w2, cols, None)
            with T.parallel(0, groups) as group:
                with T.serial(0, full) as block:
                    writer.input_grad_tile(block * t.pixels, t.pixels, group)
                if rest:
                    writer.input_grad_tile(full * t.pixels, rest, group)
            _col2im(g, cols, dx)
    return builder.get()


def _im2col(layer: StreamedLayer, x, cols) -> None:
    """``cols[(n, ho, wo), m(c, tap)]``: the input element the tap reads for that output pixel, 0 in the padding."""
    g = layer
    (sh, sw), (dh, dw), (pt, _, pl, _) = g.strides, g.dilation, g.pads
    zero = tirx.const(0, "float32")
    with T.parallel(0, g.pixels) as pixel, T.serial(0, g.c) as c:
        n, ho, wo = pixel // (g.ho * g.wo), pixel % (g.ho * g.wo) // g.wo, pixel % g.wo
        for kh in range(g.kh):
            for kw in range(g.kw):
                h, w = ho * sh - pt + kh * dh, wo * sw - pl + kw * dw
                inside = tirx.all(h >= 0, h < g.h, w >= 0, w < g.w)
                h, w = T.min(T.max(h, 0), g.h - 1), T.min(T.max(w, 0), g.w - 1)
                value = x[n, h, w, c] if g.channels_last else x[n, c, h, w]
                T.buffer_store(cols, tirx.if_then_else(inside, value, zero), [pixel, _column(g, c, kh * g.kw + kw)])


def _forward_tile(layer: StreamedLayer, w2, cols, y_rows: _PixelRows, bias, lanes: int, rows: int, task, first,
                  pixels: int) -> None:  # fmt: skip
    """``y`` of output channels ``[task * rows, +rows)`` at pixels ``[first, first + pixels)``."""
    g = layer
    acc = T.alloc_buffer((rows * pixels, lanes), "float32", scope="local")
    with T.unroll(0, rows * pixels) as i, T.vectorized(0, lanes) as lane:
        T.buffer_store(acc, tirx.const(0, "float32"), [i, lane])
    with T.serial(0, g.columns // lanes) as vector:
        for r in range(rows):
            for p in range(pixels):
                with T.vectorized(0, lanes) as lane:
                    product = w2[task * rows + r, vector * lanes + lane] * cols[first + p, vector * lanes + lane]
                    T.buffer_store(acc, acc[r * pixels + p, lane] + product, [r * pixels + p, lane])
    for r in range(rows):
        o = task * rows + r
        for p in range(pixels):
            total = acc[r * pixels + p, 0] if bias is None else bias[o] + acc[r * pixels + p, 0]
            for lane in range(1, lanes):
                total = total + acc[r * pixels + p, lane]
            T.buffer_store(y_rows.flat, total, y_rows.at(first + p, o))


def streamed_forward_func(layer: StreamedLayer, bias: bool, name: str = "streamed_forward") -> tirx.PrimFunc:
    """The forward of ``layer`` (:meth:`StreamedLayer.fits`): ``(x, w[, bias], y)``, see the module docstring."""
    g = layer
    lanes, (rows, pixels) = g.gemm().vector_lanes, forward_tile(g)
    full, rest = divmod(g.pixels, pixels)
    x_shape, y_shape, w_shape = g.memory_shapes()
    with IRBuilder() as builder:
        with T.prim_func():
            x, w, b, y = forward_arguments(name, x_shape, w_shape, y_shape, bias)
            w2 = T.decl_buffer((g.o, g.columns), "float32", data=w.data)
            y_rows = _PixelRows(y, g)
            cols = T.alloc_buffer((g.pixels, g.columns), "float32")
            _im2col(g, x, cols)
            with T.parallel(0, g.o // rows) as task:
                with T.serial(0, full) as block:
                    _forward_tile(g, w2, cols, y_rows, b, lanes, rows, task, block * pixels, pixels)
                if rest:
                    _forward_tile(g, w2, cols, y_rows, b, lanes, rows, task, full * pixels, rest)
    return builder.get()
