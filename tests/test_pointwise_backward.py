"""Both gradients of a channels-last fp32 1x1 layer in one kernel
(:mod:`tvm_convgrad.schedule.cpu.pointwise_backward`) and the drop-in's use of it.

dX and dW against the float64 references written from the formulas (``tvm_convgrad.reference``),
within fp32's summation bound of each element's own terms; channels on whole vectors and on halves
and quarters of them, output channels with no divisor (a tile of one row), pixels that are not a
multiple of a tile or a chunk, on every ISA plan this host runs and compiled for AArch64; every
argument flush against a ``PROT_NONE`` page; the PyTorch drop-in's Python and C++ nodes run it and
give the same bits.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_convgrad import isa_target
from tvm_convgrad.compile import build_func, pass_context, resolve_target
from tvm_convgrad.isa import isa_plan
from tvm_convgrad.schedule.cpu import prefetch
from tvm_convgrad.schedule.cpu.pointwise_backward import (CHUNK_PIXELS, MAX_WEIGHTS, MIN_REGISTERS, PointwiseBackward,
                                                          chunk_pixels, pointwise_backward_func, tiles)  # fmt: skip

from one_pass import assert_runs_guarded, assert_within_summation_bound, kernels_run, unaligned

from conftest import NEON, RUNNABLE_ISAS, native_first, needs_torch, tiered, torch

# (n, h, w, c, o, weights_last)
CASES = [
    (2, 12, 12, 32, 16, False),  # MobileNetV2's 32 -> 16 projection, smaller
    (2, 12, 12, 16, 96, True),  # an expansion, OHWI weights
    (3, 9, 11, 24, 144, False),  # 24 channels: 8-lane vectors on AVX-512; pixels no multiple of a chunk
    (1, 17, 19, 12, 17, True),  # 12 channels: 4 lanes; 17 output channels: dW tiles of one row
    (2, 10, 13, 144, 24, False),  # a projection: many vectors a pixel
    (4, 8, 9, 64, 1, False),  # one output channel
    (1, 16, 33, 48, 40, True),  # one image
]


def _ids(case):
    n, h, w, c, o, last = case
    return f"n{n}_{h}x{w}_c{c}_o{o}{'_ohwi' if last else ''}"


def _layer(case, target, cores: int = 2) -> PointwiseBackward:
    plan = isa_plan(target)
    return PointwiseBackward(*case, plan.lanes, plan.registers, cores)


def _run(layer: PointwiseBackward, target, seed: int = 0):
    """``(x, dy, w, dx, dw)``: NCHW / OIHW float32 inputs and the kernel's results, back in NCHW / OIHW."""
    import tvm

    rng = np.random.default_rng(seed)
    g = layer
    x = rng.standard_normal((g.n, g.c, g.h, g.w), dtype=np.float32)
    dy = rng.standard_normal((g.n, g.o, g.h, g.w), dtype=np.float32)
    w = rng.standard_normal((g.o, g.c, 1, 1), dtype=np.float32)
    w_memory = w.transpose(0, 2, 3, 1) if g.weights_last else w  # (OHWI of a 1x1: the same memory)
    args = [np.ascontiguousarray(a) for a in (x.transpose(0, 2, 3, 1), dy.transpose(0, 2, 3, 1), w_memory)]
    args += [np.full(args[0].shape, np.nan, np.float32), np.full(w_memory.shape, np.nan, np.float32)]  # (unwritten: NaN)
    tensors = [tvm.runtime.tensor(a) for a in args]
    build_func(pointwise_backward_func(layer), target)(*tensors)
    dx, dw = tensors[3].numpy().transpose(0, 3, 1, 2), tensors[4].numpy()
    return x, dy, w, dx, dw.transpose(0, 3, 1, 2) if g.weights_last else dw


def _assert_exact(layer: PointwiseBackward, x, dy, w, dx, dw):
    """dX and dW within fp32's summation bound of the float64 references (:mod:`one_pass`)."""
    g = layer
    conv = dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1)
    assert_within_summation_bound(x, dy, w, dx, dw, (g.h, g.w), (1, 1), conv, (g.o, g.m + g.cores))


@pytest.mark.parametrize("isa", native_first(RUNNABLE_ISAS))
@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i < 4, _ids))
def test_both_gradients_match_the_reference(case, isa):
    """(The drop-in runs it on plans of 32 registers only; on AVX2's and SSE's it is exact too.)"""
    target = isa_target(isa)
    layer = _layer(case, target)
    assert layer.fits() == (layer.registers >= MIN_REGISTERS)
    _assert_exact(layer, *_run(layer, target))


