"""The stride-phase decomposition of dX (dsl.compute.phases.axis_phases) against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tvm_convgrad import build, dsl, layout
from tvm_convgrad.dsl.compute.phases import LIVE_TAPS_SPLIT_BELOW, MAX_REGIONS, axis_phases, filter_tap_runs, live_tap_regions, output_runs, region_grid, tap_hull
from tvm_convgrad.tvm import placeholder
from tvm_convgrad.tools.verify import check_kernel


def _brute(size, kernel, stride, pad, dilation):
    """Every (output position, tap, dy position) of the transposed convolution along one axis."""
    return {
        (h, k, (h + pad - k * dilation) // stride)
        for h in range(size)
        for k in range(kernel)
        if (h + pad - k * dilation) % stride == 0
    }


def _from_phases(size, kernel, stride, pad, dilation):
    triples = set()
    for p in axis_phases(size, kernel, stride, pad, dilation):
        for j, m in itertools.product(range(p.count), range(p.taps)):
            triples.add((p.first + j * stride, p.tap(m), p.dy_index(j, m, 0)))
    return triples


@pytest.mark.parametrize("size, kernel, stride, pad, dilation", [
    (size, kernel, stride, pad, dilation)
    for size, kernel, stride, pad, dilation in itertools.product((1, 5, 8), (1, 2, 3, 7), (1, 2, 3, 4), (0, 1, 3), (1, 2, 3))
])  # fmt: skip
def test_phases_cover_every_tap_exactly_once(size, kernel, stride, pad, dilation):
    phases = axis_phases(size, kernel, stride, pad, dilation)
    assert _from_phases(size, kernel, stride, pad, dilation) == _brute(size, kernel, stride, pad, dilation)
    taps = sum(p.count * p.taps for p in phases)
    assert taps == len(_brute(size, kernel, stride, pad, dilation)), "no (position, tap) pair twice"
    assert len({p.first for p in phases}) == len(phases) and all(p.first < stride for p in phases)


def test_stride_one_is_a_single_phase():
    (p,) = axis_phases(9, 3, 1, 1, 2)
    assert (p.first, p.count, p.tap0, p.taps, p.tap_step, p.base, p.dy_step) == (0, 9, 0, 3, 1, 1, 2)


def test_no_tap_reaches_any_pixel():
    """H = W = 1, pads 1 before, 1x1 kernel, stride 2: the one pixel only meets padding; dX = 0."""
    filters = placeholder((1, 1, 16, 16), name="filters", dtype="float16")
    dy = placeholder((1, 1, 1, 1, 16), name="dy", dtype="float16")
    para = {"strides": [2, 2], "padding": [1, 0, 1, 0], "dilations": [1, 1, 1, 1], "res_dtype": "float32"}
    kernel = build(dsl.conv2d_backprop_input(filters, dy, (16, 16, 1, 1), (1, 16, 1, 1), para))
    result = kernel(np.ones((1, 1, 16, 16), "float16"), np.ones((1, 1, 1, 1, 16), "float16"))
    assert result.shape == layout.shape_dx_result((1, 16, 1, 1)) and not result.any()
    assert check_kernel(kernel).ok


def _dy_extent(size, kernel, stride, pad, dilation):
    """dy's positions along the axis (pads ``pad`` before and after)."""
    return (size + 2 * pad - (kernel - 1) * dilation - 1) // stride + 1


