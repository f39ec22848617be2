"""dX and the forward of a weight-bound fp32 layer with its weights read where they lie
(:mod:`tvm_convgrad.schedule.cpu.weight_stream`) and the drop-in's use of them.

dX and the forward (with and without a bias) against the float64 references written from the
formulas (``tvm_convgrad.reference``), within fp32's summation bound of each element's terms (the
columns count the dead taps' zeros too): NCHW
and NHWC activations with OIHW and OHWI weights, strides, dilation, asymmetric pads, an even
kernel, rows no tap reaches, pixels that are no multiple of a tile, vectors of 16, 8 and 4 lanes,
on every ISA plan this host runs and compiled for AArch64; every argument flush against a
``PROT_NONE`` page; the PyTorch drop-in runs it for a weight-bound layer (its Python and C++ nodes)
and not for another. The layers are small: ``fits`` is asked of the kernel's rule with its
thresholds lowered (:data:`~tvm_convgrad.schedule.cpu.weight_stream.COLD_WEIGHT_BYTES`).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from tvm_convgrad import isa_target, reference
from tvm_convgrad.compile import build_func, pass_context, resolve_target
from tvm_convgrad.schedule.cpu import weight_stream
from tvm_convgrad.schedule.cpu.weight_stream import StreamedLayer, forward_tile, streamed_forward_func, streamed_input_grad_func

from one_pass import assert_runs_guarded

from conftest import NEON, RUNNABLE_ISAS, native_first, needs_torch, tiered, torch

# (n, c, o, (h, w), (kh, kw), strides, pads (top, bottom, left, right), dilation)
CASES = [
    (8, 32, 48, (2, 2), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # ResNet-18's layer4 shape, narrower: 2x2 maps, N=8
    (2, 24, 40, (5, 4), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # strided, no square map
    (2, 16, 24, (5, 5), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),  # dilated
    (3, 20, 16, (4, 5), (2, 3), (1, 1), (0, 1, 1, 0), (1, 1)),  # an even kernel, asymmetric pads; 120 columns: 8 lanes
    (1, 12, 8, (7, 6), (3, 3), (3, 3), (0, 0, 0, 0), (1, 1)),  # stride 3 over a 7-row map: row 6 no tap reaches
    (2, 4, 10, (3, 3), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # 36 columns: 4 lanes
]
LAYOUTS = [(False, False), (True, True), (True, False), (False, True)]  # (NHWC activations, OHWI weights)


def _ids(case):
    n, c, o, (h, w), (kh, kw), s, p, d = case
    return f"n{n}_c{c}_o{o}_{h}x{w}_k{kh}x{kw}_s{s[0]}_p{''.join(map(str, p))}_d{d[0]}"


def _layer(case, layout, lanes: int = 16, registers: int = 32, cores: int = 2) -> StreamedLayer:
    n, c, o, (h, w), (kh, kw), strides, pads, dilation = case
    return StreamedLayer(n, c, h, w, o, kh, kw, strides, pads, dilation, *layout, lanes, registers, cores)


@pytest.fixture
def small_layers_bound(monkeypatch):
    """The tests' small layers taken as weight-bound ones."""
    monkeypatch.setattr(weight_stream, "COLD_WEIGHT_BYTES", 1)


def _run(layer: StreamedLayer, target, seed: int = 0):
    """``(dy, w, dx)`` in NCHW / OIHW: float32 inputs and the kernel's result (NaN where it wrote nothing)."""
    import tvm

    g = layer
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal((g.n, g.o, g.ho, g.wo), dtype=np.float32)
    w = rng.standard_normal((g.o, g.c, g.kh, g.kw), dtype=np.float32)
    dy_memory = dy.transpose(0, 2, 3, 1) if g.channels_last else dy
    w_memory = w.transpose(0, 2, 3, 1) if g.weights_last else w
    dx_shape = (g.n, g.h, g.w, g.c) if g.channels_last else (g.n, g.c, g.h, g.w)
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in (dy_memory, w_memory, np.full(dx_shape, np.nan, np.float32))]
    build_func(streamed_input_grad_func(layer), target)(*tensors)
    dx = tensors[2].numpy()
    return dy, w, dx.transpose(0, 3, 1, 2) if g.channels_last else dx


