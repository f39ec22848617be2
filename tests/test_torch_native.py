"""The drop-in's autograd node in C++ (``tvm_convgrad.torch.native``): taken once a signature's
gradients are settled as the package's, its gradients the Python node's bit for bit (the same
kernels on the same memory) and right against the float64 reference, every order of gradient,
every layout and type, the bias, frozen inputs; the Python node where it must not be taken (the
profiler, cropped taps, a large dX under kept outputs, the mode off) or cannot be built.
(Why: the Python node costs a small step 8-9%; timing is not a test.)"""

from __future__ import annotations

import pytest

from conftest import torch

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")


@pytest.fixture
def native():
    """The C++ node on, built (skipped where this machine cannot build it), every choice ours."""
    from tvm_convgrad.torch import backward, native

    mode, backward_mode = native.get_native(), backward.get_backward()
    native.set_native("on")
    if not native.available():
        pytest.skip(f"the extension cannot be built here: {native.build_error()}")
    backward.set_backward("ours")
    yield native
    native.set_native(mode)
    backward.set_backward(backward_mode)


def _layer(cin=16, cout=32, k=3, stride=1, padding=1, dilation=1, groups=1, bias=True, channels_last=False, dtype="float32"):
    import tvm_convgrad.torch as tct

    torch.manual_seed(0)
    layer = tct.Conv2d(cin, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    return layer.to(getattr(torch, dtype), memory_format=_layout(channels_last))


def _layout(channels_last: bool):
    return torch.channels_last if channels_last else torch.contiguous_format


def _input(channels_last: bool = False) -> "torch.Tensor":
    """A (2, 16, 9, 9) input that needs its gradient, channels-last in memory where asked."""
    return torch.randn(2, 16, 9, 9).to(memory_format=_layout(channels_last)).requires_grad_()


def _gradients(layer, x, g, mode: str):
    """``(output, node name, dX, dW, db)`` of one forward and backward with the node mode ``mode``."""
    from tvm_convgrad.torch import native

    native.set_native(mode)
    x = x.detach().requires_grad_(x.requires_grad)
    layer.zero_grad(set_to_none=True)
    y = layer(x)
    name = type(y.grad_fn).__name__
    y.backward(g)
    bias = None if layer.bias is None else layer.bias.grad
    return y.detach(), name, x.grad, layer.weight.grad, bias


def _reference(layer, x, g):
    """dX, dW, db in float64 by PyTorch's convolution (the independent oracle)."""
    x64 = x.detach().double().requires_grad_(x.requires_grad)
    w64 = layer.weight.detach().double().requires_grad_()
    b64 = None if layer.bias is None else layer.bias.detach().double().requires_grad_()
    y = torch.nn.functional.conv2d(x64, w64, b64, layer.stride, layer.padding, layer.dilation, layer.groups)
    y.backward(g.double())
    return x64.grad, w64.grad, None if b64 is None else b64.grad


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [dict(), dict(k=1, padding=0, bias=False), dict(stride=2), dict(dilation=2, padding=2),
                                   dict(cin=32, groups=32, cout=32)])
def test_the_cpp_node_gives_the_python_nodes_gradients(native, channels_last, dtype, shape):
    """The second call of a signature runs the C++ node; its output and gradients equal the
    Python node's bit for bit, and the float64 reference's within the type's bound."""
    layer = _layer(channels_last=channels_last, dtype=dtype, **shape)
    x = torch.randn(2, layer.in_channels, 9, 9).to(layer.weight.dtype, memory_format=_layout(channels_last)).requires_grad_()
    g = torch.randn_like(layer(x))
    python = _gradients(layer, x, g, "off")
    cpp = _gradients(layer, x, g, "on")
    assert python[1] == "Conv2dFunctionBackward" and cpp[1] == "CppFunction"
    for a, b in zip(python[2:], cpp[2:]):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)
    assert torch.equal(python[0], cpp[0])
    bound = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 5e-3}[dtype]
    for got, want in zip(cpp[2:], _reference(layer, x, g)):
        if want is not None:
            assert (got.double() - want).abs().max() <= bound * (1 + want.abs().max()), dtype


