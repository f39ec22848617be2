"""The forward of a channels-last fp32 1x1 layer (stride 1, no padding, one group), written as TIR.

A 1x1 layer's forward is one GEMM over its ``M = N * H * W`` pixels: ``y (M, O) = x (M, C) . w^T
(C, O)`` (plus the bias). That is the dX GEMM of :mod:`.pointwise_backward` with the roles swapped
(its ``dy`` is x, its ``w`` the weight transposed, its dX y; :func:`gemm_layer`), and this kernel
is that GEMM's tiles: output channels on the vector lanes, register tiles of pixels x vectors
summed over the input channels (``x`` broadcast, ``w^T`` loaded), each tile stored once into y's
NHWC rows. No pack of x or y: the NHWC rows are read and written where they lie; the weight is
transposed once a call (``O * C`` floats, the cores a share of its rows each).

The cube's forward (:class:`.cube.CubeForward`) takes x and y through its 16-channel blocks; on
MobileNetV2's expansion layers (few input channels, many output ones) its write-back is a second
pass over y. Zen 4, 2 cores, N=32, cold (a 96 MB buffer written before each call), ms, this kernel /
the cube's / PyTorch's ``F.conv2d``: 24 -> 144 on 28x28 1.21 / 1.81 / 1.38; 32 -> 192 on 14x14 0.55 /
0.92 / 0.74; 64 -> 384 on 7x7 0.55 / 0.78 / 0.72; 96 -> 576 on 7x7 1.02 / 1.21 / 1.17; 32 -> 16 on
56x56 1.06 / 1.24 / 1.68; 144 -> 24 on 28x28 2.18 / 1.89 / 2.21.

Where x is a stream (:func:`.pointwise_backward.stream_ahead`), each tile asks for x's rows of the
tile a chunk further on (in the first vector group of output channels). A Sapphire Rapids-class
Xeon, 2 cores, N=32, ms, without / with (PyTorch's), from memory (256 MB written before each call):
32 -> 16 on 56x56 2.00 / 1.63 (1.72), 96 -> 24 on 28x28 1.42 / 1.10 (1.41), 144 -> 24 2.19 / 1.67
(1.87), 24 -> 144 1.39 / 1.35 (1.65), 16 -> 96 on 56x56 3.73 / 3.70 (11.05: page faults on its 38.5 MB
y); called again on the same tensors, 32 -> 16 0.66 / 0.54 (0.75), 16 -> 96 3.22 / 1.49, the 28x28
layers the same.

Arguments (NHWC activations, the weight ``(O, C, 1, 1)`` or ``(O, 1, 1, C)``: the same memory):
``(x, w[, bias], y)``, as the package's other forward kernels take them.
"""

from __future__ import annotations

from dataclasses import replace

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from ...layout import ceil_div
from .one_pass import forward_arguments
from .pointwise_backward import MIN_REGISTERS, PointwiseBackward, PointwiseWriter, chunk_pixels, stream_ahead

__all__ = ["forward_fits", "gemm_layer", "pointwise_forward_func"]


def gemm_layer(layer: PointwiseBackward) -> PointwiseBackward:
    """The layer whose dX GEMM is ``layer``'s forward: its input channels ``layer``'s output ones
    (the vector lanes), its output channels ``layer``'s input ones (the sums)."""
    return replace(layer, c=layer.o, o=layer.c)


def forward_fits(layer: PointwiseBackward) -> bool:
    """Whether this kernel takes ``layer``'s forward: an ISA of :data:`.MIN_REGISTERS` vector
    registers (with AVX2's 16 the tiles shrink to 3 x 2, as the backward's), output channels a
    multiple of 4, int32 indices."""
    return layer.registers >= MIN_REGISTERS and gemm_layer(layer).vector_lanes > 0 and layer.m * max(layer.c, layer.o) < 2**31


def pointwise_forward_func(layer: PointwiseBackward, bias: bool, name: str = "pointwise_forward") -> tirx.PrimFunc:
    """The forward of ``layer`` (:func:`forward_fits`): ``(x, w[, bias], y)``, see the module docstring."""
    g, gemm = layer, gemm_layer(layer)
    size = chunk_pixels(gemm)
    chunks = ceil_div(g.m, size)
    with IRBuilder() as builder:
        with T.prim_func():
            x, w, b, y = forward_arguments(name, (g.n, g.h, g.w, g.c), g.weight_shape, (g.n, g.h, g.w, g.o), bias)
            views = ((x, (g.m, g.c)), (w, (g.o, g.c)), (y, (g.m, g.o)))
            x2, w2, y2 = (T.decl_buffer(shape, "float32", data=t.data) for t, shape in views)
            w_t = T.alloc_buffer((g.c, g.o), "float32")
            with T.parallel(0, g.c) as c, T.serial(0, g.o) as o:
                T.buffer_store(w_t, w2[o, c], [c, o])
            writer = PointwiseWriter(gemm, None, x2, w_t, y2, None, bias=b, ahead=stream_ahead(gemm, g.c, size))
            with T.parallel(0, chunks) as chunk:
                writer.input_grad(chunk * size, T.min(size, g.m - chunk * size))
    return builder.get()
