"""The forward of a channels-last fp32 depthwise layer written out (:mod:`tvm_convgrad.schedule.cpu.depthwise_forward`)
and the drop-in's use of it.

y against the float64 reference written from the formula (``tvm_convgrad.reference.conv_forward_nd``,
groups = channels), within fp32's summation bound of each element's own terms: every geometry of
the one-pass backward's tests (strides, dilations, asymmetric pads, pads past the kernel, maps
smaller than it, rows no tap reaches), with and without a bias, with the lines ahead asked for,
on every ISA plan this host runs and compiled for AArch64; every argument flush against a
``PROT_NONE`` page; the drop-in's forward runs it for such a layer only.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_convgrad import isa_target, reference
from tvm_convgrad.compile import build_func, pass_context, resolve_target
from tvm_convgrad.isa import isa_plan
from tvm_convgrad.schedule.cpu import prefetch
from tvm_convgrad.schedule.cpu.depthwise_backward import DepthwiseBackward, border_split, rows_ahead
from tvm_convgrad.schedule.cpu.depthwise_forward import depthwise_forward_func

from one_pass import assert_runs_guarded
from test_depthwise_backward import CASES, _ids

from conftest import NEON, RUNNABLE_ISAS, native_first, needs_torch, tiered, torch


def _layer(case, target) -> DepthwiseBackward:
    n, c, h, w, (kh, kw), s, p, d, last = case
    return DepthwiseBackward(n, c, h, w, kh, kw, s, p, d, last, isa_plan(target).lanes, 2)


def _run(layer: DepthwiseBackward, target, bias: bool, seed: int = 0):
    """``(x, w, b, y)``: NCHW / OIHW float32 inputs, the bias or None, and the kernel's output in NCHW."""
    import tvm

    rng = np.random.default_rng(seed)
    g = layer
    x = rng.standard_normal((g.n, g.c, g.h, g.w), dtype=np.float32)
    w = rng.standard_normal((g.c, 1, g.kh, g.kw), dtype=np.float32)
    b = rng.standard_normal(g.c, dtype=np.float32) if bias else None
    w_memory = w.transpose(0, 2, 3, 1) if g.weights_last else w  # (OHWI of one input channel: the same memory)
    args = [np.ascontiguousarray(a) for a in (x.transpose(0, 2, 3, 1), w_memory)] + ([b] if bias else [])
    args.append(np.full((g.n, g.ho, g.wo, g.c), np.nan, np.float32))  # (unwritten: NaN)
    tensors = [tvm.runtime.tensor(a) for a in args]
    build_func(depthwise_forward_func(layer, bias), target)(*tensors)
    return x, w, b, tensors[-1].numpy().transpose(0, 3, 1, 2)


def _assert_exact(layer: DepthwiseBackward, x, w, b, y):
    """y within fp32's summation bound ``n u sum|terms|`` of the float64 reference (``n``: the taps
    plus the bias, ``u = 2^-24``)."""
    g = layer
    (top, bottom, left, right) = g.pads
    conv = dict(strides=g.strides, pads_begin=(top, left), pads_end=(bottom, right), dilations=g.dilation, groups=g.c)
    bias64 = None if b is None else b.astype(np.float64)
    expected = reference.conv_forward_nd(x.astype(np.float64), w.astype(np.float64), **conv, bias=bias64)
    terms = reference.conv_forward_nd(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), **conv,
                                      bias=None if b is None else np.abs(bias64))  # fmt: skip
    assert y.shape == expected.shape and not np.isnan(y).any()
    bound = (g.kh * g.kw + 1) * 2.0**-24 * terms + 1e-30
    error = np.abs(y.astype(np.float64) - expected)
    assert (error <= bound).all(), f"worst {float((error / bound).max()):.3g} x the bound"


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("isa", native_first(RUNNABLE_ISAS))
@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i < 6 or i in (10, 12), _ids))
def test_the_forward_matches_the_reference(case, isa, bias):
    target = isa_target(isa)
    layer = _layer(case, target)
    assert layer.fits()
    _assert_exact(layer, *_run(layer, target, bias))


def test_asking_for_the_rows_ahead_leaves_the_forward_exact(monkeypatch):
    """Every layer's x a stream (STREAM_BYTES 0: the loop over the columns every tap reads inside x
    asks for x's lines ROWS_AHEAD rows on, past an image's rows into the next, clamped to x): the
    same results, every geometry, a bias."""
    monkeypatch.setattr(prefetch, "STREAM_BYTES", 0)
    target = isa_target("native")
    for case in CASES:
        layer = _layer(case, target)
        (lo, hi), _ = border_split(layer.wo, layer.weight_columns())
        assert rows_ahead(layer) and ("tvm_convgrad_prefetch" in depthwise_forward_func(layer, True).script()) == (hi > lo)
        _assert_exact(layer, *_run(layer, target, True))