def test_frozen_inputs_and_weights_take_the_cpp_node(native):
    """Only the gradients asked for: an input that does not require grad (the first layer) gets
    none, a frozen weight none, and the bias its sum; no node at all where nothing needs one."""
    layer = _layer()
    x = torch.randn(2, 16, 9, 9)
    g = torch.randn_like(layer(x))
    layer(x).backward(g)  # (the first call: the Python node)
    y, name, dx, dw, db = _gradients(layer, x, g, "on")
    assert name == "CppFunction" and dx is None and dw is not None and torch.allclose(db, g.sum((0, 2, 3)))
    layer.weight.requires_grad_(False)
    y, name, dx, dw, db = _gradients(layer, x.requires_grad_(), g, "on")
    assert name == "CppFunction" and dx is not None and dw is None
    layer.requires_grad_(False)
    with torch.no_grad():
        assert layer(x.detach()).grad_fn is None


def test_a_first_order_backward_runs_no_python(native, monkeypatch):
    """A plain first-order backward of the C++ node calls the kernels from C++, and takes a kept dX
    (``OUTPUTS_FROM`` lowered under it) from the extension's mappings: the Python fallback is not
    called; a backward that records a graph calls it."""
    from tvm_convgrad.torch import outputs

    layer = _layer()
    x = torch.randn(2, 16, 9, 9, requires_grad=True)
    layer(x).sum().backward()
    monkeypatch.setattr(outputs, "OUTPUTS_FROM", 1024)
    native.set_native("on")  # (settled signatures forgotten: the next call registers the kept dX)
    calls = []

    def counted(*args):
        calls.append(args)
        return native._fallback(*args)

    native.module().set_fallback(counted)
    try:
        for _ in range(2):
            x.grad = None
            layer(x).sum().backward()
        assert not calls
        if outputs.get_outputs() == "kept":
            assert outputs.is_kept(x.grad) and native.module().is_kept(x.grad.untyped_storage().data_ptr())
        (gx,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
        assert len(calls) == 1 and gx.requires_grad
    finally:
        native.module().set_fallback(native._fallback)


GUARDED_BACKWARD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from guard_pages import GuardedMemory
import tvm_convgrad.torch as tct
from tvm_convgrad.torch import native
tct.set_backward("ours")
if not native.available():
    print("no extension:", native.build_error()); sys.exit(0)
memory, side = GuardedMemory(), sys.argv[2]

def guarded(shape, channels_last):  # NCHW logical, its memory flush against the guard page
    stored = (shape[0], shape[2], shape[3], shape[1]) if channels_last else shape
    array = memory.array(stored, np.float32, side)
    array[...] = np.random.default_rng(0).standard_normal(stored, dtype=np.float32)
    t = torch.from_numpy(array)
    t = t.permute(0, 3, 1, 2) if channels_last else t
    assert t.data_ptr() % 64 == 0 and t.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return t  # (aligned and dense in its layout: the node reads it in place, no copy)

for channels_last in (False, True):
    layer = tct.Conv2d(16, 32, 3, padding=1, bias=False)
    with torch.no_grad():
        layer.weight.set_(guarded((32, 16, 3, 3), channels_last))
    x = guarded((2, 16, 8, 8), channels_last).requires_grad_()
    y = layer(x)
    assert type(y.grad_fn).__name__ == "CppFunction", type(y.grad_fn)
    y.backward(guarded((2, 32, 8, 8), channels_last))
    print(channels_last, float(x.grad.abs().sum()), float(layer.weight.grad.abs().sum()), flush=True)
"""


@pytest.mark.parametrize("side", ["after", "before"])
def test_the_cpp_node_reads_inside_its_tensors(side):
    """The C++ node's backward reads x, the weight and grad_output where they lie (NCHW and
    channels-last views, no copy): each flush against a page mapped PROT_NONE, so that a read past
    an edge faults (in a child process: the fault fails this test)."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", GUARDED_BACKWARD, str(Path(__file__).parent), side], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "no extension" in done.stdout or done.stdout.count("\n") == 2, done.stdout


