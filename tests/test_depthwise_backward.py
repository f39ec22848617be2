"""Both gradients of a channels-last fp32 depthwise layer in one kernel
(:mod:`tvm_convgrad.schedule.cpu.depthwise_backward`) and the drop-in's use of it.

dX and dW against the float64 references written from the formulas (``tvm_convgrad.reference``),
within fp32's summation bound of each element's own terms; strides, dilations, asymmetric and
oversized pads, even and non-square kernels, maps smaller than a band, on every ISA plan this host
runs and compiled for AArch64; every argument flush against a ``PROT_NONE`` page; the PyTorch
drop-in's Python and C++ nodes run it and give the same bits.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_convgrad import isa_target
from tvm_convgrad.compile import build_func, pass_context, resolve_target
from tvm_convgrad.isa import isa_plan
from tvm_convgrad.schedule.cpu import prefetch
from tvm_convgrad.schedule.cpu.depthwise_backward import (ROWS_AHEAD, DepthwiseBackward, band_rows, depthwise_backward_func,
                                                          rows_ahead)  # fmt: skip

from one_pass import assert_runs_guarded, assert_within_summation_bound, kernels_run, unaligned

from conftest import NEON, RUNNABLE_ISAS, native_first, needs_torch, tiered, torch

# (n, c, h, w, (kh, kw), strides, pads (top, bottom, left, right), dilation, weights_last)
CASES = [
    (2, 32, 12, 12, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False),  # MobileNetV2's stride 1
    (3, 48, 13, 11, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True),  # stride 2, odd sizes, OHWI weights
    (1, 16, 14, 14, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False),  # one image: a row a task
    (4, 16, 4, 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False),  # 4x4 maps: one band an image
    (2, 16, 11, 9, (3, 3), (1, 1), (2, 0, 1, 2), (2, 2), False),  # dilation 2, asymmetric pads
    (2, 32, 10, 13, (7, 7), (3, 3), (3, 2, 1, 3), (1, 1), True),  # 7x7 stride 3
    (1, 16, 9, 10, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), False),  # 5x5
    (1, 16, 2, 3, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),  # a map smaller than the kernel
    (2, 16, 8, 8, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), False),  # 1x1
    (2, 16, 9, 7, (3, 1), (2, 1), (1, 1, 0, 0), (1, 1), False),  # 3x1, strides (2, 1)
    (2, 16, 6, 6, (3, 3), (1, 1), (4, 4, 4, 4), (1, 1), False),  # pads past the kernel: taps and rows of padding only
    (3, 16, 5, 8, (2, 2), (2, 3), (0, 1, 1, 0), (1, 2), True),  # even kernel, mixed strides and dilations
    (2, 16, 7, 7, (3, 3), (4, 4), (0, 0, 0, 0), (1, 1), False),  # stride past the kernel: dX rows no tap reaches
]


def _ids(case):
    n, c, h, w, k, s, p, d, last = case
    return f"n{n}_c{c}_{h}x{w}_k{k[0]}x{k[1]}_s{s[0]}{s[1]}_d{d[0]}{d[1]}_p{''.join(map(str, p))}{'_ohwi' if last else ''}"


def _layer(case, target, cores: int = 2) -> DepthwiseBackward:
    n, c, h, w, (kh, kw), s, p, d, last = case
    return DepthwiseBackward(n, c, h, w, kh, kw, s, p, d, last, isa_plan(target).lanes, cores)


def _run(layer: DepthwiseBackward, target, seed: int = 0):
    """``(x, dy, w, dx, dw)``: NCHW / OIHW float32 inputs and the kernel's results, back in NCHW / OIHW."""
    import tvm

    rng = np.random.default_rng(seed)
    g = layer
    x = rng.standard_normal((g.n, g.c, g.h, g.w), dtype=np.float32)
    dy = rng.standard_normal((g.n, g.c, g.ho, g.wo), dtype=np.float32)
    w = rng.standard_normal((g.c, 1, g.kh, g.kw), dtype=np.float32)
    w_memory = w.transpose(0, 2, 3, 1) if g.weights_last else w  # (OHWI of one input channel: the same memory)
    args = [np.ascontiguousarray(a) for a in (x.transpose(0, 2, 3, 1), dy.transpose(0, 2, 3, 1), w_memory)]
    args += [np.full(args[0].shape, np.nan, np.float32), np.full(w_memory.shape, np.nan, np.float32)]  # (unwritten: NaN)
    tensors = [tvm.runtime.tensor(a) for a in args]
    build_func(depthwise_backward_func(layer), target)(*tensors)
    dx, dw = tensors[3].numpy().transpose(0, 3, 1, 2), tensors[4].numpy()
    return x, dy, w, dx, dw.transpose(0, 3, 1, 2) if g.weights_last else dw


