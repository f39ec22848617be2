"""PyTorch's BLAS way of a 1x1 layer (tvm_convgrad.torch.blas): its three GEMMs against the float64
convolution, in both layouts, and ``"auto"`` running it where it wins against PyTorch's convolution."""

import itertools
import os

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from tvm_convgrad.torch import Conv2d, backward_choices, forward_choices, set_backward, set_forward  # noqa: E402
from tvm_convgrad.schedule.cpu import weight_stream  # noqa: E402
from tvm_convgrad.torch import backward as backward_module  # noqa: E402
from tvm_convgrad.torch import blas  # noqa: E402
from tvm_convgrad.torch import forward as forward_module  # noqa: E402


@pytest.fixture
def auto_modes():
    """Both modes ``"auto"`` for the test, the run's own after it."""
    set_forward("auto")
    set_backward("auto")
    yield
    set_forward(os.environ.get("TVM_CONVGRAD_FORWARD", "auto"))
    set_backward(os.environ.get("TVM_CONVGRAD_BACKWARD", "auto"))


def _memory(channels_last: bool):
    return torch.channels_last if channels_last else torch.contiguous_format


def _assert_fp32_sums(actual, expected, magnitude, terms: int):
    """``actual`` within the bound of ``terms``-term float32 sums in any order (BLAS chooses it:
    MKL's AVX2 and AVX-512 kernels differ) of ``expected``: ``terms`` * 2**-24 * the float64 sum
    of the terms' magnitudes, ``magnitude``."""
    bound = terms * 2.0**-24 * magnitude + 2.0**-24 * expected.abs()
    error = (actual.double() - expected).abs()
    assert (error <= bound).all(), f"error {(error / bound).max().item():.3g}x the bound of {terms}-term float32 sums"


def _convolution_backward(dy, x, w):
    """dX and dW of an unpadded 1x1 at stride 1 in float64."""
    dx, dw, _ = torch.ops.aten.convolution_backward(dy.double(), x.double(), w.double(), None, [1, 1], [0, 0], [1, 1], False,
                                                    [0, 0], 1, [True, True, False])  # fmt: skip
    return dx, dw


@pytest.mark.parametrize("channels_last, bias, batch, size, copies", [
    case for case in itertools.product([False, True], [False, True], [1, 3], [(5, 7), (12, 11)], [False, True])
    if not case[-1] or not case[0]])  # fmt: skip
def test_the_three_gemms_match_the_float64_convolution(channels_last, bias, batch, size, copies, monkeypatch):
    """Both ways of an NCHW dW: one GEMM over copies (35 pixels an image) and a GEMM per image
    accumulated (132 pixels, at least blas.ACCUMULATE_FROM); an NCHW forward and dX of 35 pixels
    an image over copies too where ``copies`` lowers blas.COPIES_MIN_CHANNELS to these 24 and 40
    channels."""
    assert 5 * 7 < blas.ACCUMULATE_FROM <= 12 * 11
    monkeypatch.setattr(blas, "COPIES_MIN_CHANNELS", 24 if copies else blas.COPIES_MIN_CHANNELS)
    assert blas._copies(torch.empty(batch, 24, *size), torch.empty(40, 24)) == (copies and batch > 1 and size == (5, 7))
    torch.manual_seed(batch)
    memory = _memory(channels_last)
    x = torch.randn(batch, 24, *size).to(memory_format=memory)
    w = torch.randn(40, 24, 1, 1).to(memory_format=memory)
    b = torch.randn(40) if bias else None
    y = blas.forward(x, w, b, channels_last)
    expected = F.conv2d(x.double(), w.double(), None if b is None else b.double())
    magnitude = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs())
    _assert_fp32_sums(y, expected, magnitude, 24 + 1)
    dy = torch.randn(expected.shape).to(memory_format=memory)
    dx, dw = blas.gradients(dy, x, w, channels_last)(True, True)
    ref_dx, ref_dw = _convolution_backward(dy, x, w)
    abs_dx, abs_dw = _convolution_backward(dy.abs(), x.abs(), w.abs())
    _assert_fp32_sums(dx, ref_dx, abs_dx, 40)
    _assert_fp32_sums(dw, ref_dw, abs_dw, batch * size[0] * size[1])
    for t in (y, dx):  # the input's layout, as PyTorch's convolution lays its results
        assert t.is_contiguous(memory_format=memory)
    assert dw.shape == w.shape
    assert blas.gradients(dy, x, w, channels_last)(False, True)[0] is None and blas.gradients(dy, x, w, channels_last)(True, False)[1] is None


