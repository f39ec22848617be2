"""The depthwise forward over channel-planar (NCX) fp32 tensors runs plane by plane, its columns on
the lanes (``conv_dw_px``, ``Formulation.DEPTHWISE_FWD``): x read once into each plane's padded pack,
y written from the plane's sums, no FracZ_g block of 15/16 zeros and no NCX <-> 5HD turn. Every
other depthwise forward of one output channel per group (NXC, bf16, fp16) has its channels on the
lanes (``conv_dw``, ``Formulation.DEPTHWISE_CHANNELS_FWD``). Every case is exact against the float64
reference (``check_kernel``) where the host runs the target, and every target builds it; a channel
multiplier and grouped layers keep the cube.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from tvm import te

from tvm_convgrad import build, isa_target
from tvm_convgrad.compile import resolve_target
from tvm_convgrad.dsl.compute.depthwise_planar import padding_cuts, row_vector
from tvm_convgrad.frontends import onednn
from tvm_convgrad.isa import host_can_run
from tvm_convgrad.tools.verify import check_kernel

from conftest import NEON, native_first, needs_torch, tiered

# (n, channels, (h, w), (kh, kw), strides, pads_begin, pads_end, dilations, bias)
CASES = [
    (2, 40, (13, 11), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), True),  # a partial block of 16, bias
    (2, 24, (15, 14), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), False),  # stride 2: the phases packed
    (1, 17, (12, 12), (3, 3), (1, 1), (2, 0), (1, 2), (2, 2), True),  # dilation 2, asymmetric pads
    (3, 32, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), False),  # MobileNetV2's rows: 28 computed as 32
    (2, 16, (9, 70), (5, 3), (1, 2), (2, 1), (2, 1), (1, 1), True),  # a 5x3 kernel, a row longer than one vector
    (1, 8, (2, 1), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), False),  # a 2x1 map: most taps on padding
    (2, 20, (10, 9), (1, 1), (2, 2), (0, 0), (0, 0), (1, 1), False),  # a strided 1x1: one phase per axis
    (1, 12, (11, 11), (7, 7), (3, 3), (3, 2), (1, 3), (1, 1), True),  # 7x7 at stride 3
    (1, 16, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), False),  # a 1x1 map: a task's pack one element, no loop of its own
    (2, 8, (1, 5), (1, 3), (1, 1), (0, 1), (0, 1), (1, 1), False),  # one-row planes
    (1, 4, (1, 1), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), False),  # a 1x1 map under a 3x3: eight taps on padding
    (1, 3, (4, 4), (2, 2), (1, 1), (0, 0), (1, 1), (1, 1), True),  # an even kernel, padded after only
]


def _forward(case, data_format="NCX", dtype="float32", multiplier=1, groups=None):
    n, c, size, kernel, strides, pads_begin, pads_end, dilations, bias = case
    groups = groups or c
    src = te.placeholder((n, c, *size) if data_format == "NCX" else (n, *size, c), dtype, name="src")
    cout = c * multiplier
    weights = te.placeholder((cout, c // groups, *kernel) if data_format == "NCX" else (*kernel, c // groups, cout), dtype, name="weights")
    b = te.placeholder((cout,), dtype, name="bias") if bias else None
    return onednn.convolution(src, weights, b, strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, groups=groups,
                              data_format=data_format, weights_format="OIX" if data_format == "NCX" else "XIO")  # fmt: skip


def _target(isa: str):
    """This host's target (``"native"``), an x86 ISA's, or the AArch64 one (cross-compiled)."""
    return resolve_target("llvm" if isa == "native" else NEON if isa == "neon" else isa_target(isa))


@pytest.mark.parametrize("isa", native_first(["native", "avx512", "avx2", "sse", "neon"]))
@pytest.mark.parametrize("case", tiered(CASES, lambda i, _: i < 4), ids=str)
def test_an_ncx_depthwise_forward_runs_plane_by_plane_and_is_exact(isa, case):
    """Each target (x86's three vector ISAs, AArch64's NEON cross-compiled) builds the plane-by-plane
    kernel; where the host runs it, every element within the fp32 bound of the reference."""
    target = _target(isa)
    kernel = build(_forward(case), target=target)
    assert kernel.formulation == "depthwise"
    tir = kernel.inspect_source("tir")
    assert 'T.sblock("conv_dw_px_update")' in tir and 'T.sblock("w_conv")' not in tir
    if host_can_run(target):
        assert check_kernel(kernel).ok


@pytest.mark.parametrize("isa", native_first(["native", "avx512", "avx2", "sse", "neon"]))
@pytest.mark.parametrize("case", tiered(CASES, lambda i, _: i < 4), ids=str)
def test_an_nxc_depthwise_forward_runs_with_the_channels_on_the_lanes_and_is_exact(isa, case):
    """NXC (channels-last) x: 16 channels on the lanes (``conv_dw``, a one-phase dX's schedule), no
    FracZ_g block of 15/16 zeros; every target builds it, and it is exact where the host runs it."""
    target = _target(isa)
    kernel = build(_forward(case, data_format="NXC"), target=target)
    assert kernel.formulation == "depthwise"
    tir = kernel.inspect_source("tir")
    assert 'T.sblock("conv_dw_update")' in tir and 'T.sblock("w_conv")' not in tir
    if host_can_run(target):
        assert check_kernel(kernel).ok


@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", tiered(CASES, lambda i, _: i in (0, 1)), ids=str)
def test_a_narrow_depthwise_forward_sums_its_channels_on_the_lanes_in_fp32(case, dtype, data_format):
    """bf16 and fp16 tensors (either layout: NCX through its 5HD view) take the same channel-lane
    mad, read widened to fp32 and rounded once: within the bound of fp32 sums rounded to the type."""
    kernel = build(_forward(case, data_format=data_format, dtype=dtype))
    assert kernel.formulation == "depthwise" and 'T.sblock("conv_dw_update")' in kernel.inspect_source("tir")
    assert check_kernel(kernel).ok


@pytest.mark.parametrize("variant", ["multiplier", "grouped"])
def test_other_groups_keep_the_cube(variant):
    """A channel multiplier of 2 and two channels per group are no depthwise forward of either kind."""
    case = CASES[0]
    kwargs = {"multiplier": dict(multiplier=2), "grouped": dict(groups=case[1] // 2)}[variant]
    kernel = build(_forward(case, **kwargs))
    tir = kernel.inspect_source("tir")
    assert kernel.formulation == "cube" and 'T.sblock("conv_dw_px_update")' not in tir and 'T.sblock("conv_dw_update")' not in tir
    assert check_kernel(kernel).ok


def test_the_pack_cuts_its_padding_from_its_image_and_rows_are_whole_registers():
    """An unstrided axis is cut where its padding starts and ends (the image part a contiguous copy);
    a strided one is not; a row is computed in whole registers (28 as 32, 7 as 8, 112 as itself)."""
    assert padding_cuts(1, 28, 30, 1) == [1, 28]
    assert padding_cuts(0, 28, 28, 1) == []
    assert padding_cuts(2, 12, 15, 1) == [2, 12]
    assert padding_cuts(1, 10, 11, 1) == [1]
    assert padding_cuts(1, 56, 58, 2) == []
    assert [row_vector(w) for w in (1, 3, 4, 7, 14, 16, 28, 56, 112)] == [1, 4, 4, 8, 16, 16, 32, 64, 112]


@needs_torch
def test_the_drop_in_depthwise_forward_matches_pytorch():
    """``tvm_convgrad.torch.conv2d`` of a depthwise layer (the package's forward forced) against
    ``F.conv2d``: NCHW stride 1 and 2, with a bias."""
    import torch
    import torch.nn.functional as F

    from tvm_convgrad.torch import conv2d, set_forward

    torch.manual_seed(0)
    set_forward("ours")
    try:
        for stride in (1, 2):
            x = torch.randn(2, 24, 15, 13)
            w, b = torch.randn(24, 1, 3, 3), torch.randn(24)
            y = conv2d(x, w, b, stride=stride, padding=1, groups=24)
            np.testing.assert_allclose(y.numpy(), F.conv2d(x, w, b, stride=stride, padding=1, groups=24).numpy(), rtol=1e-5, atol=1e-5)
    finally:
        set_forward("auto")


@pytest.mark.parametrize("case, tasks", [((2, 16, (7, 7)), 32), ((3, 32, (28, 28)), 12), ((2, 40, (13, 11)), 8)])
def test_a_task_step_takes_one_plane_on_the_stack_or_several_that_fill_the_l1(case, tasks):
    """One plane a task step where its pack and sums fit TVM's stack allocations (7x7: 360 + 224
    bytes); else as many of an image's planes as fit 32 KB of packs while each core keeps four tasks
    (28x28: 8 of 32 planes of 4 KB; 13x11: 10 of 40 of 1 KB, four tasks a core)."""
    n, c, size = case
    kernel = build(_forward((n, c, size, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), False)), target=resolve_target(isa_target("avx512")))
    parallel = re.findall(r"in T.parallel\(T.int64\((\d+)\)\):\n(?:.*\n){0,2}.*x_plane", kernel.inspect_source("tir"))
    assert parallel == [str(tasks)]



@pytest.mark.parametrize("stride", [1, 2])
def test_the_cuda_schedule_of_the_planar_forward_builds_and_its_emulation_is_exact(stride):
    """On CUDA the planar stages take the SIMT schedule: it builds (PTX or source), and run as its
    CPU emulation every element is within the bound."""
    from tvm_convgrad import emulate_cuda

    case = (2, 24, (15, 13), (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1), True)
    assert build(_forward(case), target="cuda").formulation == "depthwise"
    assert check_kernel(emulate_cuda(_forward(case))).ok
