"""``training.roofline``: a convolution's least time on a host's two rates, worked by hand here
from the tensors' sizes, and the step ceiling drawn from it."""

from __future__ import annotations

import pytest

from conftest import torch
from tvm_convgrad.training.roofline import Roofline, ceiling, conv_bound_ms, layer_bound_s, measure
from tvm_convgrad.training.torch_backward import Layer

MEMORY_BOUND = Roofline(bytes_per_s=1e9, flops_per_s=1e18, element_bytes=4)
COMPUTE_BOUND = Roofline(bytes_per_s=1e18, flops_per_s=1e9, element_bytes=4)


def test_a_memory_bound_layer_moves_each_tensor_once_a_pass():
    # 2 x 16 x 8x8 -> 32 channels, 1x1: x 2048 values, y 4096, w 512
    layer = Layer("pointwise", (2, 16, 8, 8), 32, 1)
    forward = (2048 + 512 + 4096) * 4 / 1e9  # x, w in; y out
    backward = (4096 + 512 + 2048 + 2048 + 512) * 4 / 1e9  # dy, w, x in; dx, dw out
    assert layer_bound_s(layer, MEMORY_BOUND) == pytest.approx(forward + backward)
    half = Roofline(1e9, 1e18, 2)  # bf16: every tensor at 2 bytes
    assert layer_bound_s(layer, half) == pytest.approx((forward + backward) / 2)


def test_a_compute_bound_layer_runs_its_three_gemms_at_the_peak():
    # 4 x 64 x 14x14 -> 128, 3x3 stride 2 pad 1: a 7x7 output; 2 * 4*49 * 128 * 64*9 FLOPs a GEMM
    layer = Layer("strided", (4, 64, 14, 14), 128, 3, stride=2, padding=1)
    assert layer_bound_s(layer, COMPUTE_BOUND) == pytest.approx(3 * 2 * 4 * 49 * 128 * 64 * 9 / 1e9)
    # grouped (depthwise) and dilated: 1 x 32 x 14x14, 3x3 at dilation 2 pad 2 keeps 14x14, one input channel a group
    depthwise = Layer("atrous_dw", (1, 32, 14, 14), 32, 3, padding=2, dilation=2, groups=32)
    assert layer_bound_s(depthwise, COMPUTE_BOUND) == pytest.approx(3 * 2 * 196 * 32 * 9 / 1e9)


def test_a_3x3_at_stride_1_counts_winograds_multiplies():
    # F(2x2, 3x3): 16 multiplies for 2 x 2 outputs of 9 taps each, 36 direct
    layer = Layer("dense", (2, 64, 14, 14), 64, 3, padding=1)
    direct = 2 * 2 * 196 * 64 * 64 * 9
    assert layer_bound_s(layer, COMPUTE_BOUND) == pytest.approx(3 * direct * 16 / 36 / 1e9)


def test_the_best_of_two_measurements_takes_each_faster_rate():
    slow_copy, slow_mm = Roofline(1e9, 5e11, 4), Roofline(3e9, 1e11, 4)
    assert slow_copy.best(slow_mm) == slow_mm.best(slow_copy) == Roofline(3e9, 5e11, 4)


def test_an_rgb_stem_takes_no_input_gradient():
    # 1 x 3 x 8x8 -> 8, 3x3 pad 1: x 192, y 512, w 216; its backward only dW (reads dy, x; writes dw)
    layer = Layer("stem", (1, 3, 8, 8), 8, 3, padding=1)
    assert layer_bound_s(layer, MEMORY_BOUND) == pytest.approx(((192 + 216 + 512) + (512 + 192 + 216)) * 4 / 1e9)
    assert layer_bound_s(layer, COMPUTE_BOUND) == pytest.approx(2 * 2 * 64 * 8 * 27 / 1e9)


def test_a_call_is_its_forward_and_its_backward():
    from tvm_convgrad.training.roofline import backward_bound_s, forward_bound_s

    for layer in (Layer("pointwise", (2, 16, 8, 8), 32, 1), Layer("stem", (1, 3, 8, 8), 8, 3, padding=1)):
        for host in (MEMORY_BOUND, COMPUTE_BOUND):
            assert forward_bound_s(layer, host) + backward_bound_s(layer, host) == layer_bound_s(layer, host)
    assert backward_bound_s(Layer("pointwise", (2, 16, 8, 8), 32, 1), COMPUTE_BOUND) == pytest.approx(2 * 2 * 2 * 64 * 32 * 16 / 1e9)


def test_a_network_counts_each_layer_as_often_as_it_runs():
    once, thrice = Layer("a", (2, 16, 8, 8), 32, 1), Layer("b", (2, 32, 8, 8), 32, 3, padding=1, count=3)
    expected_s = layer_bound_s(once, MEMORY_BOUND) + 3 * layer_bound_s(thrice, MEMORY_BOUND)
    assert conv_bound_ms([once, thrice], MEMORY_BOUND) == pytest.approx(expected_s * 1e3)


def test_the_ceiling_replaces_stocks_convolutions_by_their_bound():
    assert ceiling(400.0, 150.0, 100.0) == pytest.approx(400 / 350)
    assert ceiling(400.0, 100.0, 100.0) == 1.0  # convolutions already at their bound: nothing to gain


def test_the_ceiling_takes_the_convolutions_share_of_the_profiled_step():
    """The profiled step (slower: the profiler, its own page faults) gives the convolutions' share,
    applied to the timed step; a profile whose convolutions outlast the timed step stays bounded."""
    assert ceiling(400.0, 300.0, 100.0, profiled_ms=600.0) == pytest.approx(400 / (400 - 200 + 100))
    assert ceiling(429.1, 483.8, 60.2, profiled_ms=560.0) == pytest.approx(429.1 / (429.1 * (1 - 483.8 / 560.0) + 60.2))
    assert ceiling(429.1, 483.8, 60.2, profiled_ms=470.0) == pytest.approx(429.1 / 60.2)  # share capped at the whole step


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")
@pytest.mark.parametrize("dtype, element_bytes", [("float32", 4), ("bfloat16", 2)])
def test_the_host_is_measured_for_the_dtype(dtype, element_bytes):
    host = measure(dtype, copy_mib=(1, 4), side=128, repeat=1)
    assert host.element_bytes == element_bytes and host.bytes_per_s > 0 and host.flops_per_s > 0
    assert "GB/s" in str(host) and "GFLOP/s" in str(host)


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")
@pytest.mark.parametrize("slow_s, sides", [(float("inf"), {256, 512, 1024}), (0.0, {256})])
def test_the_squares_grow_to_the_side_unless_a_call_is_slow(slow_s, sides, monkeypatch):
    """A type whose GEMM is slow here (bf16 on AVX2: 62 s for 2048 x 2048) is timed on the first
    square that takes ``SLOW_MM_S``, a fast one on ``side``."""
    from tvm_convgrad.training import roofline

    seen = set()
    mm = torch.mm
    monkeypatch.setattr(roofline, "SLOW_MM_S", slow_s)
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.add(a.shape[0]) or mm(a, b))
    assert roofline._mm_flops_per_s(torch.float32, 1024, repeat=1) > 0
    assert seen == sides
