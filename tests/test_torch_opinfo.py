"""PyTorch's own samples of ``nn.functional.conv2d`` (the OpInfo of
``torch.testing._internal.common_methods_invocations.op_db``: batched and unbatched, strides, pads,
``"same"`` / ``"valid"``, dilations, groups, depthwise, with and without bias) through
``tvm_convgrad.torch.conv2d`` in float32, float64, bfloat16 and float16: the forward, the
gradients and the gradients of the gradients (``create_graph=True``) against PyTorch in float64 on
the same rounded tensors; and forward-mode AD of every sample in float64. None is rejected.

The bound of each result is the dtype's: every quantity here is a sum of products of the inputs,
so running the same computation on their absolute values in float64 gives, element by element,
the sum of the magnitudes of its terms, ``|terms|``; a result may be off by one rounding to its
type (two where autograd adds two of them) plus float32 accumulation, ``(2u + 4 K 2**-24) |terms|`` with ``K`` the longest sum (float64
tensors run in float32: ``u = 2**-24``)."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import tiered, torch

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")

if torch is not None:
    import torch.nn.functional as F

    from tvm_convgrad.torch import conv2d

HAS_EXPECTTEST = importlib.util.find_spec("expecttest") is not None
"""PyTorch's OpInfo database imports it (the test extra installs it)."""

DTYPES = ("float32", "float64", "bfloat16", "float16")
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
LONGEST_SUM = 512
"""More terms than any sum of these samples has (the weight gradient's N x Ho x Wo is the longest)."""


def _samples(dtype: str) -> list:
    """The OpInfo's samples. Imported here, not at collection: importing PyTorch's test internals
    freezes ``torch.backends``' global flags for every test after it."""
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == "nn.functional.conv2d")
    return list(op.sample_inputs("cpu", getattr(torch, dtype), requires_grad=True))


def _sample(index: int, dtype: str):
    """``(sample, weight, bias, kwargs)`` of the OpInfo's ``index``-th sample in ``dtype`` (the test
    skipped where PyTorch has fewer)."""
    samples = _samples(dtype)
    if index >= len(samples):
        pytest.skip(f"PyTorch has {len(samples)} samples")
    sample = samples[index]
    return sample, sample.args[0], sample.args[1] if len(sample.args) > 1 else None, dict(sample.kwargs)


def _steps(f, x, w, b, g, v):
    """Forward ``y``; the gradients ``(x, w, b)`` of ``<y, g>``; the gradients ``(x, w, g)`` of
    ``<dx, v_x> + <dw, v_w> + <db, v_b>``: the three orders one ``create_graph`` step reaches."""
    y = f(x, w, b)
    inputs = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(y, inputs, g, create_graph=True)
    total = sum((grad * vi).sum() for grad, vi in zip(grads, v))
    second = torch.autograd.grad(total, [x, w, g], allow_unused=True)
    return [y, *grads, *second]


def _leaves(tensors, dtype, transform=lambda t: t):
    return [None if t is None else transform(t.detach().to(dtype)).requires_grad_() for t in tensors]


@pytest.mark.skipif(not HAS_EXPECTTEST, reason="expecttest is not installed (the test extra has it)")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index", tiered(range(30), lambda i, _: i % 6 == 0))
def test_opinfo_conv2d_samples_forward_backward_and_gradgrad(index, dtype):
    sample, weight, bias, kwargs = _sample(index, dtype)

    def ours(a, c, d):
        return conv2d(a, c, d, **kwargs)

    def pytorch(a, c, d):
        return F.conv2d(a, c, d, **kwargs)

    torch.manual_seed(index)
    x = sample.input
    y_shape = pytorch(x, weight, bias).shape
    typed = getattr(torch, dtype)
    g = (torch.rand(y_shape) * 2 - 1).to(typed).requires_grad_()
    v = [(torch.rand(t.shape) * 2 - 1).to(typed) for t in (x, weight, bias) if t is not None]

    got = _steps(ours, *_leaves((x, weight, bias, g), typed), v)
    exact = _steps(pytorch, *_leaves((x, weight, bias, g), torch.float64), [t.double() for t in v])
    terms = _steps(pytorch, *_leaves((x, weight, bias, g), torch.float64, torch.abs), [t.double().abs() for t in v])
    names = ["y", "dx", "dw", "db", "d2x", "d2w", "d2g"] if bias is not None else ["y", "dx", "dw", "d2x", "d2w", "d2g"]
    scale = 2 * UNIT_ROUNDOFF[dtype] + 4 * LONGEST_SUM * 2.0**-24
    for name, ours_t, exact_t, terms_t in zip(names, got, exact, terms):
        assert (ours_t is None) == (exact_t is None), name
        if ours_t is None:
            continue
        assert ours_t.dtype == typed and ours_t.shape == exact_t.shape, f"{name}: {ours_t.dtype} {tuple(ours_t.shape)}"
        error = (ours_t.detach().double() - exact_t.detach()).abs()
        bound = scale * terms_t.detach() + 1e-30
        assert (error <= bound).all(), f"{name}: max error {error.max():.3g}, {(error / bound).max():.3g} x the bound"


