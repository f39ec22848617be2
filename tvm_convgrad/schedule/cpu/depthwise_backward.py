"""Both gradients of a channels-last fp32 depthwise layer in one pass over dy, written as TIR.

The depthwise dX and dW kernels (:mod:`.depthwise`) each stream their operands from memory in a
training step: dW reads x and dy, dX reads dy again and writes dX, so the second read of dy is a
third of what the pair moves. This kernel runs them task by task on the same rows of dy: a task (an
image's band of :func:`band_rows` dy rows, every channel) adds the band's dW into its core's sums,
then writes the dX rows those dy rows end, reading them from cache.

Loops are written out here (``tvm.script.ir_builder``), not scheduled from a TE compute: the two
gradients' loops could not share one band loop. Channels are on the vector lanes (the plan's
``lanes``, each a contiguous run of NHWC memory); no pack, no pad: the loop over a row's columns
runs where every tap reads inside its tensor, and the border columns (:func:`tap_columns`) are
written out one by one with the taps that do; a dX row's taps outside dy read a clamped row with a
zero weight.

Zen 4, 2 cores, N=32, ms, hot / cold (a 96 MB buffer written before each call), against the
separate dX and dW kernels: 32 channels on 56x56 1.51 / 1.66 (2.01 / 2.22), 96 on 56x56 at stride 2
3.45 / 3.96 (4.89 / 4.97), 144 on 28x28 1.93 / 2.20 (2.54 / 2.99). Inside MobileNetV2's
channels-last f32 step at 32 x 112x112 its ten layers take 14 ms against the pair's 19.5 (profiled),
and the step ~5 ms less (61 rounds, paired). Where x is a stream, the dW loop asks for the lines it
reads :data:`ROWS_AHEAD` dy rows on (``llvm.prefetch``). Two channel blocks a pass did not help
(each tap's sums and weights of both in registers): 32 channels on 56x56 1.41 -> 1.34 ms hot, but
576 on 7x7 0.26 -> 0.30, 192 on 14x14 0.44 -> 0.56 (three blocks a pass: slower still). One core
runs 32 channels on 56x56 in 3.1 ms and two in 1.3: in the caches, the kernel is bound by its
loops more than by memory.

Arguments (NHWC activations, the weight ``(C, 1, KH, KW)`` or ``(C, KH, KW, 1)``: the same memory):
``(x, dy, w, dx, dw)``; ``dw`` in the weight's layout. dW's sums: each core its own tasks' rows
(each row's sum of ``Wo`` products added to its core's), the cores' sums added in order after.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from ...layout import ceil_div
from ...params import out_size
from . import prefetch
from .one_pass import kernel_arguments, parts_total

__all__ = ["BAND_ROWS", "MAX_BORDER_COLUMNS", "ROWS_AHEAD", "DepthwiseBackward", "ask_ahead", "band_rows", "border_split",
           "core_bands", "depthwise_backward_func", "live_taps", "rows_ahead", "tap_at", "tap_columns",
           "tap_major_weights"]

BAND_ROWS = 4
"""dy rows per task where that leaves every core 4 tasks or more (else one row a task). Zen 4, 2
cores, N=32, 32 channels on 56x56, ms, hot / cold: 2 rows 1.59 / 1.84, 8 rows 1.57 / 1.84 (the
separate dX and dW kernels 2.06-2.31 / 2.40-2.71)."""

ROWS_AHEAD = 2
"""dy rows ahead the dW loop asks for the lines it will read of dy and x (:func:`rows_ahead`), into
L2 (:mod:`.prefetch`). A Sapphire Rapids-class Xeon, 2 cores, N=32, from memory (256 MB written
before each call), ms, without / 1 / 2 / 4 rows ahead: 96 channels on 56x56 at stride 2 6.09 /
5.25 / 5.28 / 5.44, 32 on 56x56 2.55 / 2.25 / 2.16 / 2.14, 144 on 28x28 3.44 / 2.40 / 2.34 / 2.38,
at stride 2 2.10 / 1.88 / 1.83 / 1.86, 192 on 14x14 1.17 / 0.89 / 0.92 / 0.91 (dy's lines alone, 2
ahead: 5.94, 2.45, 3.18, 2.01, 1.05). In the caches within 10% either way. (On Zen 4, in the
caches, asking for the next 1, 2 or 4 dy rows had moved nothing.)