def test_asking_for_the_rows_ahead_leaves_the_gradients_exact(monkeypatch):
    """Every layer's rows a stream (STREAM_BYTES 0: dW's steps ask for the runs a chunk ahead, up
    to the tensors' ends): the same results within the bound, on this host's plan."""
    monkeypatch.setattr(prefetch, "STREAM_BYTES", 0)
    target = isa_target("native")
    for case in CASES:
        layer = _layer(case, target)
        assert "tvm_convgrad_prefetch" in pointwise_backward_func(layer).script()
        _assert_exact(layer, *_run(layer, target))


@pytest.mark.parametrize("cores", [1, 3])
def test_any_number_of_parts_sums_the_same_gradients(cores):
    """dW summed in 1 or 3 parts (each its chunks' pixels): the same values within the bound."""
    target = isa_target("native")
    layer = _layer(CASES[2], target, cores)
    _assert_exact(layer, *_run(layer, target))


def test_the_kernel_compiles_for_aarch64():
    """NEON's 4 lanes: the same loops, cross-compiled; the tiles' sums are ``fmla`` on 4-lane vectors."""
    import tvm

    target = resolve_target(NEON)
    layer = _layer(CASES[0], target)
    with pass_context(target):
        executable = tvm.compile(tvm.IRModule({"pointwise_backward": pointwise_backward_func(layer)}), target=target)
    assert layer.vector_lanes == 4 and re.search(r"\bfmla\s+v\d+\.4s", executable.mod.inspect_source("asm"))


def test_tiles_fit_the_registers():
    """Each tile's accumulators, loads and broadcasts within 3/4 of the ISA's registers; dW's rows
    divide the output channels; a chunk is whole dX tiles."""
    for registers, lanes in ((32, 16), (16, 8), (16, 4)):
        for c, o in ((16, 96), (24, 144), (144, 24), (12, 17), (960, 160)):
            layer = PointwiseBackward(32, 14, 14, c, o, False, lanes, registers, 2)
            t = tiles(layer)
            for a, b in ((t.pixels, t.input_vectors), (t.rows, t.weight_vectors)):
                assert a * b + a + b <= registers * 3 // 4, (registers, c, o, t)
            assert o % t.rows == 0 and chunk_pixels(layer) % t.pixels == 0 and chunk_pixels(layer) >= CHUNK_PIXELS


def test_layers_it_does_not_take():
    """An ISA of 16 vector registers, input channels not a multiple of 4, more than MAX_WEIGHTS
    weights, or fewer than two chunks a core are left to the separate kernels."""
    assert not PointwiseBackward(8, 14, 14, 64, 32, False, 8, 16, 2).fits()
    assert not PointwiseBackward(8, 14, 14, 6, 32, False, 16, 32, 2).fits()
    assert not PointwiseBackward(8, 7, 7, 2048, 512, False, 16, 32, 2).fits() and 2048 * 512 > MAX_WEIGHTS
    assert not PointwiseBackward(1, 14, 14, 64, 64, False, 16, 32, 2).fits()  # 196 pixels: under 2 chunks a core
    assert PointwiseBackward(2, 12, 12, 64, 64, False, 16, 32, 2).fits()


GUARDED = r"""
from tvm_convgrad.schedule.cpu.pointwise_backward import PointwiseBackward, pointwise_backward_func
for n, h, w, c, o, last in eval(sys.argv[3]):
    layer = PointwiseBackward(n, h, w, c, o, last, plan.lanes, plan.registers, 2)
    rng = np.random.default_rng(1)
    weight = (o, 1, 1, c) if last else (o, c, 1, 1)
    shapes = [(n, h, w, c), (n, h, w, o), weight, (n, h, w, c), weight]
    arrays = [memory.array(shape, np.float32, side) for shape in shapes]
    for a in arrays[:3]:
        a[...] = rng.standard_normal(a.shape, dtype=np.float32)
    print("start", (n, h, w, c, o), flush=True)
    build_func(pointwise_backward_func(layer), target)(*[tvm.runtime.from_dlpack(a) for a in arrays])
    x, dy, wt = (a.reshape(-1, a.shape[-1]).astype(np.float64) for a in arrays[:2] + [arrays[2].reshape(o, c)])
    assert np.abs(arrays[3].reshape(-1, c) - dy @ wt).max() < 1e-3 * max(1.0, np.abs(dy @ wt).max())
    assert np.abs(arrays[4].reshape(o, c) - dy.T @ x).max() < 1e-3 * max(1.0, np.abs(dy.T @ x).max())
print("done", flush=True)
"""


