"""The forward of a channels-last fp32 1x1 layer written out (:mod:`tvm_convgrad.schedule.cpu.pointwise_forward`)
and the drop-in's use of it.

y against the float64 reference written from the formula (``tvm_convgrad.reference.conv_forward_nd``),
within fp32's summation bound of each element's own terms; output channels on whole vectors and on
halves and quarters of them, pixels that are not a multiple of a tile or a chunk, with and without a
bias, on every ISA plan this host runs and compiled for AArch64; every argument flush against a
``PROT_NONE`` page; the drop-in's forward runs it for such a layer and only for such a layer.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_convgrad import isa_target, reference
from tvm_convgrad.compile import build_func, pass_context, resolve_target
from tvm_convgrad.isa import isa_plan
from tvm_convgrad.schedule.cpu import prefetch
from tvm_convgrad.schedule.cpu.pointwise_backward import MIN_REGISTERS, PointwiseBackward
from tvm_convgrad.schedule.cpu.pointwise_forward import forward_fits, gemm_layer, pointwise_forward_func

from one_pass import assert_runs_guarded

from conftest import NEON, RUNNABLE_ISAS, native_first, needs_torch, tiered, torch

# (n, h, w, c, o, weights_last)
CASES = [
    (2, 12, 12, 16, 96, False),  # MobileNetV2's expansion, smaller: 6 vectors of output channels
    (2, 12, 12, 32, 16, True),  # a projection, OHWI weights
    (3, 9, 11, 24, 40, False),  # 40 output channels: 8-lane vectors on AVX-512; pixels no multiple of a chunk
    (1, 17, 19, 17, 12, True),  # 12 output channels: 4 lanes; 17 input channels
    (2, 10, 13, 144, 24, False),  # many input channels a sum
    (1, 3, 5, 8, 64, False),  # 15 pixels: one chunk, under one tile
]


def _ids(case):
    n, h, w, c, o, last = case
    return f"n{n}_{h}x{w}_c{c}_o{o}{'_ohwi' if last else ''}"


def _layer(case, target) -> PointwiseBackward:
    plan = isa_plan(target)
    return PointwiseBackward(*case, plan.lanes, plan.registers, 2)


def _run(layer: PointwiseBackward, target, bias: bool, seed: int = 0):
    """``(x, w, b, y)``: NCHW / OIHW float32 inputs, the bias or None, and the kernel's output in NCHW."""
    import tvm

    rng = np.random.default_rng(seed)
    g = layer
    x = rng.standard_normal((g.n, g.c, g.h, g.w), dtype=np.float32)
    w = rng.standard_normal((g.o, g.c, 1, 1), dtype=np.float32)
    b = rng.standard_normal(g.o, dtype=np.float32) if bias else None
    w_memory = w.transpose(0, 2, 3, 1) if g.weights_last else w  # (OHWI of a 1x1: the same memory)
    args = [np.ascontiguousarray(a) for a in (x.transpose(0, 2, 3, 1), w_memory)] + ([b] if bias else [])
    args.append(np.full((g.n, g.h, g.w, g.o), np.nan, np.float32))  # (unwritten: NaN)
    tensors = [tvm.runtime.tensor(a) for a in args]
    build_func(pointwise_forward_func(layer, bias), target)(*tensors)
    return x, w, b, tensors[-1].numpy().transpose(0, 3, 1, 2)


def _assert_exact(x, w, b, y):
    """y within fp32's summation bound ``n u sum|terms|`` of the float64 reference (``n``: the input
    channels plus the bias, ``u = 2^-24``)."""
    conv = dict(strides=(1, 1), pads_begin=(0, 0), dilations=(1, 1))
    expected = reference.conv_forward_nd(x.astype(np.float64), w.astype(np.float64), **conv,
                                         bias=None if b is None else b.astype(np.float64))  # fmt: skip
    terms = reference.conv_forward_nd(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), **conv,
                                      bias=None if b is None else np.abs(b).astype(np.float64))  # fmt: skip
    assert y.shape == expected.shape and not np.isnan(y).any()
    bound = (x.shape[1] + 1) * 2.0**-24 * terms + 1e-30
    error = np.abs(y.astype(np.float64) - expected)
    assert (error <= bound).all(), f"worst {float((error / bound).max()):.3g} x the bound"


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("isa", native_first(RUNNABLE_ISAS))
@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i < 3, _ids))
def test_the_forward_matches_the_reference(case, isa, bias):
    """(The drop-in runs it on plans of 32 registers only; on AVX2's and SSE's it is exact too.)"""
    target = isa_target(isa)
    layer = _layer(case, target)
    assert forward_fits(layer) == (layer.registers >= MIN_REGISTERS)
    _assert_exact(*_run(layer, target, bias))


def test_asking_for_the_rows_ahead_leaves_the_forward_exact(monkeypatch):
    """Every layer's x a stream (STREAM_BYTES 0: each tile asks for the rows a chunk ahead, up to
    x's end): the same results within the bound, on this host's plan, with a bias."""
    monkeypatch.setattr(prefetch, "STREAM_BYTES", 0)
    target = isa_target("native")
    for case in CASES:
        layer = _layer(case, target)
        assert "tvm_convgrad_prefetch" in pointwise_forward_func(layer, True).script()
        _assert_exact(*_run(layer, target, True))


