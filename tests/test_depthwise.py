"""The depthwise path (``Cin/groups == 1``): channels on the lanes, same signatures, layouts, results.

Every own-group entry of dW and every dX element equals the float64 reference (and PyTorch); the
cross-slot entries of TBE's dW blocks, which TBE computes as cross-group correlations nobody
reads, are 0 on this path (``reference.own_group_entries``).
"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_convgrad import build, dsl, isa_target, layout, reference
from tvm_convgrad.dsl.compute import cube_util
from tvm_convgrad.params import out_size
from tvm_convgrad.tvm import placeholder
from tvm_convgrad.tools.verify import check_kernel, kernel_arrays, random_inputs

from conftest import RUNNABLE_ISAS, assert_within_bound, native_first, needs_torch, tiered, torch_filter_grad, torch_input_grad

# (n, channels, h, w, multiplier, k, stride, pads, dilation)
CASES = [
    (1, 144, 14, 14, 1, 3, 1, (1, 1, 1, 1), 1),  # MobileNetV2-like, 9 blocks of 16
    (2, 144, 13, 11, 1, 3, 2, (1, 1, 1, 1), 1),  # stride 2, odd sizes
    (2, 24, 9, 11, 2, 3, 2, (1, 0, 2, 1), 1),  # multiplier 2, asymmetric pads
    (1, 5, 7, 7, 3, 3, 1, (2, 2, 2, 2), 2),  # 5 channels (one partial block), multiplier 3, dilation 2
    (3, 40, 8, 8, 1, 5, 1, (2, 2, 2, 2), 1),  # 5x5 kernel, batch 3
    (1, 32, 10, 9, 1, 1, 1, (0, 0, 0, 0), 1),  # 1x1, no padding: inputs read in place
    (2, 17, 12, 12, 2, 7, 3, (3, 2, 1, 3), 1),  # 7x7 stride 3, 17 channels
]


def _ids(case):
    n, c, h, w, m, k, s, p, d = case
    return f"n{n}_c{c}x{m}_{h}x{w}_k{k}_s{s}_d{d}_p{''.join(map(str, p))}"


def _filter_grad(case, name="dw_depthwise"):
    n, c, h, w, m, k, s, p, d = case
    ho, wo = out_size(h, k, s, p[0], p[1], d), out_size(w, k, s, p[2], p[3], d)
    x = placeholder(layout.shape_5hd(n, c, h, w), name="x", dtype="float16")
    dy = placeholder(layout.shape_5hd(n, c * m, ho, wo), name="dy", dtype="float16")
    para = {"strides": [s, s], "padding": list(p), "dilations": [1, 1, d, d], "groups": c, "kernel_name": name}
    return dsl.conv2d_backprop_filter(x, dy, [c * m, 1, k, k], para)


def _input_grad(case, name="dx_depthwise"):
    n, c, h, w, m, k, s, p, d = case
    ho, wo = out_size(h, k, s, p[0], p[1], d), out_size(w, k, s, p[2], p[3], d)
    sizes = [c * m, 1, k, k]
    filters = placeholder(layout.shape_fracz(sizes, c), name="filters", dtype="float16")
    dy = placeholder(layout.shape_5hd(n, c * m, ho, wo), name="dy", dtype="float16")
    para = {"strides": [s, s], "padding": list(p), "dilations": [1, 1, d, d], "group_dict": cube_util.calculate_group(sizes, c), "kernel_name": name}
    return dsl.conv2d_backprop_input(filters, dy, sizes, [n, c, h, w], para)


@pytest.mark.parametrize("isa", native_first(RUNNABLE_ISAS))
@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i < 3, _ids))
def test_depthwise_gradients_match_the_reference(case, isa):
    for make in (_filter_grad, _input_grad):
        kernel = build(make(case), target=isa_target(isa))
        assert kernel.formulation == "depthwise"
        check = check_kernel(kernel, seed=7)
        assert check.ok, f"{make.__name__}: {check}"


@pytest.mark.parametrize("case", CASES[:4], ids=_ids)
def test_dw_holds_the_gradient_on_each_blocks_diagonal_and_zero_elsewhere(case):
    kernel = build(_filter_grad(case))
    params = kernel.params
    g = params.geom
    inputs = random_inputs(params, seed=11)
    result = kernel(*kernel_arrays(params, inputs)).astype(np.float64)
    own = reference.own_group_entries(g.filter_sizes, g.groups)
    assert (result[~own] == 0).all(), "cross-slot entries are written as 0"
    tbe = reference.conv2d_backprop_filter_tbe(inputs.x, inputs.dy, g.filter_sizes, g.strides, g.pads, g.dilations, g.groups)
    assert np.abs(tbe[~own]).max() > 0.1, "TBE's cube would hold correlations there (the test could not tell)"
    oihw = layout.dw_result_to_oihw(result, g.filter_sizes, g.groups)
    assert_within_bound(oihw, reference.conv2d_backprop_filter(inputs.x, inputs.dy, (g.kh, g.kw), g.strides, g.pads, g.dilations, g.groups), params)


def test_dx_reads_only_the_diagonal_of_the_fracz_g_weight():
    """TBE's TransData zero-fills a depthwise FracZ_g block off its diagonal; the depthwise dX
    reads only the diagonal, so what lies elsewhere (here: noise) does not change dX."""
    kernel = build(_input_grad(CASES[0]))
    params = kernel.params
    inputs = random_inputs(params, seed=5)
    filters, dy = kernel_arrays(params, inputs)
    noisy = filters.copy()
    off = ~layout.oihw_to_fracz(np.ones(params.geom.filter_sizes), params.geom.groups).astype(bool)
    noisy[off] = np.random.default_rng(0).uniform(-1, 1, off.sum()).astype(noisy.dtype)
    np.testing.assert_array_equal(kernel(filters, dy), kernel(noisy, dy))


def test_only_one_channel_per_group_with_several_groups_is_depthwise():
    assert build(_filter_grad((1, 32, 8, 8, 1, 3, 1, (1, 1, 1, 1), 1), "dw_dwise")).formulation == "depthwise"
    one_channel = dsl.conv2d_backprop_filter(
        placeholder(layout.shape_5hd(1, 1, 8, 8), name="x", dtype="float16"),
        placeholder(layout.shape_5hd(1, 16, 8, 8), name="dy", dtype="float16"),
        [16, 1, 3, 3], {"strides": [1, 1], "padding": [1, 1, 1, 1], "groups": 1, "kernel_name": "one_channel"},
    )  # fmt: skip
    assert build(one_channel).formulation == "cout-lanes"  # Cin = 1, groups = 1: the first-layer path
    grouped = dsl.conv2d_backprop_filter(
        placeholder(layout.shape_5hd(1, 32, 8, 8), name="x", dtype="float16"),
        placeholder(layout.shape_5hd(1, 32, 8, 8), name="dy", dtype="float16"),
        [32, 2, 3, 3], {"strides": [1, 1], "padding": [1, 1, 1, 1], "groups": 16, "kernel_name": "grouped_2"},
    )  # fmt: skip
    assert build(grouped).formulation == "cube"


@needs_torch
@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i == 0, _ids))
def test_depthwise_against_pytorch(case):
    dw_kernel = build(_filter_grad(case))
    params = dw_kernel.params
    g = params.geom
    inputs = random_inputs(params, seed=3)
    dw = layout.dw_result_to_oihw(dw_kernel(*kernel_arrays(params, inputs)), g.filter_sizes, g.groups)
    assert_within_bound(dw, torch_filter_grad(inputs.x, inputs.dy, g), params, "dW vs torch")
    dx_kernel = build(_input_grad(case))
    params = dx_kernel.params
    dx = layout.dx_result_to_nchw(dx_kernel(*kernel_arrays(params, inputs)), list(g.input_sizes))
    assert_within_bound(dx, torch_input_grad(inputs.w, inputs.dy, g), params, "dX vs torch")