def _assert_exact(layer: StreamedLayer, dy, w, dx):
    """dX within ``terms * 2^-24 * sum|terms|`` of the float64 reference, ``terms`` the columns GEMM's
    ``O`` products and a column sum of every tap."""
    g = layer
    conv = dict(strides=g.strides, pads=g.pads, dilations=g.dilation)
    expected = reference.conv2d_backprop_input(w, dy, (g.h, g.w), **conv)
    magnitude = reference.conv2d_backprop_input(np.abs(w), np.abs(dy), (g.h, g.w), **conv)
    assert dx.shape == expected.shape and not np.isnan(dx).any()
    error = np.abs(dx.astype(np.float64) - expected)
    bound = (g.o + g.kh * g.kw) * 2.0**-24 * magnitude + 1e-30
    assert (error <= bound).all(), f"worst {float((error / bound).max()):.3g} x the bound"


def _run_forward(layer: StreamedLayer, target, bias: bool, seed: int = 0):
    """``(x, w, bias, y)`` in NCHW / OIHW: float32 inputs and the kernel's result (NaN where it wrote nothing)."""
    import tvm

    g = layer
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((g.n, g.c, g.h, g.w), dtype=np.float32)
    w = rng.standard_normal((g.o, g.c, g.kh, g.kw), dtype=np.float32)
    b = rng.standard_normal(g.o, dtype=np.float32) if bias else None
    x_memory = x.transpose(0, 2, 3, 1) if g.channels_last else x
    w_memory = w.transpose(0, 2, 3, 1) if g.weights_last else w
    y_shape = (g.n, g.ho, g.wo, g.o) if g.channels_last else (g.n, g.o, g.ho, g.wo)
    arrays = [x_memory, w_memory] + ([b] if bias else []) + [np.full(y_shape, np.nan, np.float32)]
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]
    build_func(streamed_forward_func(layer, bias), target)(*tensors)
    y = tensors[-1].numpy()
    return x, w, b, y.transpose(0, 3, 1, 2) if g.channels_last else y


def _assert_exact_forward(layer: StreamedLayer, x, w, b, y):
    """y within ``(M + 1) * 2^-24 * sum|terms|`` of the float64 reference (M products and the bias)."""
    g = layer
    conv = dict(strides=g.strides, pads_begin=g.pads[::2], dilations=g.dilation, pads_end=g.pads[1::2])
    expected = reference.conv_forward_nd(x, w, bias=b, **conv)
    magnitude = reference.conv_forward_nd(np.abs(x), np.abs(w), bias=None if b is None else np.abs(b), **conv)
    assert y.shape == expected.shape and not np.isnan(y).any()
    error = np.abs(y.astype(np.float64) - expected)
    bound = (g.columns + 1) * 2.0**-24 * magnitude + 1e-30
    assert (error <= bound).all(), f"worst {float((error / bound).max()):.3g} x the bound"


@pytest.mark.parametrize("layout", LAYOUTS, ids=["nchw-oihw", "nhwc-ohwi", "nhwc-oihw", "nchw-ohwi"])
@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i < 3, _ids))
def test_dx_and_the_forward_match_the_references(case, layout, small_layers_bound):
    target = isa_target("native")
    layer = _layer(case, layout)
    _assert_exact(layer, *_run(layer, target))
    _assert_exact_forward(layer, *_run_forward(layer, target, bias=layout[0]))


@pytest.mark.parametrize("isa", native_first(RUNNABLE_ISAS))
def test_dx_matches_the_reference_on_every_isa(isa, small_layers_bound):
    """The ISA's own lanes and registers (AVX2's 8 and 16: smaller tiles)."""
    from tvm_convgrad.isa import isa_plan

    target = isa_target(isa)
    plan = isa_plan(target)
    layer = _layer(CASES[0], LAYOUTS[1], plan.lanes, plan.registers)
    _assert_exact(layer, *_run(layer, target))
    _assert_exact_forward(layer, *_run_forward(layer, target, bias=True))