def test_double_backward_through_the_cpp_node(native):
    """create_graph=True: the C++ node's backward records a graph through the package's operators
    (the Python fallback), so gradients of gradients match PyTorch's in float64."""
    layer = _layer(bias=False)
    x = torch.randn(2, 16, 7, 7, requires_grad=True)
    layer(x).sum().backward()  # (settles the signature)
    y = layer(x)
    assert type(y.grad_fn).__name__ == "CppFunction"
    (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    (ggw,) = torch.autograd.grad(gx.square().sum(), layer.weight)
    x64, w64 = x.detach().double().requires_grad_(), layer.weight.detach().double().requires_grad_()
    y64 = torch.nn.functional.conv2d(x64, w64, None, 1, 1)
    (gx64,) = torch.autograd.grad(y64.square().sum(), x64, create_graph=True)
    (ggw64,) = torch.autograd.grad(gx64.square().sum(), w64)
    assert torch.allclose(gx.double(), gx64, rtol=1e-4, atol=1e-4) and torch.allclose(ggw.double(), ggw64, rtol=1e-3, atol=1e-3)


def test_the_python_node_where_the_cpp_one_must_not_run(native, monkeypatch):
    """The mode off and cropped taps (a dilation that reads only padding) keep the Python node; a dX
    the kept outputs map takes the C++ node, over a kept mapping, its values the Python node's."""
    from tvm_convgrad.torch import outputs

    layer = _layer()
    x = torch.randn(2, 16, 9, 9, requires_grad=True)
    layer(x).sum().backward()
    native.set_native("off")
    assert type(layer(x).grad_fn).__name__ == "Conv2dFunctionBackward"
    native.set_native("on")
    cropped, small = _layer(dilation=6, padding=6), torch.randn(2, 16, 5, 5, requires_grad=True)  # (only the centre tap reads)
    cropped(small).sum().backward()
    assert type(cropped(small).grad_fn).__name__ == "Conv2dFunctionBackward"
    monkeypatch.setattr(outputs, "OUTPUTS_FROM", 1024)
    if outputs.get_outputs() == "kept":  # a large dX: the C++ node, its dX over a kept mapping as the Python node's
        x.grad = None
        y = layer(x)
        y.sum().backward()
        assert type(y.grad_fn).__name__ == "CppFunction" and outputs.is_kept(x.grad)
        python = _gradients(layer, x, torch.ones_like(y), "off")
        assert python[1] == "Conv2dFunctionBackward" and outputs.is_kept(python[2]) and torch.equal(python[2], x.grad)


def test_a_machine_without_a_compiler_takes_the_python_node(monkeypatch):
    """Where the extension cannot be built, available() is False, build_error() says why, and
    every call takes the Python node, its gradients right."""
    from torch.utils import cpp_extension

    from tvm_convgrad.torch import native

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(native, "_STATE", {"mode": "on", "module": None, "tried": False, "error": None})
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    assert not native.available() and "no C++ compiler" in native.build_error()
    layer = _layer(cin=8, cout=8)
    x = torch.randn(1, 8, 6, 6, requires_grad=True)
    for _ in range(2):
        y = layer(x)
        assert type(y.grad_fn).__name__ == "Conv2dFunctionBackward"
        y.sum().backward()
    assert x.grad is not None


def test_a_wrong_mode_names_the_values_allowed():
    from tvm_convgrad.errors import ConvGradError
    from tvm_convgrad.torch import set_native

    with pytest.raises(ConvGradError, match=r"mode.*'fast'.*\['on', 'off'\]"):
        set_native("fast")


def _settled(layer, x, g, calls: int = 3):
    """``layer`` run forward and backward ``calls`` times on ``x`` (its route settles), grads cleared."""
    for _ in range(calls):
        layer(x).backward(g)
    layer.zero_grad(set_to_none=True)
    x.grad = None


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("way", ["pytorch", "ours", "blas"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_settled_call_skips_the_python_path(native, python_path, monkeypatch, channels_last, way, bias):
    """Once a signature's route is settled, its calls go from ``tvm_convgrad.torch.conv2d``
    straight to the C++ node (``native.fast``) with the forward chosen (``F.conv2d``, the package's
    kernel called by the node itself, PyTorch's BLAS way): the Python path is not entered, and the
    output and gradients equal the Python path's bit for bit."""
    from tvm_convgrad.torch import blas, forward

    blas_calls, ours_calls = [], []
    if way == "blas":  # "auto" choosing the BLAS way over F.conv2d, and it over the package's forward
        monkeypatch.setattr(forward, "wins", lambda candidate, incumbent: getattr(candidate, "func", None) is blas.forward)
        monkeypatch.setattr(blas, "forward", lambda *args, original=blas.forward: blas_calls.append(1) or original(*args))
    monkeypatch.setattr(forward, "ours", lambda *args, original=forward.ours: ours_calls.append(1) or original(*args))
    mode = forward.get_forward()
    forward.set_forward("auto" if way == "blas" else way)
    try:
        k, padding = (1, 0) if way == "blas" else (3, 1)
        layer = _layer(cin=16, cout=32, k=k, padding=padding, bias=bias, channels_last=channels_last)
        x = _input(channels_last)
        g = torch.randn_like(layer(x))
        python = [None if t is None else t.clone() for t in _gradients(layer, x, g, "off") if not isinstance(t, str)]
        native.set_native("on")
        _settled(layer, x, g)
        python_path.clear()
        blas_calls.clear()
        ours_calls.clear()
        y = layer(x)
        assert python_path == [] and type(y.grad_fn).__name__ == "CppFunction"
        assert blas_calls == ([1] if way == "blas" else []) and ours_calls == []
        y.backward(g)
        fast = (y.detach(), x.grad, layer.weight.grad, None if layer.bias is None else layer.bias.grad)
        for a, b in zip(python, fast):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a, b) and a.stride() == b.stride()
        assert python_path == []
    finally:
        forward.set_forward(mode)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_settled_package_forward_keeps_a_large_output(native, python_path, monkeypatch, channels_last):
    """The node's own call of the package's forward takes its output from the kept mappings where
    ``outputs.empty`` would (``OUTPUTS_FROM`` lowered under it), in the input's layout, and gives the
    Python path's output bit for bit."""
    from tvm_convgrad.torch import forward, outputs

    monkeypatch.setattr(outputs, "OUTPUTS_FROM", 1024)
    mode = forward.get_forward()
    forward.set_forward("ours")
    try:
        layer = _layer(channels_last=channels_last)
        x = _input(channels_last)
        g = torch.randn_like(layer(x))
        expected = _gradients(layer, x, g, "off")[0]
        native.set_native("on")
        _settled(layer, x, g)
        python_path.clear()
        y = layer(x)
        assert python_path == [] and type(y.grad_fn).__name__ == "CppFunction"
        assert outputs.is_kept(y) == (outputs.get_outputs() == "kept") and y.is_contiguous(memory_format=_layout(channels_last))
        assert torch.equal(y, expected)
    finally:
        forward.set_forward(mode)


def test_the_fast_path_declines_where_the_route_could_differ(native, python_path):
    """A settled signature's call still takes the Python path where that could route it otherwise:
    no grad, autocast (where it settled without), deterministic algorithms, forward-mode AD, a torch function or
    dispatch mode, a functorch transform, tracing, a subclass, other strides, other gradients
    needed, a string padding; and a changed setting forgets every settled signature."""
    import contextlib

    from torch.autograd import forward_ad
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    import tvm_convgrad.torch as tct

    layer = _layer()
    x = torch.randn(2, 16, 9, 9, requires_grad=True)
    g = torch.randn_like(layer(x))
    _settled(layer, x, g)
    assert native.module().settled_count() >= 1
    python_path.clear()
    layer(x)
    assert python_path == []  # (settled: the fast path)

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Dispatches(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Subclass(torch.Tensor):
        pass

    @contextlib.contextmanager
    def deterministic():
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(False)

    scopes = {"no_grad": torch.no_grad, "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
              "deterministic": deterministic, "forward AD": forward_ad.dual_level,
              "torch function mode": Functions, "dispatch mode": Dispatches}  # fmt: skip
    for name, scope in scopes.items():
        python_path.clear()
        with scope():
            layer(x)
        assert python_path, name
    calls = {
        "functorch": lambda: torch.func.grad(lambda t: layer(t).sum())(x.detach()),
        "tracing": lambda: torch.jit.trace(layer, x, check_trace=False),
        "subclass": lambda: layer(x.detach().as_subclass(Subclass).requires_grad_()),
        "other strides": lambda: layer(x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()),
        "other gradients": lambda: layer(x.detach()),
        "string padding": lambda: tct.conv2d(x, layer.weight, layer.bias, 1, "same"),
    }
    for name, call in calls.items():
        python_path.clear()
        call()
        assert python_path, name
    tct.set_forward(tct.get_forward())
    assert native.module().settled_count() == 0
    python_path.clear()
    layer(x)
    assert python_path


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("bias", [False, True])
def test_autocast_takes_the_cpp_node(native, python_path, channels_last, dtype, bias):
    """Under ``torch.autocast("cpu")`` a float32 layer's calls take the C++ node, settled ones the
    fast path (autocast's casts made in C++): the output, dX and the float32 weight's float32
    gradient (the dW kernel's float32 sums) equal the Python node's bit for bit."""
    layer = _layer(bias=bias, channels_last=channels_last)
    x = _input(channels_last)
    low = getattr(torch, dtype)
    with torch.autocast("cpu", dtype=low):
        g = torch.randn_like(layer(x))

    def run(mode):
        native.set_native(mode)
        for _ in range(1 if mode == "off" else 3):  # (the C++ node's signature settles)
            layer.zero_grad(set_to_none=True)
            x.grad = None
            python_path.clear()
            with torch.autocast("cpu", dtype=low):
                y = layer(x)
            y.backward(g)
        bias_grad = None if layer.bias is None else layer.bias.grad
        return python_path[:], type(y.grad_fn).__name__, y.detach(), x.grad, layer.weight.grad, bias_grad

    python, cpp = run("off"), run("on")
    assert python[0] and python[1] == "Conv2dFunctionBackward" and not cpp[0] and cpp[1] == "CppFunction"
    assert cpp[2].dtype == low and cpp[4].dtype == torch.float32 and cpp[3].dtype == torch.float32
    for a, b in zip(python[2:], cpp[2:]):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a, b) and a.stride() == b.stride()


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_settled_pytorch_throughout_call_is_f_conv2d_from_cpp(native, python_path, channels_last):
    """A signature the modes give to PyTorch throughout settles too: its later calls go from
    ``conv2d`` to ``at::conv2d`` (PyTorch's own node), the Python path not entered, the output and
    gradients ``F.conv2d``'s bit for bit."""
    from tvm_convgrad.torch import backward, forward

    modes = forward.get_forward(), backward.get_backward()
    forward.set_forward("pytorch")
    backward.set_backward("pytorch")
    try:
        layer = _layer(channels_last=channels_last)
        x = _input(channels_last)
        g = torch.randn_like(layer(x))
        _settled(layer, x, g)
        python_path.clear()
        y = layer(x)
        assert python_path == [] and type(y.grad_fn).__name__ == "ConvolutionBackward0"
        y.backward(g)
        x64 = x.detach().requires_grad_()
        w, b = (t.detach().requires_grad_() for t in (layer.weight, layer.bias))
        y_ref = torch.nn.functional.conv2d(x64, w, b, layer.stride, layer.padding, layer.dilation, layer.groups)
        y_ref.backward(g)
        for a, b_ in ((y, y_ref), (x.grad, x64.grad), (layer.weight.grad, w.grad), (layer.bias.grad, b.grad)):
            assert torch.equal(a, b_) and a.stride() == b_.stride()
    finally:
        forward.set_forward(modes[0])
        backward.set_backward(modes[1])


def test_the_profiler_sees_the_cpp_path_as_the_step_benchmark_counts_it(native, python_path):
    """Under PyTorch's profiler a settled call still takes the fast path and the C++ node, and the
    profile has the ranges the step benchmark counts as a convolution's (the forward's
    ``Conv2dFunction``, the node's backward with the two kernels inside): its per-operator tables
    show the path the timed steps run."""
    from tvm_convgrad.training.torch_step import CONV_ENTRIES, conv_ms

    layer = _layer()
    x = torch.randn(2, 16, 9, 9, requires_grad=True)
    g = torch.randn_like(layer(x))
    _settled(layer, x, g)
    python_path.clear()
    with torch.profiler.profile() as prof:
        y = layer(x)
        y.backward(g)
    assert python_path == [] and type(y.grad_fn).__name__ == "CppFunction"
    names = {e.name for e in prof.events()}
    assert {"Conv2dFunction", "tvm_convgrad::conv2d_weight_grad", "tvm_convgrad::conv2d_input_grad"} <= names, names

    def counted_in(event) -> str:
        while event is not None and event.name not in CONV_ENTRIES:
            event = event.cpu_parent
        return "" if event is None else event.name

    kernels = [e for e in prof.events() if e.name.startswith("tvm_convgrad::conv2d_")]
    assert len(kernels) == 2 and all("CppNode<tvm_convgrad::Conv2dNative>" in counted_in(e) for e in kernels)
    assert conv_ms(prof.events()) > 0
