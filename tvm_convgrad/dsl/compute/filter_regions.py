"""dW by live-tap regions: which taps of a 2-D dW sum over which outputs, and its result from them.

Where an axis's taps read x's zero padding in enough of their (output, tap) pairs (DeepLab's
atrous layers; a 3x3 at pad 1 on a 1x1 map), the taps are grouped by the outputs whose windows
read real x (:func:`.phases.filter_tap_runs`); each group ``(row taps, column taps)`` is a mad of
its own (:func:`.backprop_filter._cube_mads`) and the result picks each tap's weight from its
group's mad (:func:`from_tap_regions`). The products left out are zeros: the sums are the same.
"""

from __future__ import annotations

from tvm import te, tirx

from ... import layout
from ...params import ConvGeometry
from .common import ACC, first_holding
from .phases import AxisPhase, filter_tap_runs, whole_axis

__all__ = ["FILTER_MIN_SAVED", "FILTER_SPLIT_BELOW", "from_tap_regions", "read_span", "tap_region_grid"]

FILTER_SPLIT_BELOW = 0.8
"""dW runs by live-tap regions (:func:`tap_region_grid`) where an axis's taps read real x in fewer
than this share of their (output, tap) pairs: DeepLab's ASPP (3x3 at rates 6 / 12 / 18 on 14x14,
71% / 43% / 33% per axis), a 3x3 at pad 1 on a 1x1 map (or a 2x2 one of a large batch); not a 3x3 at pad 1 on 7x7 or a rate-2
layer on 14x14 (90%: one mad per tap re-reads x and dy for each, 512 -> 512 on 7x7 N=8 7% slower;
the rate-2 layer 4-14% faster). Zen 4, f32 NCHW, whole against regions: ASPP N=4 r6 54.5 ->
35.7 ms, r12 74.5 -> 28.7, r18 125.7 -> 31.2 (PyTorch 51.3, 87.0, 100.3); 512 on 1x1 N=32 3.95
-> 1.98, 256 on 2x2 N=32 1.43 -> 1.23."""
FILTER_MIN_SAVED = 128
"""... and where the regions are more than one, only if they leave out at least this many
products per weight element: their result selects each weight from its tap's mad, where the
whole mad's is written from cache inside its tasks (512 -> 512 on 2x2, N=8: 17.8 products per
weight left out, whole 3.1 ms, regions 5.3; 256 on 2x2, N=32: 71, either way between runs, 1.43
-> 1.23 and 1.97 -> 2.09; ASPP r6 N=4: 384). One region (a 1x1 map's centre tap, ASPP r18's)
always pays: one mad over fewer taps (512 on 1x1, N=8: 2.59 -> 1.51 ms)."""


def tap_region_grid(g: ConvGeometry) -> list[tuple[AxisPhase, AxisPhase]] | None:
    """The ``(row, column)`` live-tap regions of a 2-D dW whose windows read x's zero padding in
    enough of their (output, tap) pairs (:func:`.phases.filter_tap_runs`, each axis below
    :data:`FILTER_SPLIT_BELOW`): each region's taps sum over the outputs that read real x
    only; None where neither axis splits."""
    (sh, sw), (dh, dw), (pt, _, pl, _) = g.strides, g.dilations, g.pads
    rows = filter_tap_runs(g.ho, g.kh, sh, pt, dh, g.h, FILTER_SPLIT_BELOW)
    cols = filter_tap_runs(g.wo, g.kw, sw, pl, dw, g.w, FILTER_SPLIT_BELOW)
    if rows is None and cols is None:
        return None
    rows = rows if rows is not None else [whole_axis(g.ho, g.kh)]
    cols = cols if cols is not None else [whole_axis(g.wo, g.kw)]
    grid = [(ph, pw) for ph in rows for pw in cols]
    live = sum(ph.taps * pw.taps * ph.count * pw.count for ph, pw in grid)
    saved = (g.kh * g.kw * g.ho * g.wo - live) * g.batch / (g.kh * g.kw)  # products per weight the regions leave out
    return grid if len(grid) == 1 or saved >= FILTER_MIN_SAVED else None


def from_tap_regions(regions: list, mads: list[te.Tensor], g: ConvGeometry):
    """TBE's ``dw[grp, (c1,kh,kw), co, ci0]`` from the mad of the region holding tap ``(kh, kw)``
    (0 for a tap that reads padding only)."""
    def value(grp, fkk, co, ci0):
        c1, kh, kw = layout.split_fracz_row(fkk, g.kh, g.kw)
        choices = []
        for (ph, pw), mad in zip(regions, mads):
            conds = [kh >= ph.tap0, kh < ph.tap0 + ph.taps, kw >= pw.tap0, kw < pw.tap0 + pw.taps]
            row = layout.fracz_row(c1, kh - ph.tap0, kw - pw.tap0, ph.taps, pw.taps)
            choices.append((conds, mad[grp, row, co, ci0].asobject()))
        return first_holding(choices, tirx.const(0.0, ACC))

    return value


def read_span(regions: list, axis: int, stride: int, dilation: int, per_phase: int) -> tuple[int, int]:
    """``(first, count)`` of the packed positions the live-tap ``regions``' windows read along
    ``axis`` (0 rows, 1 columns): from the first region output's first tap to the last one's
    last; all of them (``(0, per_phase)``) on a strided axis, whose pack is split by phase."""
    if stride != 1:
        return 0, per_phase
    spans = {r[axis] for r in regions}
    first = min(p.first + p.tap0 * dilation for p in spans)
    last = max(p.first + p.count - 1 + (p.tap0 + p.taps - 1) * dilation for p in spans)
    return first, last + 1 - first