@pytest.mark.parametrize("kernel", ["input_grad", "forward"])
def test_the_kernels_compile_for_aarch64(kernel, small_layers_bound):
    """NEON's 4 lanes: each GEMM's sums are ``fmla`` on 4-lane vectors."""
    import tvm

    target = resolve_target(NEON)
    layer = _layer(CASES[0], LAYOUTS[0], lanes=4)
    func = streamed_input_grad_func(layer) if kernel == "input_grad" else streamed_forward_func(layer, False)
    with pass_context(target):
        executable = tvm.compile(tvm.IRModule({str(func.attrs["global_symbol"]): func}), target=target)
    assert re.search(r"\bfmla\s+v\d+\.4s", executable.mod.inspect_source("asm"))


def test_the_forward_tile_fits_the_registers():
    """Rows a divisor of O, ``r * a + r + a`` within 3/4 of the registers: 4 x 4 on AVX-512 for 512
    channels, 2 x 3 on AVX2; 7 channels take rows of 7 or 1."""
    assert forward_tile(_layer(CASES[0], LAYOUTS[0])) == (4, 4)
    assert forward_tile(_layer((8, 512, 512, (2, 2), (3, 3), (1, 1), (1,) * 4, (1, 1)), LAYOUTS[0], 8, 16)) == (2, 3)
    for o in (7, 48, 512, 1000):
        for registers in (16, 32):
            r, a = forward_tile(_layer((1, 16, o, (4, 4), (3, 3), (1, 1), (1,) * 4, (1, 1)), LAYOUTS[0], 16, registers))
            assert o % r == 0 and r * a + r + a <= registers * 3 // 4, (o, registers, r, a)


def test_the_layers_it_takes():
    """ResNet-18's 512 -> 512 3x3 on 2x2 maps at N=8 and its 256 -> 512 / 2, ResNet-50's 512 -> 512 on
    7x7 at N=1: yes; at N=8 on 7x7 (392 pixels), 256 -> 256 on 2x2 (2.4 MB of weights), a 1x1 of 4 MB
    (the cube's), too few column groups for the cores: no."""
    assert weight_stream.weight_bound(32, 9 << 20) and not weight_stream.weight_bound(65, 9 << 20)
    assert not weight_stream.weight_bound(32, (4 << 20) - 1)
    nchw = (False, False)
    assert _layer((8, 512, 512, (2, 2), (3, 3), (1, 1), (1,) * 4, (1, 1)), nchw).fits()
    assert _layer((8, 256, 512, (4, 4), (3, 3), (2, 2), (1,) * 4, (1, 1)), nchw).fits()
    assert _layer((1, 512, 512, (7, 7), (3, 3), (1, 1), (1,) * 4, (1, 1)), nchw).fits()
    assert not _layer((8, 512, 512, (7, 7), (3, 3), (1, 1), (1,) * 4, (1, 1)), nchw).fits()
    assert not _layer((8, 256, 256, (2, 2), (3, 3), (1, 1), (1,) * 4, (1, 1)), nchw).fits()
    assert not _layer((1, 2048, 512, (7, 7), (1, 1), (1, 1), (0,) * 4, (1, 1)), nchw).fits()
    assert not _layer((8, 512, 512, (2, 2), (3, 3), (1, 1), (1,) * 4, (1, 1)), nchw, cores=64).fits()


GUARDED = r"""
from tvm_convgrad.schedule.cpu import weight_stream
from tvm_convgrad.schedule.cpu.weight_stream import StreamedLayer, streamed_forward_func, streamed_input_grad_func
from tvm_convgrad import reference
weight_stream.COLD_WEIGHT_BYTES = 1
nchw = lambda a, last: a.transpose(0, 3, 1, 2) if last else a
for n, c, o, (h, w), (kh, kw), strides, pads, dilation in eval(sys.argv[3]):
    for last in (False, True):
        layer = StreamedLayer(n, c, h, w, o, kh, kw, strides, pads, dilation, last, last, plan.lanes, plan.registers, 2)
        rng = np.random.default_rng(1)
        dy_shape = (n, layer.ho, layer.wo, o) if last else (n, o, layer.ho, layer.wo)
        w_shape = (o, kh, kw, c) if last else (o, c, kh, kw)
        x_shape = (n, h, w, c) if last else (n, c, h, w)
        shapes = (dy_shape, w_shape, x_shape, x_shape, (o,), dy_shape)
        dy, wt, dx, x, bias, y = (memory.array(shape, np.float32, side) for shape in shapes)
        for a in (dy, wt, x, bias):
            a[...] = rng.standard_normal(a.shape, dtype=np.float32)
        print("start", (n, c, o, h, w, last), flush=True)
        build_func(streamed_input_grad_func(layer), target)(*[tvm.runtime.from_dlpack(a) for a in (dy, wt, dx)])
        build_func(streamed_forward_func(layer, True), target)(*[tvm.runtime.from_dlpack(a) for a in (x, wt, bias, y)])
        w_oihw = nchw(wt, last)
        expected = reference.conv2d_backprop_input(w_oihw, nchw(dy, last), (h, w), strides, pads, dilation)
        assert np.abs(nchw(dx, last) - expected).max() < 1e-3 * max(1.0, np.abs(expected).max())
        expected = reference.conv_forward_nd(nchw(x, last), w_oihw, strides, pads[::2], dilation, pads_end=pads[1::2], bias=bias)
        assert np.abs(nchw(y, last) - expected).max() < 1e-3 * max(1.0, np.abs(expected).max())
print("done", flush=True)
"""