A strided layer's dX rows (each written from fewer dy rows) are asked for as many rows ahead, to be
written (``prefetchw``: the line owned before the stores reach it), their pixels in the loop that
writes the row's columns. The same guest, from memory, ms, without / with: 96 on 56x56 at stride 2
5.31 / 4.40, 144 on 28x28 1.74 / 1.45, 192 on 14x14 0.66 / 0.58, 576 on 7x7 0.50 / 0.45; in the
caches the same or faster (3.29 / 2.84 on 56x56). At stride 1 they cost: 32 on 56x56 2.42 / 2.64,
144 on 28x28 2.17 / 2.18."""

MAX_BORDER_COLUMNS = 32
"""The most columns a kernel writes out one by one (those a tap's input or dy column is cut from):
a wider border (a dilated kernel wider than its input) is left to the separate kernels."""


def tap_columns(tap: int, dilation: int, pad: int, stride: int, size_in: int, size_out: int) -> tuple[int, int]:
    """``(lo, hi)``: the output positions ``o`` in ``[0, size_out)`` whose input ``o * stride - pad
    + tap * dilation`` lies in ``[0, size_in)``; ``lo == hi`` where none does."""
    lo = max(0, ceil_div(pad - tap * dilation, stride))
    hi = min(size_out, (size_in - 1 + pad - tap * dilation) // stride + 1)
    return lo, max(lo, hi)


def border_split(count: int, ranges) -> tuple[tuple[int, int], list[int]]:
    """``((lo, hi), border)``: the positions every range holds (a loop of all taps) and the others."""
    lo = max((r[0] for r in ranges), default=0)
    hi = min((r[1] for r in ranges), default=count)
    if hi <= lo:
        return (0, 0), list(range(count))
    return (lo, hi), list(range(0, lo)) + list(range(hi, count))


@dataclass(frozen=True)
class DepthwiseBackward:
    """One layer: ``x`` is ``(n, h, w, c)`` NHWC, the kernel ``(kh, kw)``, ``pads`` (top, bottom,
    left, right); ``lanes`` fp32 lanes a vector, ``cores`` the parts dW is summed in."""

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilation: tuple[int, int]
    weights_last: bool
    lanes: int
    cores: int

    @property
    def ho(self) -> int:
        (sh, _), (dh, _), (pt, pb, _, _) = self.strides, self.dilation, self.pads
        return out_size(self.h, self.kh, sh, pt, pb, dh)

    @property
    def wo(self) -> int:
        (_, sw), (_, dw), (_, _, pl, pr) = self.strides, self.dilation, self.pads
        return out_size(self.w, self.kw, sw, pl, pr, dw)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        """The weight as it lies in memory: ``(C, 1, KH, KW)``, or ``(C, KH, KW, 1)`` (the same memory)."""
        return (self.c, self.kh, self.kw, 1) if self.weights_last else (self.c, 1, self.kh, self.kw)

    def weight_columns(self) -> list[tuple[int, int]]:
        """Per kernel column, the dy columns whose x column it reads (dW)."""
        (_, sw), (_, dw), (_, _, pl, _) = self.strides, self.dilation, self.pads
        return [tap_columns(kw, dw, pl, sw, self.w, self.wo) for kw in range(self.kw)]

    def input_phase(self, rw: int) -> tuple[int, dict[int, int], dict[int, tuple[int, int]]]:
        """dX's columns ``rw + j * stride``: their count, and per kernel column reaching them its dy
        column's offset from ``j`` and the ``j`` whose dy column lies inside dy."""
        (_, sw), (_, dw), (_, _, pl, _) = self.strides, self.dilation, self.pads
        count = max(0, ceil_div(self.w - rw, sw))
        offsets = {kw: (rw + pl - kw * dw) // sw for kw in range(self.kw) if (rw + pl - kw * dw) % sw == 0}
        columns = {kw: (max(0, -off), max(max(0, -off), min(count, self.wo - off))) for kw, off in offsets.items()}
        return count, offsets, columns

    def border_columns(self) -> int:
        """How many columns the kernel writes out one by one (dW's and every dX phase's)."""
        total = len(border_split(self.wo, self.weight_columns())[1])
        for rw in range(self.strides[1]):
            count, _, columns = self.input_phase(rw)
            total += len(border_split(count, columns.values())[1])
        return total

    def fits(self) -> bool:
        """Whether this kernel takes the layer: channels a multiple of the lanes, borders of
        :data:`MAX_BORDER_COLUMNS` columns or fewer."""
        return self.c % self.lanes == 0 and self.border_columns() <= MAX_BORDER_COLUMNS


def rows_ahead(layer: DepthwiseBackward) -> int:
    """How many dy rows ahead the dW loop asks for its rows of dy and x: :data:`ROWS_AHEAD` where
    x is a stream (:data:`.prefetch.STREAM_BYTES` or more), else 0."""
    return ROWS_AHEAD if prefetch.is_stream(layer.n * layer.h * layer.w * layer.c * 4) else 0


def band_rows(layer: DepthwiseBackward) -> int:
    """dy rows per task: :data:`BAND_ROWS` where the tasks then number 4 a core or more, else 1."""
    rows = min(BAND_ROWS, layer.ho)
    return rows if layer.n * ceil_div(layer.ho, rows) >= 4 * layer.cores else 1


def ask_ahead(layer: DepthwiseBackward, x, dy, image, row, col, c1) -> None:
    """Ask for what column ``col`` of channel block ``c1`` reads at dy (or output) row ``row``, some
    rows on (the rows past an image's: the next image's): dy's pixel (where ``dy`` is not None),
    and the ``sh x sw`` pixels of x the kernel window reaches first there (its last ``sh`` rows,
    ``sw`` columns from its left edge), so that over a loop along the rows each line of x and dy
    is asked for about once (:func:`.prefetch.prefetch_run`, clamped into the tensors)."""
    g, L = layer, layer.lanes
    (sh, sw), (dh, _), (pt, _, pl, _) = g.strides, g.dilation, g.pads
    if dy is not None:
        prefetch.prefetch_run(dy, ((image * g.ho + row) * g.wo + col) * g.c + c1 * L, 1)
    first_row = row * sh - pt + (g.kh - 1) * dh - (sh - 1)
    for j in range(sh):
        for k in range(sw):
            pixel = (image * g.h + first_row + j) * g.w + col * sw - pl + k
            prefetch.prefetch_run(x, T.max(pixel * g.c + c1 * L, 0), 1)


def tap_at(layer: DepthwiseBackward, c, tap) -> list:
    """The index of channel ``c``'s tap ``tap`` (``kh * kw_count + kw``) in the weight's layout."""
    kh, kw = tap // layer.kw, tap % layer.kw
    return [c, kh, kw, 0] if layer.weights_last else [c, 0, kh, kw]


def tap_major_weights(layer: DepthwiseBackward, w):
    """Inside an open ``IRBuilder`` frame: a ``(taps, C)`` buffer of the weight ``w``'s values, each
    tap's channels contiguous (a vector's load)."""
    taps = layer.kh * layer.kw
    weights = T.alloc_buffer((taps, layer.c), "float32")
    with T.serial(0, taps) as tap, T.serial(0, layer.c) as c:
        T.buffer_store(weights, w[tuple(tap_at(layer, c, tap))], [tap, c])
    return weights


@contextmanager
def core_bands(layer: DepthwiseBackward, part):
    """Inside core ``part``'s iteration of the parallel loop: the loop over its share of the tasks
    (each an image's band of :func:`band_rows` dy rows, every channel), as ``(image, first row,
    rows a band)``."""
    rows = band_rows(layer)
    bands = ceil_div(layer.ho, rows)
    tasks = layer.n * bands
    with T.serial(part * tasks // layer.cores, (part + 1) * tasks // layer.cores) as task:
        yield task // bands, task % bands * rows, rows


def live_taps(position: int, ranges: dict[int, tuple[int, int]]) -> list[int]:
    """The kernel columns whose range (``{kw: (lo, hi)}``) holds a border ``position``."""
    return [kw for kw, (lo, hi) in ranges.items() if lo <= position < hi]


class _Writer:
    """The function's statements, written into the open ``IRBuilder`` frame."""

    def __init__(self, layer: DepthwiseBackward, x, dy, dx, weights, sums, ahead: int = 0):
        self.layer, self.x, self.dy, self.dx, self.weights, self.sums = layer, x, dy, dx, weights, sums
        self.ahead = ahead  # (dy rows: where not 0, the dW loop asks for what it reads that far on, ask_ahead)
        self.write_ahead = ahead if tuple(layer.strides) != (1, 1) else 0  # (dX rows: see ROWS_AHEAD)
        self.zero = tirx.const(0, "float32")

    def _lanes(self):
        return T.vectorized(0, self.layer.lanes)

    def weight_grad_row(self, part, image, row):
        """dy row ``row``'s products added into the core's sums ``sums[part, c1, tap, lane]``. Where
        every kernel row reads inside x, one loop over the columns runs all the taps (each its own
        sum: independent chains of FMAs); else a loop per kernel row that does."""
        g, L = self.layer, self.layer.lanes
        (sh, _), (dh, _), (pt, _, _, _) = g.strides, g.dilation, g.pads
        x_rows = [row * sh - pt + kh * dh for kh in range(g.kh)]
        inside = [tirx.all(x_row >= 0, x_row < g.h) for x_row in x_rows]
        with T.serial(0, g.c // L) as c1:
            acc = T.alloc_buffer((g.kh * g.kw, L), "float32", scope="local")
            with T.unroll(0, g.kh * g.kw) as tap, self._lanes() as lane:
                T.buffer_store(acc, self.zero, [tap, lane])
            with T.If(tirx.all(*inside)):
                with T.Then():
                    self._products(acc, image, row, c1, list(zip(range(g.kh), x_rows)))
                with T.Else():
                    for kh in range(g.kh):
                        with T.If(inside[kh]), T.Then():
                            self._products(acc, image, row, c1, [(kh, x_rows[kh])])
            with T.unroll(0, g.kh * g.kw) as tap, self._lanes() as lane:
                T.buffer_store(self.sums, self.sums[part, c1, tap, lane] + acc[tap, lane], [part, c1, tap, lane])

    def _products(self, acc, image, row, c1, kernel_rows):
        """``acc[tap] +=`` dy row ``row``'s products with x of the kernel rows ``(kh, x row)``, over
        every column (the border columns with the taps that read inside x)."""
        g, L = self.layer, self.layer.lanes
        (_, sw), (_, dw), (_, _, pl, _) = g.strides, g.dilation, g.pads
        ranges = g.weight_columns()
        (lo, hi), border = border_split(g.wo, ranges)

        def products(col, taps_w):
            for kh, x_row in kernel_rows:
                for kw in taps_w:
                    tap = kh * g.kw + kw
                    with self._lanes() as lane:
                        c = c1 * L + lane
                        product = self.dy[image, row, col, c] * self.x[image, x_row, col * sw - pl + kw * dw, c]
                        T.buffer_store(acc, acc[tap, lane] + product, [tap, lane])

        if hi > lo:
            with T.serial(lo, hi) as col:
                if self.ahead and len(kernel_rows) == g.kh:
                    ask_ahead(g, self.x, self.dy, image, row + self.ahead, col, c1)
                products(col, range(g.kw))
        for col in border:
            products(col, live_taps(col, dict(enumerate(ranges))))

    def input_grad_rows(self, image, first, end):
        """dX rows ``[first, end)`` (``first`` a multiple of the stride), each from the dy rows its
        taps reach, by stride phases (each phase's taps fixed: no test inside a row)."""
        g, L = self.layer, self.layer.lanes
        (sh, _), (dh, _), (pt, _, _, _) = g.strides, g.dilation, g.pads
        for rh in range(sh):
            taps_h = [kh for kh in range(g.kh) if (rh + pt - kh * dh) % sh == 0]
            with T.serial(0, T.max(0, (end - first - rh + sh - 1) // sh)) as i:
                h = first + rh + i * sh
                with T.serial(0, g.c // L) as c1:
                    wv = T.alloc_buffer((g.kh * g.kw, L), "float32", scope="local")
                    dy_rows = {}
                    for kh in taps_h:
                        dy_row = (h + pt - kh * dh) // sh  # (exact in this phase)
                        inside = tirx.all(dy_row >= 0, dy_row < g.ho)
                        dy_rows[kh] = T.max(0, T.min(dy_row, g.ho - 1))
                        for kw in range(g.kw):
                            with self._lanes() as lane:
                                weight = tirx.Select(inside, self.weights[kh * g.kw + kw, c1 * L + lane], self.zero)
                                T.buffer_store(wv, weight, [kh * g.kw + kw, lane])
                    self._input_grad_columns(image, h, c1, taps_h, dy_rows, wv)

    def _input_grad_columns(self, image, h, c1, taps_h, dy_rows, wv):
        """dX row ``h``'s columns of channel block ``c1``: where every column phase has all its
        taps, one loop writes each phase's column in turn (the row's pixels in order: Zen 4, N=32,
        144 channels on 28x28 at stride 2, 1.20 -> 1.05 ms against a loop per phase); the phases'
        other columns after, each with the taps that reach it. (Chunks of 8 columns with every
        channel block inside, the pixels read and written whole, ran slower: 576 channels on 7x7
        0.22 -> 0.54 ms, 144 on 28x28 1.93 -> 2.44.)"""
        g, L = self.layer, self.layer.lanes
        sw = g.strides[1]
        phases = [g.input_phase(rw) for rw in range(sw)]
        splits = [border_split(count, columns.values()) for count, _, columns in phases]
        lo, hi = max(split[0][0] for split in splits), min(split[0][1] for split in splits)
        if any(split[0][1] <= split[0][0] for split in splits):
            lo = hi = 0

        def column(rw, j, taps_w):
            offsets = phases[rw][1]
            with self._lanes() as lane:
                c = c1 * L + lane
                value = self.zero
                for kh in taps_h:
                    for kw in taps_w:
                        value = value + self.dy[image, dy_rows[kh], j + offsets[kw], c] * wv[kh * g.kw + kw, lane]
                T.buffer_store(self.dx, value, [image, h, rw + j * sw, c])

        if hi > lo:
            with T.serial(lo, hi) as j:
                if self.write_ahead:  # (the pixels of this step's columns `write_ahead` dX rows on, to be written)
                    for rw in range(sw):
                        prefetch.prefetch_run(self.dx, ((image * g.h + h + self.write_ahead) * g.w + rw + j * sw) * g.c + c1 * L, 1, True)
                for rw in range(sw):
                    column(rw, j, list(phases[rw][1]))
        for rw, ((count, offsets, columns), ((phase_lo, phase_hi), border)) in enumerate(zip(phases, splits)):
            rest = ((phase_lo, min(lo, phase_hi)), (max(hi, phase_lo), phase_hi)) if hi > lo else ((phase_lo, phase_hi),)
            for start, stop in rest:  # (the phase's columns with all its taps, outside the shared loop)
                if stop > start:
                    with T.serial(start, stop) as j:
                        column(rw, j, list(offsets))
            for j in border:
                column(rw, j, live_taps(j, columns))


def depthwise_backward_func(layer: DepthwiseBackward, name: str = "depthwise_backward") -> tirx.PrimFunc:
    """The kernel of ``layer`` (:meth:`DepthwiseBackward.fits`): ``(x, dy, w, dx, dw)``, see the module docstring."""
    g, L = layer, layer.lanes
    taps = g.kh * g.kw
    with IRBuilder() as builder:
        with T.prim_func():
            x, dy, w, dx, dw = kernel_arguments(name, (g.n, g.h, g.w, g.c), (g.n, g.ho, g.wo, g.c), g.weight_shape)
            weights = tap_major_weights(layer, w)
            sums = T.alloc_buffer((g.cores, g.c // L, taps, L), "float32")
            writer = _Writer(layer, x, dy, dx, weights, sums, rows_ahead(layer))
            with T.parallel(0, g.cores) as part:
                with T.serial(0, g.c // L) as c1, T.serial(0, taps) as tap, T.vectorized(0, L) as lane:
                    T.buffer_store(sums, tirx.const(0, "float32"), [part, c1, tap, lane])
                with core_bands(layer, part) as (image, first, rows):
                    with T.serial(0, T.min(rows, g.ho - first)) as r:
                        writer.weight_grad_row(part, image, first + r)
                    end = T.if_then_else(first + rows >= g.ho, g.h, T.min((first + rows) * g.strides[0], g.h))
                    writer.input_grad_rows(image, T.min(first * g.strides[0], g.h), end)
            with T.serial(0, g.c) as c, T.serial(0, taps) as tap:
                T.buffer_store(dw, parts_total(sums, g.cores, (c // L, tap, c % L)), tap_at(layer, c, tap))
    return builder.get()

