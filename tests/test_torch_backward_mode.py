"""The drop-in's backward mode (tvm_convgrad.torch.backward): per GEMM, the package's kernel or
PyTorch's ``convolution_backward``; ``"auto"`` times both once per signature and GEMM."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import DROP_IN_NODES  # noqa: E402
from tvm_convgrad import ConvGradError  # noqa: E402
from tvm_convgrad.torch import Conv2d, backward_choices, get_backward, input_grad_kernel, set_backward, weight_grad_kernel  # noqa: E402
from tvm_convgrad.schedule.cpu import weight_stream  # noqa: E402
from tvm_convgrad.torch import backward as backward_module  # noqa: E402


@pytest.fixture
def backward_mode():
    """Restores the run's mode (``TVM_CONVGRAD_BACKWARD``, "ours" under the tests) after the test."""
    yield set_backward
    set_backward(os.environ.get("TVM_CONVGRAD_BACKWARD", "auto"))


def _grads(layer, x, g):
    x = x.detach().requires_grad_(x.requires_grad)
    layer.zero_grad(set_to_none=True)
    layer(x).backward(g)
    return x.grad, layer.weight.grad


def _stock(layer, x, g):
    stock = torch.nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.padding, bias=False)
    stock.load_state_dict(layer.state_dict())
    return _grads(stock, x, g)


def _layer_and_tensors(channels=16, size=8, padding=1):
    torch.manual_seed(3)
    layer = Conv2d(channels, 2 * channels, 3, padding=padding, bias=False)
    x = torch.rand(2, channels, size, size).requires_grad_()
    g = torch.rand(layer(x).shape)
    return layer, x, g


def test_auto_times_each_gemm_of_a_signature_once(backward_mode):
    backward_mode("auto")
    layer, x, g = _layer_and_tensors()
    dx, dw = _grads(layer, x, g)
    choices = backward_choices()
    assert sorted(gemm for _, gemm in choices) == ["dw", "dx"]
    assert all(call.x_shape == (2, 16, 8, 8) and isinstance(ours, bool) for (call, _), ours in choices.items())
    again = _grads(layer, x, g)
    assert backward_choices() == choices  # timed once per signature and GEMM
    stock = _stock(layer, x, g)
    for ours, theirs in zip((dx, dw, *again), stock * 2):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def _timed_as(times: dict, seen: list):
    """A stand-in for ``backward._timings``: the given medians of the ways (PyTorch's GEMMs) asked for."""

    def timings(runs, cold=False):
        seen.append(set(runs))
        return {way: times[way] for way in runs}

    return timings


NONE, DX, DW, BOTH = frozenset(), frozenset({"dx"}), frozenset({"dw"}), frozenset({"dx", "dw"})


@pytest.mark.parametrize("times, given_up", [({NONE: 10, DX: 9.8, DW: 9.9, BOTH: 9.7}, set()),  # every way within the margin: the package's
                                             ({NONE: 10, DX: 9, DW: 6, BOTH: 7}, {"dw"}),  # PyTorch's dW alone the fastest way
                                             ({NONE: 10, DX: 8, DW: 8, BOTH: 5}, {"dx", "dw"})])  # fmt: skip
