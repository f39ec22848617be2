"""The float64 references against direct loops over the spec's formulas, and against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_convgrad import layout, reference
from tvm_convgrad.params import ConvGeometry, out_size

from conftest import needs_torch, torch_filter_grad, torch_input_grad

CASES = [  # (N, Cin, H, W, Cout, KH, KW, strides, pads, dilations, groups)
    (2, 4, 7, 6, 6, 3, 2, (2, 1), (1, 0, 2, 1), (1, 2), 2),
    (1, 3, 5, 5, 3, 2, 2, (1, 1), (2, 1, 0, 3), (2, 1), 3),
    (2, 2, 6, 7, 4, 1, 3, (3, 2), (0, 2, 1, 1), (1, 1), 1),
]


def _data(case, seed=0):
    n, cin, h, w, cout, kh, kw, s, p, d, g = case
    rng = np.random.default_rng(seed)
    ho, wo = out_size(h, kh, s[0], p[0], p[1], d[0]), out_size(w, kw, s[1], p[2], p[3], d[1])
    return rng.standard_normal((n, cin, h, w)), rng.standard_normal((cout, cin // g, kh, kw)), rng.standard_normal((n, cout, ho, wo))


def _loops(x, w, dy, s, p, d, g):
    """dW and dX straight from spec §2.4 / §3.4, one term at a time."""
    n_n, cin, h_n, w_n = x.shape
    cout, cin_g, kh_n, kw_n = w.shape
    _, _, ho_n, wo_n = dy.shape
    dw, dx = np.zeros(w.shape), np.zeros(x.shape)
    for n, co, ho, wo, ci, kh, kw in np.ndindex(n_n, cout, ho_n, wo_n, cin_g, kh_n, kw_n):
        c = (co // (cout // g)) * cin_g + ci
        i, j = ho * s[0] + kh * d[0] - p[0], wo * s[1] + kw * d[1] - p[2]
        if 0 <= i < h_n and 0 <= j < w_n:
            dw[co, ci, kh, kw] += dy[n, co, ho, wo] * x[n, c, i, j]
            dx[n, c, i, j] += dy[n, co, ho, wo] * w[co, ci, kh, kw]
    return dw, dx


@pytest.mark.parametrize("case", CASES)
def test_reference_against_loops(case):
    x, w, dy = _data(case)
    *_, kh, kw, s, p, d, g = case
    dw_loop, dx_loop = _loops(x, w, dy, s, p, d, g)
    np.testing.assert_allclose(reference.conv2d_backprop_filter(x, dy, (kh, kw), s, p, d, g), dw_loop, atol=1e-12)
    np.testing.assert_allclose(reference.conv2d_backprop_input(w, dy, x.shape[2:], s, p, d, g), dx_loop, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("case", CASES)
def test_reference_against_torch(case):
    x, w, dy = _data(case, seed=1)
    n, cin, h, wd, cout, kh, kw, s, p, d, g = case
    geom = ConvGeometry(n, cin, h, wd, cout, kh, kw, dy.shape[2], dy.shape[3], s, p, d, g)
    np.testing.assert_allclose(reference.conv2d_backprop_filter(x, dy, (kh, kw), s, p, d, g), torch_filter_grad(x, dy, geom), atol=1e-12)
    np.testing.assert_allclose(reference.conv2d_backprop_input(w, dy, (h, wd), s, p, d, g), torch_input_grad(w, dy, geom), atol=1e-12)


def test_tbe_dw_result_holds_cross_slot_correlations():
    """groups = 4, 4 channels each: one extended group of mag 4; off-diagonal slots correlate groups."""
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((2, 16, 5, 5)), rng.standard_normal((2, 16, 3, 3))
    full = reference.conv2d_backprop_filter_tbe(x, dy, (16, 4, 3, 3), groups=4)
    assert full.shape == layout.shape_dw_result((16, 4, 3, 3), 4) == (1, 9, 16, 16)
    np.testing.assert_allclose(layout.dw_result_to_oihw(full, (16, 4, 3, 3), 4), reference.conv2d_backprop_filter(x, dy, (3, 3), groups=4))
    # dy channel 1 (group 0) against x channel 9 (group 2) at tap (2, 1): a genuine correlation.
    expected = sum(dy[n, 1, i, j] * x[n, 9, i + 2, j + 1] for n in range(2) for i in range(3) for j in range(3))
    assert full[0, layout.fracz_row(0, 2, 1, 3, 3), 1, 9] == pytest.approx(expected)


def test_live_taps_are_the_taps_that_read_the_input():
    """``live_taps`` against enumeration of every output's reads, over small axes with padding past
    the input, dilations, strides; and the cropped call of ``Conv2dGradients`` keeps the output."""
    from itertools import product

    from tvm_convgrad.frontends.conv2d import Conv2dGradients
    from tvm_convgrad.params.geometry import live_taps

    checked = cropped = 0
    for size, kernel, stride, before, after, dilation in product(range(1, 7), range(1, 5), range(1, 4), range(0, 9, 2), range(0, 9, 3), range(1, 8, 3)):
        outputs = (size + before + after - (kernel - 1) * dilation - 1) // stride + 1
        if outputs < 1:
            continue
        reads = [k for k in range(kernel) if any(0 <= o * stride + k * dilation - before < size for o in range(outputs))]
        assert live_taps(size, kernel, stride, before, after, dilation) == ((reads[0], reads[-1]) if reads else None)
        checked += 1
        call = Conv2dGradients((1, 2, size, 3), (2, 2, kernel, 1), (stride, 1), (before, after, 0, 0), (dilation, 1), 1, "float32")
        crop = call.cropped()
        if crop is not None:
            cropped += 1
            assert crop[0].y_shape == call.y_shape and crop[1] == slice(reads[0], reads[-1] + 1)
    assert checked > 1000 and cropped > 100