def _assert_exact(layer: DepthwiseBackward, x, dy, w, dx, dw):
    """dX and dW within fp32's summation bound of the float64 references (:mod:`one_pass`)."""
    g = layer
    conv = dict(strides=g.strides, pads=g.pads, dilations=g.dilation, groups=g.c)
    assert_within_summation_bound(x, dy, w, dx, dw, (g.h, g.w), (g.kh, g.kw), conv, (g.kh * g.kw + 1, g.n * g.ho * g.wo + g.cores))


@pytest.mark.parametrize("isa", native_first(RUNNABLE_ISAS))
@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i < 6 or i in (10, 12), _ids))
def test_both_gradients_match_the_reference(case, isa):
    target = isa_target(isa)
    layer = _layer(case, target)
    assert layer.fits()
    _assert_exact(layer, *_run(layer, target))


def test_asking_for_the_rows_ahead_leaves_the_gradients_exact(monkeypatch):
    """Every layer's x a stream (STREAM_BYTES 0: the dW loop asks for dy's and x's lines
    ROWS_AHEAD rows on, past an image's rows into the next, clamped to the tensors' ends): the same
    results within the bound, on this host's plan, every geometry."""
    monkeypatch.setattr(prefetch, "STREAM_BYTES", 0)
    target = isa_target("native")
    for case in CASES:
        layer = _layer(case, target)
        if layer.fits():
            assert rows_ahead(layer) == ROWS_AHEAD
            _assert_exact(layer, *_run(layer, target))


@pytest.mark.parametrize("cores", [1, 3])
def test_any_number_of_parts_sums_the_same_gradients(cores):
    """dW summed in 1 or 3 parts (each its tasks' rows): the same values within the bound."""
    target = isa_target("native")
    layer = _layer(CASES[1], target, cores)
    _assert_exact(layer, *_run(layer, target))


def test_the_kernel_compiles_for_aarch64():
    """NEON's 4 lanes: the same loops, cross-compiled; the taps' sums are ``fmla`` on 4-lane vectors."""
    import tvm

    target = resolve_target(NEON)
    layer = _layer(CASES[0], target)
    with pass_context(target):
        executable = tvm.compile(tvm.IRModule({"depthwise_backward": depthwise_backward_func(layer)}), target=target)
    assert layer.lanes == 4 and re.search(r"\bfmla\s+v\d+\.4s", executable.mod.inspect_source("asm"))


def test_layers_it_does_not_take():
    """Channels not a multiple of the lanes, or a border wider than MAX_BORDER_COLUMNS columns
    (a dilated kernel wider than its input), are left to the separate kernels."""
    assert not DepthwiseBackward(2, 24, 8, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), False, 16, 2).fits()
    assert not DepthwiseBackward(1, 16, 8, 40, 3, 3, (1, 1), (0, 0, 20, 20), (1, 20), False, 16, 2).fits()
    assert DepthwiseBackward(2, 32, 8, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), False, 16, 2).fits()


def test_band_rows_leave_every_core_tasks():
    one_image = DepthwiseBackward(1, 16, 14, 14, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), False, 16, 2)
    batch = DepthwiseBackward(32, 16, 56, 56, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), False, 16, 2)
    assert band_rows(one_image) == 1 and band_rows(batch) == 4


GUARDED = r"""
from tvm_convgrad import reference
from tvm_convgrad.compile import pass_context, resolve_target
from tvm_convgrad.schedule.cpu.depthwise_backward import DepthwiseBackward, depthwise_backward_func
lanes = plan.lanes
for n, c, h, w, k, s, p, d, last in eval(sys.argv[3]):
    layer = DepthwiseBackward(n, c, h, w, *k, s, p, d, last, lanes, 2)
    rng = np.random.default_rng(1)
    weight = (c, *k, 1) if last else (c, 1, *k)
    shapes = [(n, h, w, c), (n, layer.ho, layer.wo, c), weight, (n, h, w, c), weight]
    arrays = [memory.array(shape, np.float32, side) for shape in shapes]
    for a in arrays[:3]:
        a[...] = rng.standard_normal(a.shape, dtype=np.float32)
    print("start", (n, c, h, w, k, s, p, d), flush=True)
    build_func(depthwise_backward_func(layer), target)(*[tvm.runtime.from_dlpack(a) for a in arrays])
    x, dy = arrays[0].transpose(0, 3, 1, 2), arrays[1].transpose(0, 3, 1, 2)
    weight = arrays[2].reshape(c, 1, *k)
    expected = reference.conv2d_backprop_input(weight, dy, (h, w), s, p, d, c)
    assert np.abs(arrays[3].transpose(0, 3, 1, 2) - expected).max() < 1e-3
    expected = reference.conv2d_backprop_filter(x, dy, k, s, p, d, c)
    assert np.abs(arrays[4].reshape(expected.shape) - expected).max() < 1e-3 * max(1.0, np.abs(expected).max())
print("done", flush=True)
"""