def test_auto_runs_the_fastest_way_unless_the_package_is_within_the_margin(times, given_up, backward_mode, monkeypatch):
    layer, x, g = _layer_and_tensors(channels=32)
    backward_mode("ours")
    ours = _grads(layer, x, g)
    seen = []
    monkeypatch.setattr(backward_module, "_timings", _timed_as(times, seen))
    backward_mode("auto")
    got = _grads(layer, x, g)
    assert seen == [{NONE, DX, DW, BOTH}] + ([{NONE, frozenset(given_up)}] if given_up else [])  # every way once; a switch again
    assert {gemm for (_, gemm), package in backward_choices().items() if not package} == given_up
    for gemm, mine, theirs, stock in zip(("dx", "dw"), got, ours, _stock(layer, x, g)):
        if gemm in given_up:
            torch.testing.assert_close(mine, stock, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(mine, theirs)


@pytest.mark.parametrize("bound", [False, True])
def test_auto_times_a_weight_bound_layer_with_its_caches_emptied(bound, backward_mode, monkeypatch, fresh_plans):
    """A layer whose weights outweigh its work (:func:`backward.weight_bound`) is timed with
    ``EVICT_BYTES`` written before each timed call, every way; another layer hot."""
    if bound:  # the test's small layer taken as a weight-bound one
        monkeypatch.setattr(weight_stream, "COLD_WEIGHT_BYTES", 1)
        monkeypatch.setattr(weight_stream, "COLD_PIXELS", 10**6)
    monkeypatch.setattr(backward_module, "EVICT_BYTES", 4096)
    colds, fills = [], []
    real_timings, real_fill = backward_module._timings, torch.Tensor.fill_
    monkeypatch.setattr(backward_module, "_timings", lambda runs, cold=False: colds.append(cold) or real_timings(runs, cold))
    monkeypatch.setattr(torch.Tensor, "fill_", lambda t, v: fills.append(t.numel()) or real_fill(t, v))
    layer, x, g = _layer_and_tensors(channels=32)
    backward_mode("auto")
    _grads(layer, x, g)
    assert colds and all(cold == bound for cold in colds)
    assert (fills.count(4096) >= 4 * backward_module.ROUNDS) == bound  # four ways, every round


def test_weight_bound_layers():
    """ResNet-18's 512 -> 512 3x3 on 2x2 maps at N=8 (9.4 MB of float32 weights, 4.7 MB of bf16 ones,
    32 output pixels) and a late ResNet-50 layer at N=1 are weight-bound; at N=8 on 7x7 maps (392
    pixels), or 256 -> 256 on 2x2 (2.4 MB of float32 weights), not."""
    from tvm_convgrad.frontends.conv2d import Conv2dGradients

    def call(x_shape, w_shape, dtype="float32"):
        return Conv2dGradients(x_shape, w_shape, (1, 1), (1, 1, 1, 1), (1, 1), 1, dtype)

    assert backward_module.weight_bound(call((8, 512, 2, 2), (512, 512, 3, 3)))
    assert backward_module.weight_bound(call((1, 512, 7, 7), (512, 512, 3, 3)))
    assert backward_module.weight_bound(call((8, 512, 2, 2), (512, 512, 3, 3), "bfloat16"))
    assert not backward_module.weight_bound(call((8, 512, 7, 7), (512, 512, 3, 3)))
    assert not backward_module.weight_bound(call((8, 256, 2, 2), (256, 256, 3, 3)))


def test_a_switch_the_second_timing_does_not_confirm_keeps_the_packages(backward_mode, monkeypatch):
    """PyTorch's dW the fastest way in the first timing, not in the second (the machine's speed
    swung): the package's GEMMs stay."""
    layer, x, g = _layer_and_tensors(channels=32)
    timings = iter([{NONE: 10, DX: 9, DW: 6, BOTH: 7}, {NONE: 10, DW: 9.8}])
    seen = []
    monkeypatch.setattr(backward_module, "_timings",
                        lambda runs, *_: seen.append(set(runs)) or {way: t for way, t in next(timings).items() if way in runs})
    backward_mode("auto")
    _grads(layer, x, g)
    assert seen == [{NONE, DX, DW, BOTH}, {NONE, DW}]
    assert set(backward_choices().values()) == {True}


@pytest.mark.parametrize("times, settled", [({NONE: 10, DX: 9.8, DW: 9.9, BOTH: 9.7}, True),  # the package's throughout
                                            ({NONE: 10, DX: 9, DW: 6, BOTH: 7}, False)])  # PyTorch's dW  # fmt: skip
def test_calls_settled_on_the_packages_kernels_skip_pytorchs_way(times, settled, backward_mode, monkeypatch):
    """Once ``"auto"`` has chosen the package's kernel for every GEMM, later calls run them without
    making PyTorch's way (``ours_throughout``); where it chose PyTorch's for one, they make it."""
    from tvm_convgrad.torch import ops

    layer, x, g = _layer_and_tensors(channels=32)
    monkeypatch.setattr(backward_module, "_timings", _timed_as(times, []))
    made = []
    monkeypatch.setattr(ops, "pytorch_gradients", lambda *args: made.append(1) or backward_module.pytorch_gradients(*args))
    backward_mode("auto")
    first = _grads(layer, x, g)
    assert made == [1]  # the first call chooses, with PyTorch's way at hand
    call = next(iter(backward_choices()))[0]
    assert backward_module.ours_throughout(call, (True, True)) is settled
    again = _grads(layer, x, g)
    assert made == [1] if settled else [1, 1]
    for mine, before in zip(again, first):
        assert torch.equal(mine, before)
    backward_mode("ours")
    assert backward_module.ours_throughout(call, (True, True)) and backward_module.ours_throughout(call, (False, True))
    backward_mode("pytorch")
    assert not backward_module.ours_throughout(call, (True, True))


def test_pytorch_mode_builds_no_kernel_and_matches_stock(backward_mode):
    backward_mode("pytorch")
    input_grad_kernel.cache_clear(), weight_grad_kernel.cache_clear()
    layer, x, g = _layer_and_tensors(channels=24, size=6)
    theirs = _grads(layer, x, g)
    assert input_grad_kernel.cache_info().currsize == weight_grad_kernel.cache_info().currsize == 0
    assert backward_choices() == {}
    for a, b in zip(theirs, _stock(layer, x, g)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_calls_pytorch_cannot_take_run_the_package_in_every_mode(backward_mode):
    """An even kernel's ``padding="same"`` pads one side more than the other; float64 runs the
    package's float32 sums (gradcheck's contract): the package's kernels, whatever the mode."""
    backward_mode("pytorch")
    input_grad_kernel.cache_clear(), weight_grad_kernel.cache_clear()
    torch.manual_seed(4)
    layer = Conv2d(16, 16, 2, padding="same", bias=False)
    x = torch.rand(1, 16, 7, 7, requires_grad=True)
    layer(x).sum().backward()
    assert input_grad_kernel.cache_info().currsize == weight_grad_kernel.cache_info().currsize == 1
    wide = Conv2d(16, 16, 3, padding=1, bias=False).double()
    y = torch.rand(1, 16, 5, 5, dtype=torch.float64, requires_grad=True)
    wide(y).sum().backward()
    assert input_grad_kernel.cache_info().currsize == 2 and y.grad.dtype == torch.float64


def test_a_stem_chooses_only_its_weight_gradient(backward_mode):
    backward_mode("auto")
    layer, x, g = _layer_and_tensors()
    _grads(layer, x.detach(), g)  # an input that needs no gradient, as an RGB stem's
    assert [gemm for _, gemm in backward_choices()] == ["dw"]


def test_modes_are_checked_by_name(backward_mode):
    with pytest.raises(ConvGradError, match="mode = 'fast'"):
        set_backward("fast")
    assert get_backward() in backward_module.MODES


def test_the_environment_variable_sets_the_mode_at_import():
    code = "import tvm_convgrad.torch as t; print(t.get_backward())"
    run = lambda value: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,  # noqa: E731
                                       env={**os.environ, "TVM_CONVGRAD_BACKWARD": value})  # fmt: skip
    chosen = run("pytorch")
    assert chosen.returncode == 0 and chosen.stdout.strip().endswith("pytorch"), chosen.stderr[-3000:]
    wrong = run("fastest")
    assert wrong.returncode != 0 and "TVM_CONVGRAD_BACKWARD" in wrong.stderr and "'fastest'" in wrong.stderr, wrong.stderr[-3000:]


def test_pytorchs_two_gemms_run_in_one_call(backward_mode):
    backward_mode("pytorch")
    layer, x, g = _layer_and_tensors()
    _grads(layer, x, g)  # warm
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _grads(layer, x, g)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls.get("aten::convolution_backward") == 1 and "tvm_convgrad::conv2d_input_grad" not in calls, calls


@pytest.fixture
def both_modes():
    """Sets the forward and backward modes for the test; restores the run's after it."""
    from tvm_convgrad.torch import set_forward

    def set_modes(forward: str, backward: str):
        set_forward(forward)
        set_backward(backward)

    yield set_modes
    set_modes(os.environ.get("TVM_CONVGRAD_FORWARD", "auto"), os.environ.get("TVM_CONVGRAD_BACKWARD", "auto"))


def _node(y) -> str:
    return type(y.grad_fn).__name__


def test_a_call_pytorch_runs_throughout_is_f_conv2d_itself(both_modes):
    """Forward and both GEMMs PyTorch's: the call is ``F.conv2d``'s own (its autograd node in C++),
    its gradients and output stock's; any GEMM the package's keeps the drop-in's ``autograd.Function``."""
    layer, x, g = _layer_and_tensors()
    both_modes("pytorch", "pytorch")
    y = layer(x)
    assert _node(y) == "ConvolutionBackward0"
    y.backward(g)
    for a, b in zip((x.grad, layer.weight.grad), _stock(layer, x, g)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    both_modes("pytorch", "ours")
    assert _node(layer(x)) in DROP_IN_NODES
    both_modes("ours", "pytorch")
    assert _node(layer(x)) in DROP_IN_NODES


def test_auto_runs_f_conv2d_once_it_has_chosen_pytorchs_everywhere(both_modes, monkeypatch):
    from tvm_convgrad.torch import forward as forward_module

    both_modes("auto", "auto")
    monkeypatch.setattr(forward_module, "wins", lambda candidate, incumbent: False)  # PyTorch's forward
    # PyTorch's two the fastest
    monkeypatch.setattr(backward_module, "_timings", lambda runs, *_: {way: 10.0 - len(way) for way in runs})
    layer, x, g = _layer_and_tensors()
    first = layer(x)
    assert _node(first) == "Conv2dFunctionBackward"  # its signature's first call: the choices are made here
    first.backward(g)
    assert set(backward_choices().values()) == {False}
    assert _node(layer(x)) == "ConvolutionBackward0"
    assert _node(layer(x.detach())) == "Conv2dFunctionBackward"  # no dX needed: a signature and GEMM not chosen yet


def test_calls_pytorchs_backward_cannot_take_keep_the_function(both_modes):
    """Where PyTorch's backward cannot take the call as the package does (uneven padding, float64),
    the drop-in's ``autograd.Function`` runs it in every mode."""
    both_modes("pytorch", "pytorch")
    torch.manual_seed(4)
    even = Conv2d(16, 16, 2, padding="same", bias=False)
    assert _node(even(torch.rand(1, 16, 7, 7, requires_grad=True))) == "Conv2dFunctionBackward"
    wide = Conv2d(16, 16, 3, padding=1, bias=False).double()
    assert _node(wide(torch.rand(1, 16, 5, 5, dtype=torch.float64, requires_grad=True))) == "Conv2dFunctionBackward"


@pytest.mark.parametrize("forward, given_up", [("pytorch", BOTH), ("ours", DX)])
def test_auto_credits_pytorchs_both_gemms_where_the_call_would_be_f_conv2d(forward, given_up, both_modes, monkeypatch):
    """PyTorch's dX with the package's dW timed fastest, PyTorch's both within
    ``backward.FUNCTION_MS`` of it: with PyTorch's forward the call would then run as ``F.conv2d``
    itself, so PyTorch's both are chosen; with the package's forward the call stays the drop-in's
    ``autograd.Function`` either way, and the timings decide."""
    from tvm_convgrad.torch import forward as forward_module

    both_modes("auto", "auto")
    monkeypatch.setattr(forward_module, "wins", lambda candidate, incumbent: forward == "ours")
    credit = backward_module.FUNCTION_MS
    times = {NONE: 10.0, DX: 5.0, DW: 9.0, BOTH: 5.0 + credit / 2}
    monkeypatch.setattr(backward_module, "_timings", lambda runs, *_: {way: times[way] for way in runs})
    layer, x, g = _layer_and_tensors()
    layer(x).backward(g)
    assert {gemm for (_, gemm), package in backward_choices().items() if not package} == given_up
    assert _node(layer(x)) == ("ConvolutionBackward0" if given_up == BOTH else "Conv2dFunctionBackward")


def test_deterministic_algorithms_make_auto_untimed(both_modes, monkeypatch):
    """Under ``torch.use_deterministic_algorithms(True)`` ``"auto"`` times nothing: a timed choice
    could differ between two runs of a program, and with it the bits. The forward is ``F.conv2d``'s
    and the gradients the package's kernels, bit for bit what ``"pytorch"`` / ``"ours"`` give,
    whatever a timing would say (here: the package's forward, PyTorch's two GEMMs); the timed
    choices are made once it is off."""
    from tvm_convgrad.torch import forward as forward_module
    from tvm_convgrad.torch import forward_choices

    layer, x, g = _layer_and_tensors()
    both_modes("auto", "auto")  # (no choice made yet)
    monkeypatch.setattr(forward_module, "wins", lambda candidate, incumbent: True)
    monkeypatch.setattr(backward_module, "_timings", lambda runs, *_: {way: 10.0 - len(way) for way in runs})
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        y = layer(x)
        assert _node(y) in DROP_IN_NODES
        grads = _grads(layer, x, g)
    finally:
        torch.use_deterministic_algorithms(was)
    assert not backward_choices() and not forward_choices()
    both_modes("pytorch", "ours")
    assert torch.equal(y, layer(x))
    assert all(torch.equal(a, b) for a, b in zip(grads, _grads(layer, x, g)))
    both_modes("auto", "auto")
    _grads(layer, x, g)
    assert set(forward_choices().values()) == {True} and set(backward_choices().values()) == {False}
