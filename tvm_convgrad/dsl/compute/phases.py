"""Stride phases of dX (sub-pixel decomposition): the index math of each phase, written once.

dX is the transposed convolution ``dX[h] = sum_kh dyd[h + pad - kh*dil]`` of the zero-inserted
dy. The rows ``h`` with ``(h + pad) % stride == r`` only meet the taps ``kh`` with
``kh*dil % stride == r``, and for them the zero-inserted dy lands on real dy rows
``y = j + base_r - m*(dil/g)`` (``h = h_r + j*stride``, ``kh = kh0_r + m*(stride/g)``,
``g = gcd(dil, stride)``): each phase is a stride-1 correlation over a zero-padded dy with a
constant offset per tap. Every dX formulation (cube, pixel lanes, depthwise) uses these.

**Live-tap regions.** Where an axis's taps read dy's zero padding in enough of its (output, tap)
pairs (an atrous layer: dilation 12 on a 14-row map leaves 2 of a border tap's 14 rows on dy; a
3x3 on a 7-row map at pad 1: 2 of 21 pairs), each phase is split
further into runs of consecutive outputs that meet the same taps on real dy (the interior, the
borders), and each run keeps only those taps (:func:`live_tap_regions`): a run is a phase of its
own (``first`` its first output), so the mads multiply no padding and dy needs no padding at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .common import inside
from .stages import DX_CC, phase_name

__all__ = ["AxisPhase", "DepthFold", "DyWindow", "ACROSS_IMAGES_MIN", "ACROSS_IMAGES_PIXELS", "LIVE_TAPS_SPLIT_BELOW", "MAX_REGIONS", "MIN_BAND", "PAIRED_ACROSS_SPLIT_BELOW", "PAIRED_SPLIT_BELOW", "TINY_MAP", "across_images", "axis_phases", "depth_fold", "dy_window", "filter_tap_runs", "live_tap_regions", "output_runs", "phase_stage_name", "region_grid", "region_split_below", "tap_hull", "tap_runs", "whole_axis"]

LIVE_TAPS_SPLIT_BELOW = 0.97
"""An axis whose phases multiply real dy in fewer of their (output, tap) pairs runs as regions. A
3x3 at pad 1 splits on maps of 14 and less (95% of the pairs live on 14, 90% on 7), not on 28
(97.6%: even) or 56 (98.8%: 7% slower). dX A/B on Zen 4, N=8 NCHW f32, whole against regions:
512 @ 7x7 19.1 -> 16.4 ms, 256 @ 14x14 14.6 -> 11.4 (channels-last 9.9 -> 9.1, stride 2 3.9 ->
3.5), 64 @ 16x16 0.81 -> 0.73, 256 @ 4x4 1.84 -> 1.55; DeepLab's ASPP r6 (N=4, 51% live)
38.7 -> 20.7; AVX2 code 9-17% faster on the same layers."""
PAIRED_SPLIT_BELOW = 0.8
"""The same for the bf16 pair form, whose tiles are whole (a 5x5 interior makes poor ones): 512 @
7x7 N=8 5.9 -> 6.6 ms split (channels-last 5.4 -> 6.0), 256 @ 14x14 5.7 -> 5.3; ASPP r6 24.3 ->
13.3."""
PAIRED_ACROSS_SPLIT_BELOW = 0.85
"""The pair form's threshold where the regions run across the images (:func:`across_images`): a
3x3 at pad 1 splits on 4x4 maps too (83% of an axis's pairs live). Zen 4, 512 -> 512 channels,
whole against split, NCHW: dX N=32 5.8 -> 4.4 ms (channels-last 5.7 -> 4.4), N=8 1.75 -> 1.36,
N=4 1.33 -> 1.09; the forward N=32 5.6-6.0 -> 4.3, N=8 1.53-1.65 -> 1.22-1.29, N=4 0.95 ->
0.70-0.72. Region by region per image it loses (N=2 dX 0.60 -> 0.78, N=64 11.2 -> 15.5-16.7)."""
ACROSS_IMAGES_MIN = 4
ACROSS_IMAGES_PIXELS = 512
"""A batch of at least :data:`ACROSS_IMAGES_MIN` images and at most this many pixels in all (a
4x4 or 7x7 map, N=4..32) keeps each region a mad of its own, tiled across the images, as a
:data:`TINY_MAP` does: an image's region tiles are a few pixels there (a 4x4 map's corner
one), each a short chain of FMAs that reads the task's weights for them. A Sapphire Rapids-class
core, the 3x3 dX of 512 channels, NCHW / channels-last, region by region per image against across
the images: 4x4 N=32 11.2 / 22.3 -> 7.6 / 7.3 ms, N=8 3.0 / 5.9 -> 2.2 / 2.2, N=4 1.8 / 3.2 -> 1.5 /
1.5; 7x7 N=8 6.2 / 7.9 -> 5.5 / 5.4, N=4 3.8 / 4.5 -> 3.4 / 3.3; but N=1-2 (4x4 0.94 -> 1.24 N=1)
and 7x7 N=16 (784 pixels: 12.8 -> 20.3) faster region by region per image
(:func:`tvm_convgrad.schedule.cpu.regions.regions_one_by_one`). Where the channel blocks make two
a task for every core, the CPU rule runs such regions in tasks of channel blocks over the batch
(:func:`tvm_convgrad.schedule.cpu.regions.batch_task_blocks`)."""
MAX_REGIONS = 5  # ... of at most this many regions (a 3x3 axis has 3, a 5x5 atrous one 5)
MIN_BAND = 2  # a row region of fewer rows keeps the column phases whole (:func:`region_grid`)
TINY_MAP = 4
"""Outputs of at most this many pixels per image (a 2x2 map): every live-tap region a mad of its
own, tiled across the images, however few its rows (:func:`region_grid`,
:func:`tvm_convgrad.schedule.cpu.regions.regions_one_by_one`): a 3x3 at pad 1 on ResNet-18's 2x2
maps reads 4 of its 9 taps per pixel."""


@dataclass(frozen=True)
class AxisPhase:
    """The output positions ``first + j*stride`` (``j < count``) of one stride phase along an axis,
    and the taps ``tap0 + m*tap_step`` (``m < taps``) that reach them; ``j`` reads dy position
    ``j + base - m*dy_step``."""

    first: int
    count: int
    tap0: int
    taps: int
    tap_step: int
    base: int
    dy_step: int

    def dy_span(self) -> tuple[int, int]:
        """Lowest and highest dy position read."""
        return self.base - (self.taps - 1) * self.dy_step, self.count - 1 + self.base

    def tap(self, m):
        """The kernel tap of this phase's ``m``-th tap (an int or a TE expression)."""
        return self.tap0 + m * self.tap_step

    def dy_index(self, j, m, pad_before: int):
        """Where output ``j`` meets tap ``m`` in dy stored with ``pad_before`` zeros in front."""
        return j + self.base + pad_before - m * self.dy_step

    def live_taps(self, j: int, extent: int) -> range:
        """The taps ``m`` at which output ``j`` reads real dy (of ``extent`` positions)."""
        low = max(0, -(-(j + self.base - extent + 1) // self.dy_step))
        return range(low, min(self.taps, (j + self.base) // self.dy_step + 1) if j + self.base >= 0 else 0)

    def holds(self, position, stride: int, size: int) -> list:
        """Conditions for output ``position`` (of ``size``) to belong to this phase; only those
        that can fail."""
        conds = [position % stride == self.first % stride] if stride > 1 else []
        conds += [position >= self.first] if self.first >= stride else []
        conds += [position < self.first + self.count * stride] if self.first + self.count * stride < size else []
        return conds

    def index(self, position, stride: int):
        """The ``j`` of output ``position`` (one this phase holds)."""
        return position // stride - self.first // stride


def across_images(images: int, pixels: int) -> bool:
    """Whether a cube's live-tap regions run across the images: a map of at most :data:`TINY_MAP`
    pixels, or a batch of :data:`ACROSS_IMAGES_MIN` images or more with at most
    :data:`ACROSS_IMAGES_PIXELS` pixels in all."""
    return pixels <= TINY_MAP or (images >= ACROSS_IMAGES_MIN and images * pixels <= ACROSS_IMAGES_PIXELS)


def region_split_below(pairs: bool, images: int, pixels: int) -> float:
    """The live share of an axis's (output, tap) pairs under which a 2-D cube of ``images`` maps of
    ``pixels`` outputs runs by live-tap regions: :data:`LIVE_TAPS_SPLIT_BELOW`, and for the bf16
    pair form (``pairs``) :data:`PAIRED_ACROSS_SPLIT_BELOW` or :data:`PAIRED_SPLIT_BELOW` as its
    regions run across the images or not."""
    if not pairs:
        return LIVE_TAPS_SPLIT_BELOW
    return PAIRED_ACROSS_SPLIT_BELOW if across_images(images, pixels) else PAIRED_SPLIT_BELOW


def axis_phases(size: int, kernel: int, stride: int, pad_before: int, dilation: int) -> list[AxisPhase]:
    """The stride phases of one axis that have output positions and taps, ordered by ``first``."""
    g = math.gcd(dilation, stride)
    phases = []
    for first in range(min(stride, size)):
        r = (first + pad_before) % stride
        tap0 = next((k for k in range(min(kernel, stride // g)) if (k * dilation) % stride == r), None)
        if tap0 is None:
            continue  # no tap reaches this phase: its outputs are 0
        taps = -(-(kernel - tap0) // (stride // g))
        base = (first + pad_before - tap0 * dilation) // stride  # exact: the division has no remainder
        phases.append(AxisPhase(first, -(-(size - first) // stride), tap0, taps, stride // g, base, dilation // g))
    return phases


def live_tap_regions(phases: list[AxisPhase], stride: int, extent: int, split_below: float = LIVE_TAPS_SPLIT_BELOW) -> list[AxisPhase]:
    """``phases`` split into runs of outputs with the same live taps (reading dy's ``extent``
    real positions), each keeping only those taps, where that multiplies fewer than
    ``split_below`` (:data:`LIVE_TAPS_SPLIT_BELOW`) of the phases' (output, tap) pairs (see
    :func:`tap_runs`); runs without a live tap are dropped (their outputs are 0). Otherwise
    ``phases`` unchanged."""
    runs = tap_runs([[p.live_taps(j, extent) for j in range(p.count)] for p in phases], [p.taps for p in phases], split_below)
    if runs is None:
        return phases
    regions = []
    for k, start, end, taps in runs:
        p = phases[k]
        if taps:
            m = taps.start
            regions.append(AxisPhase(p.first + start * stride, end - start, p.tap(m), len(taps), p.tap_step, p.base + start - m * p.dy_step, p.dy_step))
    return sorted(regions, key=lambda r: r.first)


def whole_axis(out: int, kernel: int) -> AxisPhase:
    """One region of an axis: its ``out`` outputs with every one of its ``kernel`` taps (stride 1,
    as :func:`output_runs` and :func:`filter_tap_runs` give them)."""
    return AxisPhase(0, out, 0, kernel, 1, 0, 0)


def output_runs(out: int, kernel: int, stride: int, pad_before: int, dilation: int, size: int, split_below: float = LIVE_TAPS_SPLIT_BELOW) -> list[AxisPhase]:
    """The forward's live-tap regions along one axis: runs of its ``out`` outputs whose windows
    (``j*stride - pad_before + k*dilation``) read the same taps ``k`` of the ``size`` real
    positions, as :class:`AxisPhase` of stride 1 (``first``, ``count``; taps ``tap0 + m``; the
    forward reads x through its own index, ``base`` and ``dy_step`` are 0); one run of every tap
    where splitting does not pay (:func:`tap_runs`)."""
    def live(j: int) -> range:
        reads = [k for k in range(kernel) if 0 <= j * stride - pad_before + k * dilation < size]
        return range(reads[0], reads[-1] + 1) if reads else range(0)

    runs = tap_runs([[live(j) for j in range(out)]], [kernel], split_below)
    if runs is None:
        return [whole_axis(out, kernel)]
    return [AxisPhase(start, end - start, taps.start, len(taps), 1, 0, 0) for _, start, end, taps in runs if taps]


def filter_tap_runs(out: int, kernel: int, stride: int, pad_before: int, dilation: int, size: int,
                    split_below: float = LIVE_TAPS_SPLIT_BELOW) -> list[AxisPhase] | None:  # fmt: skip
    """dW's live-tap regions along one axis: runs of taps whose windows read real x (of ``size``
    positions) at the same outputs, as :class:`AxisPhase` (the taps ``tap0 + m``, ``m < taps``,
    sum over the outputs ``first .. first + count``; stride 1 in the taps, ``base`` and
    ``dy_step`` 0): tap ``k`` of output ``j`` reads ``j*stride - pad_before + k*dilation``. The
    forward's :func:`output_runs` turned around (:func:`tap_runs` over the taps); taps that read
    padding only are left out (their dW is 0). None where splitting does not pay."""
    def live(k: int) -> range:
        reads = [j for j in range(out) if 0 <= j * stride - pad_before + k * dilation < size]
        return range(reads[0], reads[-1] + 1) if reads else range(0)

    runs = tap_runs([[live(k) for k in range(kernel)]], [out], split_below)
    if runs is None:
        return None
    return [AxisPhase(outputs.start, len(outputs), start, end - start, 1, 0, 0) for _, start, end, outputs in runs if outputs]


def tap_runs(live: list[list[range]], taps: list[int], split_below: float) -> list[tuple[int, int, int, range]] | None:
    """Runs ``(group, start, end, taps)`` of consecutive outputs of a group (a stride phase) that
    read the same live taps, given each group's outputs' ``live`` tap ranges and its ``taps``;
    None where they would multiply ``split_below`` of the groups' (output, tap) pairs or more, or
    the groups alone are :data:`MAX_REGIONS` or more. At most :data:`MAX_REGIONS` runs: beyond
    that, neighbouring runs of a group are merged, the merge that adds the fewest pairs first (a
    merged run keeps the taps either reads, some of its outputs' on padding)."""
    total = sum(len(group) * count for group, count in zip(live, taps))
    if len(live) >= MAX_REGIONS or sum(len(r) for group in live for r in group) >= split_below * total:
        return None
    runs = _merged([(k, j, j + 1, r) for k, group in enumerate(live) for j, r in enumerate(group)], lambda a, b: a[3] == b[3])
    while len(runs) > MAX_REGIONS:
        _, at = min((_pairs(_union(a, b)) - _pairs(a) - _pairs(b), i) for i, (a, b) in enumerate(zip(runs, runs[1:])) if a[0] == b[0])
        runs[at : at + 2] = [_union(runs[at], runs[at + 1])]
    return None if sum(_pairs(run) for run in runs) >= split_below * total else runs


def region_grid(rows: list[AxisPhase], col_phases: list[AxisPhase], cols: list[AxisPhase]) -> list[tuple[AxisPhase, AxisPhase]]:
    """The ``(row, column)`` phases of a 2-D dX: each row region (or phase) with each column region,
    except that a row region of fewer than :data:`MIN_BAND` rows takes the column phases whole: a
    3x3 at pad 1 would otherwise have corners of one pixel, whose tile is a single accumulator row
    waiting on its own FMA chain; its band of one row is one tile, the corners' few padded taps
    multiplied. One column region (all the columns) is taken as it is, and so are the column
    regions of a map of at most :data:`TINY_MAP` pixels: its regions' tiles run across the images
    (:meth:`.CubeInputGrad._image_tiles`)."""
    tiny = sum(r.count for r in rows) * sum(c.count for c in cols) <= TINY_MAP
    return [(ph, pw) for ph in rows for pw in (cols if ph.count >= MIN_BAND or len(cols) == 1 or tiny else col_phases)]


def tap_hull(regions) -> range:
    """The taps ``k`` from the first to the last that any of an axis's ``regions`` (:class:`AxisPhase`
    of tap step 1) reads: the ones a weight pack must hold."""
    return range(min(r.tap0 for r in regions), max(r.tap0 + r.taps for r in regions))


def _merged(runs: list, same) -> list:
    """Neighbouring runs of one phase for which ``same`` holds made one."""
    out = []
    for run in runs:
        if out and out[-1][0] == run[0] and same(out[-1], run):
            out[-1] = _union(out[-1], run)
        else:
            out.append(run)
    return out


def _union(a, b):
    """Two neighbouring runs of one phase as one, with the taps either reads."""
    taps = [t for t in (a[3], b[3]) if t]
    span = range(min(t.start for t in taps), max(t.stop for t in taps)) if taps else range(0)
    return a[0], a[1], b[2], span


def _pairs(run) -> int:
    """The (output, tap) pairs a run multiplies."""
    return (run[2] - run[1]) * len(run[3])


def phase_stage_name(ph: AxisPhase, pw: AxisPhase, prefix: str = DX_CC, pd: AxisPhase | None = None) -> str:
    """The name of the mad of the stride phase ``(ph, pw)`` (3-D: ``(pd, ph, pw)``, :func:`.stages.phase_name`)."""
    return phase_name(prefix, ph.first, pw.first, None if pd is None else pd.first)


def _padding(phases: list[AxisPhase], extent: int) -> tuple[int, int]:
    """Zeros before dy and the end of the padded axis: as far as any phase's taps reach."""
    spans = [p.dy_span() for p in phases] or [(0, 0)]
    return max(0, -min(lo for lo, _ in spans)), max(extent, max(hi for _, hi in spans) + 1)



def dy_window(rows: list[AxisPhase], cols: list[AxisPhase], ho: int, wo: int) -> "DyWindow":
    """dy's zero padding: as far as any phase's taps reach."""
    return DyWindow(*_padding(rows, ho), *_padding(cols, wo), ho, wo)


@dataclass(frozen=True)
class DyWindow:
    """dy inside its zero padding: ``top`` rows before and rows up to ``end_h`` (the same for
    columns), as far as any phase's taps reach."""

    top: int
    end_h: int
    left: int
    end_w: int
    ho: int
    wo: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.top + self.end_h, self.left + self.end_w

    def conds(self, y, x) -> list:
        return inside((y, x), (self.top, self.left), (self.ho, self.wo), self.shape)

    @property
    def unpadded(self) -> bool:
        """Whether every position the taps reach is a dy position (no zero rows or columns: a
        1x1 kernel at stride 1 without padding), so that dy can be read where it lies."""
        return self.top == 0 and self.left == 0 and self.end_h <= self.ho and self.end_w <= self.wo


@dataclass(frozen=True)
class DepthFold:
    """A 3-D dX's depth axis folded into the batch: dy is packed as ``(N*planes, ..)`` planes
    (``top`` zero planes before dy's ``out`` planes, as far as any depth phase's taps reach), and
    each depth phase's mad has ``N*phase.count`` rows, image ``n`` and plane ``j`` at
    ``n*count + j``; the result has ``N*size`` rows, image ``n`` and plane ``d`` at ``n*size + d``.
    The depth phases are :func:`axis_phases` of the depth axis; each phase's taps are folded into
    the mad's Cout-block reduction (``co1 = m*cout1_g + co1'``)."""

    phases: tuple[AxisPhase, ...]
    size: int
    out: int
    top: int
    planes: int

    def dy_row(self, n, y):
        """Packed dy row of image ``n``, padded plane ``y``."""
        return n * self.planes + y

    def conds(self, y) -> list:
        """Conditions for padded plane ``y`` to hold a dy plane."""
        return inside((y,), (self.top,), (self.out,), (self.planes,))


def depth_fold(size: int, kernel: int, stride: int, pad_before: int, dilation: int, out: int) -> DepthFold:
    """The :class:`DepthFold` of a depth axis (dX of ``size`` planes from dy of ``out``)."""
    phases = axis_phases(size, kernel, stride, pad_before, dilation)
    top, end = _padding(phases, out)
    return DepthFold(tuple(phases), size, out, top, top + end)