def test_the_kernel_compiles_for_aarch64():
    """NEON's 4 lanes: the same loops, cross-compiled; each output vector's sums are ``fmla`` on 4-lane vectors."""
    import tvm

    target = resolve_target(NEON)
    layer = _layer(CASES[1], target)
    with pass_context(target):
        executable = tvm.compile(tvm.IRModule({"depthwise_forward": depthwise_forward_func(layer, True)}), target=target)
    assert layer.lanes == 4 and re.search(r"\bfmla\s+v\d+\.4s", executable.mod.inspect_source("asm"))


GUARDED = r"""
from tvm_convgrad.schedule.cpu import prefetch
from tvm_convgrad.schedule.cpu.depthwise_backward import DepthwiseBackward
from tvm_convgrad.schedule.cpu.depthwise_forward import depthwise_forward_func
prefetch.STREAM_BYTES = 0  # (the lines ahead asked for too: a prefetch never faults, but its address is clamped)
for n, c, h, w, (kh, kw), s, p, d, last in eval(sys.argv[3]):
    layer = DepthwiseBackward(n, c, h, w, kh, kw, s, p, d, last, plan.lanes, 2)
    rng = np.random.default_rng(1)
    shapes = [(n, h, w, c), (c, kh, kw, 1) if last else (c, 1, kh, kw), (c,), (n, layer.ho, layer.wo, c)]
    arrays = [memory.array(shape, np.float32, side) for shape in shapes]
    for a in arrays[:3]:
        a[...] = rng.standard_normal(a.shape, dtype=np.float32)
    print("start", (n, c, h, w, kh, kw, s), flush=True)
    build_func(depthwise_forward_func(layer, True), target)(*[tvm.runtime.from_dlpack(a) for a in arrays])
    assert not np.isnan(arrays[3]).any()
print("done", flush=True)
"""


@pytest.mark.parametrize("side", ["after", "before"])
def test_the_kernel_reads_and_writes_inside_its_tensors(side):
    """x, the weight, the bias and y each flush against a page mapped ``PROT_NONE`` (after the array,
    then before it): a border column or a clamped row read past an edge faults the child process."""
    assert_runs_guarded(GUARDED, side, CASES)


@needs_torch
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_drop_in_forward_runs_it_for_a_depthwise_layer(stride, bias):
    """``set_forward("ours")`` on a channels-last fp32 depthwise layer: the output is this kernel's, bit
    for bit, and stock's within fp32's rounding; in the C++ node's calls too (settled)."""
    from tvm_convgrad.torch import convert_conv2d, get_forward, set_forward
    from tvm_convgrad.torch.kernels import as_layout, as_weights, depthwise_forward_kernel, tensors_plan

    torch.manual_seed(0)
    stock = torch.nn.Conv2d(32, 32, 3, stride, 1, groups=32, bias=bias).to(memory_format=torch.channels_last)
    ours = convert_conv2d(torch.nn.Conv2d(32, 32, 3, stride, 1, groups=32, bias=bias).to(memory_format=torch.channels_last))
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(3, 32, 9, 11).contiguous(memory_format=torch.channels_last)
    previous = get_forward()
    set_forward("ours")
    try:
        ys = [ours(x) for _ in range(3)]  # (the later calls the settled route's)
    finally:
        set_forward(previous)
    call = tensors_plan(x, ours.weight, (stride, stride), (1, 1, 1, 1), (1, 1), 32, True).call
    kernel = depthwise_forward_kernel(call, bias)
    direct = torch.empty_like(ys[0])
    bias_args = (ours.bias.detach(),) if bias else ()
    kernel(as_layout(x, call), as_weights(ours.weight.detach(), call), *bias_args, as_layout(direct, call))
    for y in ys:
        assert torch.equal(y, direct) and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(ys[0], stock(x), rtol=1e-5, atol=1e-5)


@needs_torch
@pytest.mark.parametrize("kind", ["nchw", "bf16", "multiplier", "grouped", "dense"])
def test_other_layers_keep_their_forward(kind):
    """NCHW, bf16, two outputs per channel, groups of several channels and a dense 3x3: no
    written-out depthwise forward."""
    from tvm_convgrad.torch.kernels import depthwise_forward_kernel, tensors_plan

    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    memory = torch.contiguous_format if kind == "nchw" else torch.channels_last
    x = torch.randn(2, 32, 8, 8, dtype=dtype).contiguous(memory_format=memory)
    outputs, groups = {"multiplier": (64, 32), "grouped": (32, 8), "dense": (32, 1)}.get(kind, (32, 32))
    w = torch.randn(outputs, 32 // groups, 3, 3, dtype=dtype)
    call = tensors_plan(x, w, (1, 1), (1, 1, 1, 1), (1, 1), groups, kind != "nchw").call
    assert depthwise_forward_kernel(call, False) is None