@pytest.mark.parametrize("side", ["after", "before"])
def test_the_kernel_reads_and_writes_inside_its_tensors(side):
    """x, dy, the weight, dX and dW each flush against a page mapped ``PROT_NONE`` (after the array,
    then before it): a border column or a clamped row read past an edge faults the child process."""
    assert_runs_guarded(GUARDED, side, CASES)


def _depthwise(channels_last: bool = True, channels: int = 32, stride: int = 1, bias: bool = True):
    """A stock depthwise layer and its drop-in copy (the same parameters)."""
    import copy

    from tvm_convgrad.torch import convert_conv2d

    memory = torch.channels_last if channels_last else torch.contiguous_format
    stock = torch.nn.Conv2d(channels, channels, 3, stride, 1, groups=channels, bias=bias).to(memory_format=memory)
    return stock, convert_conv2d(copy.deepcopy(stock))


@needs_torch
@pytest.mark.parametrize("node", ["python", "cpp"])
def test_the_drop_in_runs_one_kernel_for_a_depthwise_layer(node):
    """A channels-last fp32 depthwise layer's backward is the one kernel, on the Python node and on
    the C++ one: the same bits on both, stock's values within fp32's rounding."""
    from tvm_convgrad.torch import get_backward, native, set_backward

    torch.manual_seed(0)
    stock, ours = _depthwise()
    x = torch.randn(4, 32, 12, 12).contiguous(memory_format=torch.channels_last)
    grad = torch.randn(4, 32, 12, 12).contiguous(memory_format=torch.channels_last)
    previous = get_backward()
    set_backward("ours")
    try:
        results = {}
        for mode in ("off", "on") if node == "cpp" else ("off",):
            native.set_native(mode)
            for _ in range(2):  # (the second call: the C++ node's signature settled)
                names, results[mode] = kernels_run(ours, x, grad)
            assert names == {"tvm_convgrad::conv2d_both_grads"}, names
        if node == "cpp" and native.available():
            for a, b in zip(results["off"], results["on"]):
                assert torch.equal(a, b)
        _, expected = kernels_run(stock, x, grad)
        for got, want in zip(results["off"], expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    finally:
        native.set_native("on")
        set_backward(previous)


@needs_torch
@pytest.mark.parametrize("kind", ["nchw", "bf16", "24-channels"])
def test_other_depthwise_layers_keep_the_two_kernels(kind):
    """NCHW, bf16 and a channel count not a multiple of 16 run the dX and dW kernels as before."""
    from tvm_convgrad.torch import get_backward, set_backward

    stock, ours = _depthwise(channels_last=kind != "nchw", channels=24 if kind == "24-channels" else 32)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    ours = ours.to(dtype)
    memory = torch.contiguous_format if kind == "nchw" else torch.channels_last
    x = torch.randn(2, ours.in_channels, 8, 8, dtype=dtype).contiguous(memory_format=memory)
    previous = get_backward()
    set_backward("ours")
    try:
        names, _ = kernels_run(ours, x, torch.randn(2, ours.in_channels, 8, 8, dtype=dtype).contiguous(memory_format=memory))
    finally:
        set_backward(previous)
    assert names == {"tvm_convgrad::conv2d_input_grad", "tvm_convgrad::conv2d_weight_grad"}, names


@needs_torch
def test_unaligned_views_are_copied_for_the_one_kernel():
    """x, dy and the weight one element past an aligned start (the kernel's loads take 64-byte
    aligned data): the C++ node copies them, and the gradients are stock's."""
    from tvm_convgrad.torch import get_backward, set_backward

    torch.manual_seed(1)
    stock, ours = _depthwise(stride=2)
    weight = unaligned((32, 1, 3, 3), False)
    x, grad = unaligned((2, 32, 9, 9), True), unaligned((2, 32, 5, 5), True)
    previous = get_backward()
    set_backward("ours")
    try:
        results = []
        for layer in (stock, ours):
            with torch.no_grad():
                layer.weight.set_(weight.clone() if layer is stock else weight)
            for _ in range(2):
                names, got = kernels_run(layer, x, grad)
            results.append(got)
    finally:
        set_backward(previous)
    assert names == {"tvm_convgrad::conv2d_both_grads"}
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
