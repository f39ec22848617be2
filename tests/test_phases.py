"""The stride-phase decomposition of dX (dsl.compute.phases.axis_phases) against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tvm_convgrad import build, dsl, layout
from tvm_convgrad.dsl.compute.phases import axis_phases
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
