"""Randomized sweep: both gradients, built for LLVM, against the float64 reference and PyTorch.

The sweep covers strides 1-3, dilations 1-2, asymmetric pads (including pads past the kernel's
reach: dX's crop case), KH != KW, H != W, groups {1, 2, 3, 4, 16, 32, depthwise}, channel counts
that are not multiples of 16, batch 1-3 and both result dtypes. Each kernel is compared element
by element with the reference (the whole TBE-layout result: dW's cross-slot blocks, dX's pad
channels) and, with PyTorch installed, its OIHW / NCHW view with ``torch.nn.grad``. The reference
comparisons run once per vector-ISA plan this host can execute (``RUNNABLE_ISAS``: on an AVX-512
machine the AVX-512, AVX2 and SSE schedules), since each plan tiles differently.
"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_convgrad import build, dsl, isa_target, layout
from tvm_convgrad.tvm import placeholder
from tvm_convgrad.tools.verify import check_kernel, kernel_arrays, random_inputs

from conftest import RUNNABLE_ISAS, assert_within_bound, native_first, needs_torch, tiered, torch_filter_grad, torch_input_grad
from tbe_calls import case_id, dw_result, dx_result, geometry

GROUP_KINDS = (1, 2, 3, 4, 16, 32, "depthwise")


def _random_case(rng: np.random.Generator, kind) -> dict:
    if kind == "depthwise":
        channels = int(rng.choice([5, 16, 24, 40]))
        groups, cin_g, cout_g = channels, 1, int(rng.integers(1, 3))
    else:
        groups = kind
        limit = 24 if groups <= 4 else 5
        cin_g, cout_g = (int(v) for v in rng.integers(1, limit + 1, 2))
    kh, kw = (int(v) for v in rng.integers(1, 5, 2))
    sh, sw = (int(v) for v in rng.integers(1, 4, 2))
    dh, dw = (int(v) for v in rng.integers(1, 3, 2))
    khd, kwd = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    pads = [int(rng.integers(0, khd + 2)), int(rng.integers(0, khd + 1)), int(rng.integers(0, kwd + 2)), int(rng.integers(0, kwd + 1))]
    h = int(rng.integers(max(khd - pads[0] - pads[1], 1), max(khd - pads[0] - pads[1], 1) + 9))
    w = int(rng.integers(max(kwd - pads[2] - pads[3], 1), max(kwd - pads[2] - pads[3], 1) + 9))
    return {
        "n": int(rng.integers(1, 4)), "cin": groups * cin_g, "h": h, "w": w, "cout": groups * cout_g,
        "k": (kh, kw), "strides": (sh, sw), "pads": pads, "dilations": (dh, dw), "groups": groups,
        "res_dtype": str(rng.choice(["float32", "float16"])), "bias": bool(rng.random() < 0.25),
    }  # fmt: skip


def _cases() -> list[dict]:
    rng = np.random.default_rng(20261121)
    cases = [_random_case(rng, kind) for _ in range(6) for kind in GROUP_KINDS]
    # Named corners the random draw might miss.
    base = {"n": 2, "res_dtype": "float32", "bias": False}
    cases += [
        {**base, "cin": 16, "h": 5, "w": 6, "cout": 16, "k": (1, 1), "strides": (1, 1), "pads": [2, 0, 0, 3], "dilations": (1, 1), "groups": 1},  # crop
        {**base, "cin": 72, "h": 7, "w": 5, "cout": 48, "k": (3, 2), "strides": (2, 1), "pads": [1, 1, 0, 1], "dilations": (1, 1), "groups": 3},  # mag 2 of 3
        {**base, "cin": 32, "h": 9, "w": 9, "cout": 64, "k": (1, 1), "strides": (2, 2), "pads": [0, 0, 0, 0], "dilations": (1, 1), "groups": 1},  # 1x1 s2
        {**base, "cin": 19, "h": 11, "w": 13, "cout": 38, "k": (3, 3), "strides": (3, 2), "pads": [2, 1, 0, 2], "dilations": (2, 2), "groups": 19},
        {**base, "cin": 144, "h": 9, "w": 8, "cout": 144, "k": (3, 3), "strides": (2, 2), "pads": [1, 1, 1, 1], "dilations": (1, 1), "groups": 144},
        {**base, "n": 1, "cin": 3, "h": 15, "w": 14, "cout": 20, "k": (7, 7), "strides": (2, 2), "pads": [3, 3, 3, 3], "dilations": (1, 1), "groups": 1},
    ]  # fmt: skip
    return cases


CASES = _cases()


def test_sweep_covers_the_parameter_space():
    assert {c["groups"] if c["cin"] != c["groups"] or c["groups"] == 1 else "depthwise" for c in CASES} >= set(GROUP_KINDS)
    assert {s for c in CASES for s in c["strides"]} == {1, 2, 3}
    assert {d for c in CASES for d in c["dilations"]} == {1, 2}
    assert any(c["pads"][0] != c["pads"][1] or c["pads"][2] != c["pads"][3] for c in CASES)
    assert any(c["pads"][0] > (c["k"][0] - 1) * c["dilations"][0] for c in CASES), "a dX crop case"
    assert any(c["k"][0] != c["k"][1] for c in CASES) and any(c["h"] != c["w"] for c in CASES)
    assert any(c["cin"] % 16 and c["cout"] % 16 for c in CASES)
    assert {c["n"] for c in CASES} == {1, 2, 3}
    assert {c["res_dtype"] for c in CASES} == {"float32", "float16"}


FAST = tiered(CASES, lambda i, c: i < len(GROUP_KINDS), case_id)  # the fast tier: every group kind once


@pytest.mark.parametrize("isa", native_first(RUNNABLE_ISAS))
@pytest.mark.parametrize("case", FAST)
def test_conv2d_backprop_filter(case, isa):
    kernel = build(dw_result(case), target=isa_target(isa))
    check = check_kernel(kernel, seed=1)
    assert check.ok, str(check)
    assert kernel.output.shape == layout.shape_dw_result(geometry(case)[0], case["groups"])


@pytest.mark.parametrize("isa", native_first(RUNNABLE_ISAS))
@pytest.mark.parametrize("case", FAST)
def test_conv2d_backprop_input(case, isa):
    kernel = build(dx_result(case), target=isa_target(isa))
    check = check_kernel(kernel, seed=2)
    assert check.ok, str(check)
    assert kernel.output.shape == layout.shape_dx_result([case["n"], case["cin"], case["h"], case["w"]])


@needs_torch
@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i < 2, case_id))
def test_against_pytorch(case):
    """The OIHW / NCHW views of both results against torch.nn.grad (an independent oracle)."""
    filter_sizes, para, dy = geometry(case)
    groups = case["groups"]
    x = placeholder(layout.shape_5hd(case["n"], case["cin"], case["h"], case["w"]), name="x", dtype="float16")
    dw_kernel = build(dsl.conv2d_backprop_filter(x, dy, filter_sizes, {**para, "groups": groups}))
    params = dw_kernel.params
    inputs = random_inputs(params, seed=3)
    dw = layout.dw_result_to_oihw(dw_kernel(*kernel_arrays(params, inputs)), filter_sizes, groups)
    assert_within_bound(dw, torch_filter_grad(inputs.x, inputs.dy, params.geom), params, "dW vs torch")

    filters = placeholder(layout.shape_fracz(filter_sizes, groups), name="filters", dtype="float16")
    input_sizes = [case["n"], case["cin"], case["h"], case["w"]]
    dx_kernel = build(dsl.conv2d_backprop_input(filters, dy, filter_sizes, input_sizes, para))
    params = dx_kernel.params
    dx = layout.dx_result_to_nchw(dx_kernel(*kernel_arrays(params, inputs)), input_sizes)
    assert_within_bound(dx, torch_input_grad(inputs.w, inputs.dy, params.geom), params, "dX vs torch")