@pytest.mark.parametrize("size, kernel, stride, pad, dilation", [
    (size, kernel, stride, pad, dilation)
    for size, kernel, stride, pad, dilation in itertools.product((5, 10, 14), (2, 3, 5), (1, 2, 3), (0, 2, 6, 12), (1, 2, 4, 6, 12))
    if _dy_extent(size, kernel, stride, pad, dilation) > 0
])  # fmt: skip
def test_live_tap_regions_keep_exactly_the_taps_that_read_dy(size, kernel, stride, pad, dilation):
    """Regions or phases, every (output, tap) pair that reads real dy is there exactly once, and no
    pair the stride phases do not have; a split axis has at most ``MAX_REGIONS`` regions and
    multiplies fewer pairs than its phases; each output lies in one region at most."""
    extent = _dy_extent(size, kernel, stride, pad, dilation)
    phases = axis_phases(size, kernel, stride, pad, dilation)
    regions = live_tap_regions(phases, stride, extent)
    live = {(h, k, y) for h, k, y in _brute(size, kernel, stride, pad, dilation) if 0 <= y < extent}
    pairs = [(r.first + j * stride, r.tap(m), r.dy_index(j, m, 0)) for r in regions for j in range(r.count) for m in range(r.taps)]
    assert live <= set(pairs) and len(pairs) == len(set(pairs))
    if regions is not phases:
        assert len(regions) <= MAX_REGIONS and len(pairs) < LIVE_TAPS_SPLIT_BELOW * sum(p.count * p.taps for p in phases)
        brute = {(h, k, y) for h, k, y in _brute(size, kernel, stride, pad, dilation)}
        assert set(pairs) <= brute, "a region meets a tap its stride phase does not"
    outputs = [r.first + j * stride for r in regions for j in range(r.count)]
    assert len(outputs) == len(set(outputs)) and all(o < size for o in outputs)


def test_an_atrous_axis_runs_as_its_interior_and_borders():
    """DeepLab's ASPP rate 6 on 14 rows: rows 0-5 meet taps 0-1, rows 6-7 all three, rows 8-13 taps
    1-2; a rate-12 axis keeps one tap for its ten inner rows; a 3x3 at pad 1 splits on 14 rows
    (first and last row two taps), not on 28 (97.6% of its pairs live); a row band of one row
    takes the column phases whole (no corner of one pixel)."""
    regions = live_tap_regions(axis_phases(14, 3, 1, 6, 6), 1, 14)
    assert [(r.first, r.count, r.tap0, r.taps) for r in regions] == [(0, 6, 0, 2), (6, 2, 0, 3), (8, 6, 1, 2)]
    assert [(r.first, r.count, r.tap0, r.taps) for r in live_tap_regions(axis_phases(14, 3, 1, 12, 12), 1, 14)] == [(0, 2, 0, 2), (2, 10, 1, 1), (12, 2, 1, 2)]
    assert [(r.first, r.count, r.tap0, r.taps) for r in live_tap_regions(axis_phases(14, 3, 1, 1, 1), 1, 14)] == [(0, 1, 0, 2), (1, 12, 0, 3), (13, 1, 1, 2)]
    plain = axis_phases(28, 3, 1, 1, 1)
    assert live_tap_regions(plain, 1, 28) is plain
    rows = cols = live_tap_regions(axis_phases(7, 3, 1, 1, 1), 1, 7)
    grid = region_grid(rows, axis_phases(7, 3, 1, 1, 1), cols)
    assert [(ph.count, pw.count) for ph, pw in grid] == [(1, 7), (5, 1), (5, 5), (5, 1), (1, 7)]


def test_a_tiny_map_splits_into_one_region_per_pixel_with_its_live_taps():
    """A 3x3 at pad 1 on a 1x1 map: one region, the centre tap (the forward's weight pack holds
    only :func:`tap_hull`'s taps); on a 2x2 map four one-pixel regions of 2x2 taps each (a map
    of at most ``TINY_MAP`` pixels is not held to bands of ``MIN_BAND`` rows), whose hull is all
    three taps; a 3x3 map keeps its one-row bands' columns whole."""
    centre = output_runs(1, 3, 1, 1, 1, 1)
    grid = region_grid(centre, [None], centre)
    assert [(ph.first, ph.count, ph.tap0, ph.taps, pw.tap0, pw.taps) for ph, pw in grid] == [(0, 1, 1, 1, 1, 1)]
    assert tap_hull([ph for ph, _ in grid]) == range(1, 2)
    runs = output_runs(2, 3, 1, 1, 1, 2)
    grid = region_grid(runs, [None], runs)
    assert [(ph.first, pw.first, ph.taps, pw.taps) for ph, pw in grid] == [(0, 0, 2, 2), (0, 1, 2, 2), (1, 0, 2, 2), (1, 1, 2, 2)]
    assert tap_hull(runs) == range(0, 3)
    runs = output_runs(3, 3, 1, 1, 1, 3)
    assert [(ph.count, pw) for ph, pw in region_grid(runs, ["whole"], runs)] == [(1, "whole")] * 3


