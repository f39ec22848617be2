"""The forward of a channels-last fp32 depthwise layer, written as TIR: no pack, no pad.

``y[n, i, j, c] = sum_{kh, kw} x[n, i * sh - pt + kh * dh, j * sw - pl + kw * dw, c] * w[c, kh, kw]``
(plus the bias). Channels are on the vector lanes, each a contiguous run of NHWC memory (as in
:mod:`.depthwise_backward`, whose layer and geometry this kernel shares): a task is an image's band
of :func:`.depthwise_backward.band_rows` output rows; each row's channel blocks in turn, each
block's taps' weights in registers (a kernel row outside x: its row clamped inside, its weights
0), the columns whose every tap reads inside x in one loop (each output vector a chain of
``kh * kw`` FMAs), the border columns one by one with the taps that do. Where x is a stream, the
loop asks for the lines of x it reads :data:`.depthwise_backward.ROWS_AHEAD` rows on
(:func:`.depthwise_backward.ask_ahead`).

The Sapphire Rapids-class guest, 2 cores, N=32, 3x3, ms, this kernel / the cube's depthwise forward
(:class:`.depthwise.DepthwiseForward`, a band's pack then its sums) / PyTorch's ``F.conv2d``, in the
caches: 32 channels on 56x56 0.77 / 1.12 / 0.83, 96 on 56x56 at stride 2 1.23 / 2.69 / 1.21, 144 on
28x28 0.83 / 1.30 / 1.20, at stride 2 0.41 / 0.86 / 0.64, 192 on 14x14 0.31 / 0.52 / 0.42, 576 on
7x7 0.16 / 0.30 / 0.33, 960 on 4x4 0.07 / 0.20 / 0.16; from memory (256 MB written before each
call): 1.52 / 2.38 / 1.91, 2.64 / 3.52 / 2.61, 1.67 / 2.86 / 2.28, 0.87 / 1.78 / 1.35, 0.62 / 1.30
/ 1.11, 0.41 / 1.08 / 0.87, 0.28 / 0.78 / 0.69.

Arguments: ``(x, w[, bias], y)``, x and y NHWC, the weight ``(C, 1, KH, KW)`` or ``(C, KH, KW, 1)``
(the same memory), as the package's other forward kernels take them.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from .depthwise_backward import (DepthwiseBackward, ask_ahead, border_split, core_bands, live_taps, rows_ahead,
                                 tap_major_weights)
from .one_pass import forward_arguments

__all__ = ["depthwise_forward_func"]


def _row(layer: DepthwiseBackward, x, weights, bias, y, image, row, ahead: int):
    """Output row ``row`` of image ``image``, every channel block."""
    g, L = layer, layer.lanes
    (sh, sw), (dh, dw), (pt, _, pl, _) = g.strides, g.dilation, g.pads
    x_rows = [row * sh - pt + kh * dh for kh in range(g.kh)]
    ranges = g.weight_columns()
    (lo, hi), border = border_split(g.wo, ranges)
    with T.serial(0, g.c // L) as c1:
        wv = T.alloc_buffer((g.kh * g.kw, L), "float32", scope="local")
        for kh, x_row in enumerate(x_rows):
            inside = tirx.all(x_row >= 0, x_row < g.h)
            for kw in range(g.kw):
                with T.vectorized(0, L) as lane:
                    weight = tirx.Select(inside, weights[kh * g.kw + kw, c1 * L + lane], tirx.const(0, "float32"))
                    T.buffer_store(wv, weight, [kh * g.kw + kw, lane])
        rows_in = [T.max(0, T.min(x_row, g.h - 1)) for x_row in x_rows]

        def column(col, taps_w):
            with T.vectorized(0, L) as lane:
                c = c1 * L + lane
                value = tirx.const(0, "float32") if bias is None else bias[c]
                for kh in range(g.kh):
                    for kw in taps_w:
                        value = value + x[image, rows_in[kh], col * sw - pl + kw * dw, c] * wv[kh * g.kw + kw, lane]
                T.buffer_store(y, value, [image, row, col, c])

        if hi > lo:
            with T.serial(lo, hi) as col:
                if ahead:
                    ask_ahead(layer, x, None, image, row + ahead, col, c1)
                column(col, range(g.kw))
        for col in border:
            column(col, live_taps(col, dict(enumerate(ranges))))


def depthwise_forward_func(layer: DepthwiseBackward, bias: bool, name: str = "depthwise_forward") -> tirx.PrimFunc:
    """The forward of ``layer`` (:meth:`.DepthwiseBackward.fits`): ``(x, w[, bias], y)``, see the module docstring."""
    g = layer
    with IRBuilder() as builder:
        with T.prim_func():
            x, w, b, y = forward_arguments(name, (g.n, g.h, g.w, g.c), g.weight_shape, (g.n, g.ho, g.wo, g.c), bias)
            weights = tap_major_weights(layer, w)
            ahead = rows_ahead(layer)
            with T.parallel(0, g.cores) as part:
                with core_bands(layer, part) as (image, first, rows):
                    with T.serial(0, T.min(rows, g.ho - first)) as r:
                        _row(layer, x, weights, b, y, image, first + r, ahead)
    return builder.get()