def test_the_kernel_compiles_for_aarch64():
    """NEON's 4 lanes: the same loops, cross-compiled; the tiles' sums are ``fmla`` on 4-lane vectors."""
    import tvm

    target = resolve_target(NEON)
    layer = _layer(CASES[0], target)
    with pass_context(target):
        executable = tvm.compile(tvm.IRModule({"pointwise_forward": pointwise_forward_func(layer, True)}), target=target)
    assert gemm_layer(layer).vector_lanes == 4 and re.search(r"\bfmla\s+v\d+\.4s", executable.mod.inspect_source("asm"))


def test_layers_it_does_not_take():
    """An ISA of 16 vector registers, or output channels not a multiple of 4, keep the cube's forward;
    any number of pixels and of input channels is taken."""
    assert not forward_fits(PointwiseBackward(8, 14, 14, 64, 32, False, 8, 16, 2))
    assert not forward_fits(PointwiseBackward(8, 14, 14, 64, 6, False, 16, 32, 2))
    assert not forward_fits(PointwiseBackward(8, 14, 14, 64, 17, False, 16, 32, 2))
    assert forward_fits(PointwiseBackward(1, 1, 1, 3, 4, False, 16, 32, 2))
    assert forward_fits(PointwiseBackward(8, 7, 7, 2048, 512, False, 16, 32, 2))  # (no sums: no limit on the weights)


GUARDED = r"""
from tvm_convgrad.schedule.cpu.pointwise_backward import PointwiseBackward
from tvm_convgrad.schedule.cpu.pointwise_forward import pointwise_forward_func
for n, h, w, c, o, last in eval(sys.argv[3]):
    layer = PointwiseBackward(n, h, w, c, o, last, plan.lanes, plan.registers, 2)
    rng = np.random.default_rng(1)
    shapes = [(n, h, w, c), (o, 1, 1, c) if last else (o, c, 1, 1), (o,), (n, h, w, o)]
    arrays = [memory.array(shape, np.float32, side) for shape in shapes]
    for a in arrays[:3]:
        a[...] = rng.standard_normal(a.shape, dtype=np.float32)
    print("start", (n, h, w, c, o), flush=True)
    build_func(pointwise_forward_func(layer, True), target)(*[tvm.runtime.from_dlpack(a) for a in arrays])
    expected = arrays[0].reshape(-1, c).astype(np.float64) @ arrays[1].reshape(o, c).T.astype(np.float64) + arrays[2]
    assert np.abs(arrays[3].reshape(-1, o) - expected).max() < 1e-3 * max(1.0, np.abs(expected).max())
print("done", flush=True)
"""


@pytest.mark.parametrize("side", ["after", "before"])
def test_the_kernel_reads_and_writes_inside_its_tensors(side):
    """x, the weight, the bias and y each flush against a page mapped ``PROT_NONE`` (after the array,
    then before it): a tile read or written past an edge faults the child process."""
    assert_runs_guarded(GUARDED, side, CASES)


@needs_torch
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_the_drop_in_forward_runs_it_for_a_1x1_layer(bias):
    """``set_forward("ours")`` on a channels-last fp32 1x1 layer: the output is this kernel's, bit for
    bit (on a host of 32 vector registers; elsewhere the cube's), and stock's within fp32's rounding."""
    from tvm_convgrad.torch import convert_conv2d, get_forward, set_forward
    from tvm_convgrad.torch.kernels import as_layout, as_weights, pointwise_forward_kernel, tensors_plan

    torch.manual_seed(0)
    stock = torch.nn.Conv2d(24, 40, 1, bias=bias).to(memory_format=torch.channels_last)
    ours = convert_conv2d(torch.nn.Conv2d(24, 40, 1, bias=bias).to(memory_format=torch.channels_last))
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(3, 24, 9, 11).contiguous(memory_format=torch.channels_last)
    previous = get_forward()
    set_forward("ours")
    try:
        y = ours(x)
    finally:
        set_forward(previous)
    call = tensors_plan(x, ours.weight, (1, 1), (0, 0, 0, 0), (1, 1), 1, True).call
    kernel = pointwise_forward_kernel(call, bias)
    assert (kernel is not None) == (isa_plan(resolve_target("llvm")).registers >= MIN_REGISTERS)
    if kernel is not None:
        direct = torch.empty_like(y)
        kernel(as_layout(x, call), as_weights(ours.weight.detach(), call), *((ours.bias.detach(),) if bias else ()),
               as_layout(direct, call))  # fmt: skip
        assert torch.equal(y, direct)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, stock(x), rtol=1e-5, atol=1e-5)


@needs_torch
@pytest.mark.parametrize("kind", ["nchw", "bf16", "stride-2", "padded", "grouped", "3x3"])
def test_other_layers_keep_the_cube_forward(kind):
    """NCHW, bf16, a stride of 2, padding, groups and a 3x3 kernel: no written-out forward."""
    from tvm_convgrad.torch.kernels import pointwise_forward_kernel, tensors_plan

    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    memory = torch.contiguous_format if kind == "nchw" else torch.channels_last
    x = torch.randn(2, 32, 8, 8, dtype=dtype).contiguous(memory_format=memory)
    w = torch.randn(48, 16 if kind == "grouped" else 32, 3 if kind == "3x3" else 1, 3 if kind == "3x3" else 1, dtype=dtype)
    stride = (2, 2) if kind == "stride-2" else (1, 1)
    pads = (1, 1, 1, 1) if kind in ("padded", "3x3") else (0, 0, 0, 0)
    call = tensors_plan(x, w, stride, pads, (1, 1), 2 if kind == "grouped" else 1, kind != "nchw").call
    assert pointwise_forward_kernel(call, False) is None