@pytest.mark.skipif(not HAS_EXPECTTEST, reason="expecttest is not installed (the test extra has it)")
@pytest.mark.parametrize("index", tiered(range(30), lambda i, _: i % 6 == 0))
def test_opinfo_conv2d_samples_forward_mode_ad(index):
    """Forward-mode AD (``torch.autograd.forward_ad``) of every sample, all its tensors dual, in
    float64: the drop-in's tangent (``Conv2dFunction.jvp``) equal to ``F.conv2d``'s to rounding."""
    import torch.autograd.forward_ad as fwad

    sample, weight, bias, _ = _sample(index, "float64")
    torch.manual_seed(index)
    tensors = [None if t is None else t.detach() for t in (sample.input, weight, bias)]
    tangents = [None if t is None else torch.rand_like(t) * 2 - 1 for t in tensors]
    results = []
    for f in (conv2d, F.conv2d):
        with fwad.dual_level():
            duals = [None if t is None else fwad.make_dual(t, tt) for t, tt in zip(tensors, tangents)]
            results.append(fwad.unpack_dual(f(*duals, **sample.kwargs)).tangent)
    torch.testing.assert_close(results[0], results[1], rtol=1e-10, atol=1e-10 * results[1].abs().max().item())


@pytest.mark.skipif(not HAS_EXPECTTEST, reason="expecttest is not installed (the test extra has it)")
@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "float16"))
@pytest.mark.parametrize("index", tiered(range(30), lambda i, _: i % 6 == 0))
def test_opinfo_conv2d_samples_settled_calls_equal_the_python_paths(index, dtype, python_path):
    """Each sample run five times, first order, the package's gradients throughout: the fifth call
    goes through the C++ node's fast path wherever the sample's route settles there (a 4-D input,
    int arguments, no cropped taps), without entering the Python path, and gives the second call's
    output and gradients bit for bit (the first call makes the choices)."""
    import tvm_convgrad.torch as tct
    from tvm_convgrad.torch import backward, kernels, native

    sample, weight, bias, kwargs = _sample(index, dtype)
    typed = getattr(torch, dtype)
    torch.manual_seed(index)
    g = (torch.rand(F.conv2d(sample.input, weight, bias, **kwargs).shape) * 2 - 1).to(typed)
    mode = backward.get_backward()
    backward.set_backward("ours")
    try:
        results = []
        for _ in range(5):
            python_path.clear()
            x, w, b = _leaves((sample.input, weight, bias), typed)
            y = conv2d(x, w, b, **kwargs)
            y.backward(g)
            results.append([y.detach(), x.grad, w.grad, None if b is None else b.grad])
    finally:
        backward.set_backward(mode)
    for second, fifth in zip(results[1], results[4]):
        assert (second is None) == (fifth is None)
        if second is not None:
            assert torch.equal(second, fifth) and second.stride() == fifth.stride()
    settles = native.available() and x.dim() == 4 and not any(isinstance(v, str) for v in kwargs.values())
    if settles:
        stride, pads, dilation, groups = tct._arguments(x.shape[1], tuple(w.shape), *(kwargs.get(k, d) for k, d in
                                                        (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))))  # fmt: skip
        settles = kernels.tensors_plan(x, w, stride, pads, dilation, groups, kernels.is_channels_last(x)).taps is None
    assert (python_path == []) == settles, (len(python_path), settles, kwargs, tuple(x.shape))