@pytest.mark.parametrize("side", ["after", "before"])
def test_the_kernels_read_and_write_inside_their_tensors(side):
    """dy, the weight, dX, x, the bias and y each flush against a page mapped ``PROT_NONE`` (after
    the array, then before it): a tile or a tap read past an edge faults the child process."""
    assert_runs_guarded(GUARDED, side, CASES)


@needs_torch
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_drop_in_streams_a_weight_bound_layers_weights(channels_last, small_layers_bound, monkeypatch):
    """A weight-bound layer's plan holds these kernels for its dX and forward (its Python and C++
    nodes run them: the same bits), equal to PyTorch's within fp32's bound; another layer's are the rule's."""
    from tvm_convgrad.torch import Conv2d, kernels, set_backward, set_forward

    monkeypatch.setattr(kernels, "target_cores", lambda target: 2)  # (the rule's tasks, whatever this host's cores)
    for cached in (kernels.streamed_input_grad_kernel, kernels.streamed_forward_kernel, kernels.call_plan):
        cached.cache_clear()
    set_backward("ours")
    set_forward("ours")
    try:
        memory = torch.channels_last if channels_last else torch.contiguous_format
        torch.manual_seed(0)
        layer = Conv2d(64, 48, 3, padding=1, bias=False).to(memory_format=memory)
        stock = torch.nn.Conv2d(64, 48, 3, padding=1, bias=False).to(memory_format=memory)
        stock.load_state_dict(layer.state_dict())
        x = torch.randn(4, 64, 3, 3).to(memory_format=memory).requires_grad_()
        g = torch.randn(4, 48, 3, 3).to(memory_format=memory)
        grads, outputs = [], []
        for _ in range(3):  # the Python node, then the C++ one once settled
            x.grad = None
            y = layer(x)
            y.backward(g)
            grads.append(x.grad.clone())
            outputs.append(y.detach())
        plan = kernels.tensors_plan(x, layer.weight, (1, 1), (1,) * 4, (1, 1), 1, channels_last)
        assert isinstance(plan.input_grad, kernels.Written) and kernels.streamed_forward_kernel(plan.call, False) is not None
        assert all(torch.equal(grads[0], later) for later in grads[1:]) and all(torch.equal(outputs[0], y) for y in outputs[1:])
        xs = x.detach().clone().requires_grad_()
        ys = stock(xs)
        ys.backward(g)
        torch.testing.assert_close(x.grad, xs.grad, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(outputs[0], ys, rtol=1e-5, atol=1e-4)
        assert outputs[0].is_contiguous(memory_format=memory)
        other = kernels.tensors_plan(torch.randn(4, 64, 9, 9), layer.weight, (1, 1), (1,) * 4, (1, 1), 1, False)
        assert not isinstance(other.input_grad, kernels.Written)  # 324 pixels: not weight-bound
        assert kernels.streamed_forward_kernel(other.call, False) is None
    finally:
        set_backward(os.environ.get("TVM_CONVGRAD_BACKWARD", "auto"))
        set_forward(os.environ.get("TVM_CONVGRAD_FORWARD", "auto"))
        for cached in (kernels.streamed_input_grad_kernel, kernels.streamed_forward_kernel, kernels.call_plan):
            cached.cache_clear()