def test_a_kernel_as_large_as_its_map_splits_into_few_regions():
    """benchdnn's ``shapes_3d`` 192^3 kernel on a 192^3 map (one output): each row meets one tap of
    its own; merged into ``MAX_REGIONS`` runs of consecutive rows, each with the taps of its
    rows (a fifth of the products), not 192 one-tap regions."""
    regions = live_tap_regions(axis_phases(192, 192, 1, 0, 1), 1, 1)
    assert len(regions) == MAX_REGIONS and sum(r.count for r in regions) == 192
    assert all(r.tap0 == r.first and r.taps == r.count for r in regions)  # row h meets tap h


@pytest.mark.parametrize("out, kernel, stride, pad, dilation, size", [
    (out, kernel, stride, pad, dilation, size)
    for size, kernel, stride, pad, dilation in itertools.product((1, 2, 7, 14), (1, 3, 5), (1, 2), (0, 1, 6, 12), (1, 2, 6, 12))
    if (out := (size + 2 * pad - (kernel - 1) * dilation - 1) // stride + 1) > 0
])  # fmt: skip
def test_filter_tap_runs_sum_each_tap_over_exactly_the_outputs_that_read_x(out, kernel, stride, pad, dilation, size):
    """dW's live-tap regions along one axis: every (output, tap) pair whose window reads real x is
    summed exactly once, in the run of its tap, and no pair outside the axis; a split multiplies
    fewer pairs than ``split_below`` of all; taps that read padding only are in no run."""
    runs = filter_tap_runs(out, kernel, stride, pad, dilation, size)
    live = {(j, k) for j in range(out) for k in range(kernel) if 0 <= j * stride - pad + k * dilation < size}
    if runs is None:
        assert len(live) >= LIVE_TAPS_SPLIT_BELOW * out * kernel
        return
    pairs = [(r.first + j, r.tap0 + m) for r in runs for j in range(r.count) for m in range(r.taps)]
    assert live <= set(pairs) and len(pairs) == len(set(pairs)) and all(0 <= j < out and 0 <= k < kernel for j, k in pairs)
    assert len(runs) <= MAX_REGIONS and len(pairs) < LIVE_TAPS_SPLIT_BELOW * out * kernel
    taps = [r.tap0 + m for r in runs for m in range(r.taps)]
    assert len(taps) == len(set(taps)) and {k for _, k in live} <= set(taps)


def test_an_atrous_filter_axis_sums_each_tap_over_its_live_outputs():
    """ASPP rate 6 on 14 rows: tap 0 reads x at rows 6-13, tap 1 at all, tap 2 at rows 0-7; at
    rate 18 only the centre tap reads x (the others' dW is 0); a 3x3 at pad 1 on 56 rows does
    not split."""
    runs = filter_tap_runs(14, 3, 1, 6, 6, 14)
    assert [(r.tap0, r.taps, r.first, r.count) for r in runs] == [(0, 1, 6, 8), (1, 1, 0, 14), (2, 1, 0, 8)]
    assert [(r.tap0, r.taps, r.first, r.count) for r in filter_tap_runs(14, 3, 1, 18, 18, 14)] == [(1, 1, 0, 14)]
    assert filter_tap_runs(56, 3, 1, 1, 1, 56) is None