@pytest.mark.parametrize("kernel, stride, pads, groups, dtype, applies", [
    (1, 1, (0, 0, 0, 0), 1, torch.float32, True),
    (1, 2, (0, 0, 0, 0), 1, torch.float32, False),   # strided: not one GEMM over the pixels
    (1, 1, (1, 1, 1, 1), 1, torch.float32, False),   # padded
    (1, 1, (0, 0, 0, 0), 2, torch.float32, False),   # grouped
    (3, 1, (1, 1, 1, 1), 1, torch.float32, False),   # 3x3
    (1, 1, (0, 0, 0, 0), 1, torch.bfloat16, False),  # bf16: the package's sums in float32
])  # fmt: skip
def test_only_an_unpadded_ungrouped_float32_1x1_at_stride_1_applies(kernel, stride, pads, groups, dtype, applies):
    x = torch.zeros(2, 8, 6, 6, dtype=dtype)
    w = torch.zeros(8, 8 // groups, kernel, kernel, dtype=dtype)
    assert blas.applies(x, w, (stride, stride), pads, groups) == applies


@pytest.mark.parametrize("channels_last", [False, True])
def test_auto_runs_the_blas_way_where_it_wins(channels_last, auto_modes, monkeypatch):
    """PyTorch's BLAS GEMMs winning against its convolution, the package's against neither: the
    forward and both gradients run on BLAS (``aten::mm``, no convolution) and match stock."""
    def blas_wins(candidate, incumbent):
        return getattr(candidate, "func", None) is blas.forward or getattr(candidate, "func", None).__qualname__.startswith("gradients.")

    monkeypatch.setattr(forward_module, "wins", blas_wins)
    monkeypatch.setattr(backward_module, "wins", blas_wins)
    # PyTorch's two the fastest
    monkeypatch.setattr(backward_module, "_timings", lambda runs, *_: {way: 10.0 - len(way) for way in runs})
    torch.manual_seed(0)
    memory = _memory(channels_last)
    layer = Conv2d(32, 48, 1, bias=True).to(memory_format=memory)
    stock = torch.nn.Conv2d(32, 48, 1).to(memory_format=memory)
    stock.load_state_dict(layer.state_dict())
    x = torch.randn(2, 32, 6, 6).to(memory_format=memory).requires_grad_()
    g = torch.randn(2, 48, 6, 6).to(memory_format=memory)
    layer(x).backward(g)  # the choices
    assert list(forward_choices().values()) == [False] and set(backward_choices().values()) == {False}
    xs = x.detach().clone().requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        x.grad = None
        layer.weight.grad = None
        y = layer(x)
        y.backward(g)
    calls = {e.key for e in prof.key_averages()}
    assert "aten::mm" in calls or "aten::addmm" in calls or "aten::bmm" in calls, calls
    assert not calls & {"aten::convolution_backward", "aten::mkldnn_convolution", "aten::convolution"}, calls
    y_stock = stock(xs)
    y_stock.backward(g)
    torch.testing.assert_close(y, y_stock, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xs.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, stock.weight.grad, rtol=1e-5, atol=1e-5)
    assert x.grad.is_contiguous(memory_format=memory) and y.is_contiguous(memory_format=memory)


def test_wins_needs_two_timings_of_three(monkeypatch):
    """``wins``: the candidate faster by the margin in two timings of three (a third only where the
    first two disagree: a shared machine's speed swung); one timing either way does not decide."""
    fast, slow = (lambda: None), (lambda: None)
    for timings, won in (((1.0, 1.0), True), ((3.0, 3.0), False), ((1.0, 3.0, 3.0), False), ((3.0, 1.0, 3.0), False), ((1.0, 3.0, 1.0), True),
                         ((3.0, 1.0, 1.0), True)):  # fmt: skip
        times = iter([t for t in timings for _ in range(forward_module.ROUNDS)])
        monkeypatch.setattr(forward_module, "elapsed_ms", lambda fn: next(times) if fn is fast else 2.0)
        assert forward_module.wins(fast, slow) == won and next(times, None) is None, timings


def test_the_blas_way_is_made_only_where_it_is_timed_or_runs(auto_modes, monkeypatch):
    """Once ``"auto"`` has kept PyTorch's convolution over the BLAS way for a 1x1 layer, its later
    backward calls do not make the BLAS way (its views and detached tensors, ~5 us a call)."""
    monkeypatch.setattr(forward_module, "wins", lambda candidate, incumbent: False)
    monkeypatch.setattr(backward_module, "wins", lambda candidate, incumbent: False)
    # PyTorch's two the fastest
    monkeypatch.setattr(backward_module, "_timings", lambda runs, *_: {way: 10.0 - len(way) for way in runs})
    made = []
    monkeypatch.setattr(blas, "gradients", lambda *args: made.append(args) or (lambda dx, dw: (None, None)))
    layer = Conv2d(32, 48, 1, bias=False)
    x = torch.randn(2, 32, 6, 6, requires_grad=True)
    layer(x).sum().backward()  # the choices: the BLAS way made once, to be timed
    assert len(made) == 1 and set(backward_choices().values()) == {False}
    for _ in range(3):
        layer(x).sum().backward()
    assert len(made) == 1 and x.grad is not None


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("batch, size, kernel, stride, pad, dilation", [
    (8, 2, 3, 1, 1, 1),   # ResNet-18's layer4 shape, small: 2x2 maps, every output pixel at an edge
    (3, 5, 3, 2, 1, 1),   # strided, an odd map
    (2, 7, 3, 1, 2, 2),   # dilated
    (2, 6, 2, 1, 0, 1),   # an even kernel, unpadded
    (1, 4, 1, 2, 0, 1),   # a strided 1x1 (blas.applies does not take it)
])  # fmt: skip
def test_the_columns_way_matches_the_float64_gradients(channels_last, batch, size, kernel, stride, pad, dilation):
    """dW over im2col columns against the float64 convolution's, in the weight's layout; its dX
    PyTorch's convolution's (the function given), and each only where asked for."""
    torch.manual_seed(size)
    memory = _memory(channels_last)
    x = torch.randn(batch, 24, size, size).to(memory_format=memory)
    w = torch.randn(40, 24, kernel, kernel).to(memory_format=memory)
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    dy = torch.randn(batch, 40, out, out).to(memory_format=memory)
    asked = []

    def theirs(dx, dw):
        asked.append((dx, dw))
        return backward_module.pytorch_gradients(dy, x, w, (stride,) * 2, (pad,) * 4, (dilation,) * 2, 1)(dx, dw)

    grads = blas.column_gradients(dy, x, w, (stride,) * 2, (pad,) * 4, (dilation,) * 2, theirs)
    dx, dw = grads(True, True)
    args = ([stride] * 2, [pad] * 2, [dilation] * 2, False, [0, 0], 1, [True, True, False])
    ref_dx, ref_dw, _ = torch.ops.aten.convolution_backward(dy.double(), x.double(), w.double(), None, *args)
    _, abs_dw, _ = torch.ops.aten.convolution_backward(dy.double().abs(), x.double().abs(), w.double().abs(), None, *args)
    _assert_fp32_sums(dw, ref_dw, abs_dw, batch * out * out)
    assert dw.shape == w.shape and dw.is_contiguous(memory_format=memory)
    torch.testing.assert_close(dx.double(), ref_dx, rtol=1e-5, atol=1e-4)
    assert asked == [(True, False)]
    assert grads(False, True)[0] is None and grads(True, False)[1] is None and asked[-1] == (True, False) and len(asked) == 2


@pytest.mark.parametrize("dtype, groups, applies", [
    (torch.float32, 1, True), (torch.float32, 2, False), (torch.bfloat16, 1, False), (torch.float16, 1, False)])
def test_the_columns_way_takes_ungrouped_float32_calls(dtype, groups, applies):
    x, w = torch.zeros(1, 8, 2, 2, dtype=dtype), torch.zeros(8, 8 // groups, 3, 3, dtype=dtype)
    assert blas.columns_apply(x, w, groups) == applies


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("weight_bound", [False, True])
def test_auto_times_the_columns_way_of_a_weight_bound_layer(channels_last, weight_bound, auto_modes, monkeypatch, fresh_plans):
    """A layer that :func:`backward.weight_bound` (its limits lowered to this layer's 147 KB of
    weights) whose columns' dW wins: both gradients run that way (``aten::im2col`` and a GEMM for
    dW, PyTorch's convolution for dX) and match stock's; a layer that is not has no such way made."""
    if weight_bound:
        monkeypatch.setattr(weight_stream, "COLD_WEIGHT_BYTES", 64 * 64 * 9 * 4)
    columns_win = lambda candidate, incumbent: candidate.func.__qualname__.startswith("column_gradients.")  # noqa: E731
    monkeypatch.setattr(forward_module, "wins", columns_win)
    monkeypatch.setattr(backward_module, "wins", columns_win)
    # PyTorch's two the fastest
    monkeypatch.setattr(backward_module, "_timings", lambda runs, *_: {way: 10.0 - len(way) for way in runs})
    made = []
    real = blas.column_gradients
    monkeypatch.setattr(blas, "column_gradients", lambda *args: made.append(args) or real(*args))
    torch.manual_seed(0)
    memory = _memory(channels_last)
    layer = Conv2d(64, 64, 3, padding=1, bias=False).to(memory_format=memory)
    stock = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).to(memory_format=memory)
    stock.load_state_dict(layer.state_dict())
    x = torch.randn(4, 64, 2, 2).to(memory_format=memory).requires_grad_()
    g = torch.randn(4, 64, 2, 2).to(memory_format=memory)
    layer(x).backward(g)  # the choices
    assert bool(made) == weight_bound and set(backward_choices().values()) == {False}
    xs = x.detach().clone().requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        x.grad = None
        layer.weight.grad = None
        layer(x).backward(g)
    calls = {e.key for e in prof.key_averages()}
    assert ("aten::im2col" in calls) == weight_bound, calls
    stock(xs).backward(g)
    torch.testing.assert_close(x.grad, xs.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(layer.weight.grad, stock.weight.grad, rtol=1e-5, atol=1e-4)