@pytest.mark.parametrize("side", ["after", "before"])
def test_the_kernel_reads_and_writes_inside_its_tensors(side):
    """x, dy, the weight, dX and dW each flush against a page mapped ``PROT_NONE`` (after the array,
    then before it): a chunk or a tile read past an edge faults the child process."""
    assert_runs_guarded(GUARDED, side, CASES)


def _pointwise(channels_last: bool = True, c: int = 32, o: int = 48, bias: bool = True):
    """A stock 1x1 layer and its drop-in copy (the same parameters)."""
    import copy

    from tvm_convgrad.torch import convert_conv2d

    memory = torch.channels_last if channels_last else torch.contiguous_format
    stock = torch.nn.Conv2d(c, o, 1, bias=bias).to(memory_format=memory)
    return stock, convert_conv2d(copy.deepcopy(stock))


def _one_kernel_here() -> set:
    """The profiler ranges of a fitting layer's backward on this host: the one kernel, or the two
    where its ISA has fewer than :data:`MIN_REGISTERS` vector registers (AVX2)."""
    if isa_plan(resolve_target("llvm")).registers >= MIN_REGISTERS:
        return {"tvm_convgrad::conv2d_both_grads"}
    return {"tvm_convgrad::conv2d_input_grad", "tvm_convgrad::conv2d_weight_grad"}


@needs_torch
@pytest.mark.parametrize("node", ["python", "cpp"])
def test_the_drop_in_runs_one_kernel_for_a_1x1_layer(node):
    """A channels-last fp32 1x1 layer's backward is the one kernel (on an AVX-512 host), on the
    Python node and on the C++ one: the same bits on both, stock's values within fp32's rounding."""
    from tvm_convgrad.torch import get_backward, native, set_backward

    torch.manual_seed(0)
    stock, ours = _pointwise()
    x = torch.randn(4, 32, 12, 12).contiguous(memory_format=torch.channels_last)
    grad = torch.randn(4, 48, 12, 12).contiguous(memory_format=torch.channels_last)
    previous = get_backward()
    set_backward("ours")
    try:
        results = {}
        for mode in ("off", "on") if node == "cpp" else ("off",):
            native.set_native(mode)
            for _ in range(2):  # (the second call: the C++ node's signature settled)
                names, results[mode] = kernels_run(ours, x, grad)
            assert names == _one_kernel_here(), names
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
@pytest.mark.parametrize("kind", ["nchw", "bf16", "stride-2", "few-pixels"])
def test_other_1x1_layers_keep_the_two_kernels(kind):
    """NCHW, bf16, a stride of 2 and a map of too few pixels for two chunks a core run the dX and dW
    kernels as before."""
    from tvm_convgrad.torch import get_backward, set_backward

    stock, ours = _pointwise(channels_last=kind != "nchw")
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    ours = ours.to(dtype)
    if kind == "stride-2":
        ours.stride = (2, 2)
    memory = torch.contiguous_format if kind == "nchw" else torch.channels_last
    size, batch = (16, 4) if kind != "few-pixels" else (6, 1)
    out = size // 2 if kind == "stride-2" else size
    x = torch.randn(batch, 32, size, size, dtype=dtype).contiguous(memory_format=memory)
    previous = get_backward()
    set_backward("ours")
    try:
        names, _ = kernels_run(ours, x, torch.randn(batch, 48, out, out, dtype=dtype).contiguous(memory_format=memory))
    finally:
        set_backward(previous)
    assert names == {"tvm_convgrad::conv2d_input_grad", "tvm_convgrad::conv2d_weight_grad"}, names


@needs_torch
def test_unaligned_views_are_copied_for_the_one_kernel():
    """x, dy and the weight one element past an aligned start (the kernel's loads take aligned
    data): the C++ node copies them, and the gradients are stock's."""
    from tvm_convgrad.torch import get_backward, set_backward

    torch.manual_seed(1)
    stock, ours = _pointwise()
    weight = unaligned((48, 32, 1, 1), False)
    x, grad = unaligned((2, 32, 12, 12), True), unaligned((2, 48, 12, 12), True)
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
    assert names == _one_kernel_here()
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
