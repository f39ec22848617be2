"""``tvm_convgrad.torch``: ``conv2d`` / ``Conv2d`` whose backward pass runs the package's kernels,
against PyTorch autograd in float64 (the same rounded inputs), over strides, pads (asymmetric
``"same"`` too), dilations, groups and depthwise, bias, NCHW and channels-last, f32 / bf16 / f16;
``gradcheck``; ``torch.compile`` keeping the operators in its graph; the errors."""

from __future__ import annotations

import copy
import warnings

import numpy as np

import pytest

from conftest import DROP_IN_NODES, slow, tiered, torch
from framework_cases import PAIR_PRODUCT_ERROR, winograd_dw_magnitudes, winograd_magnitudes

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")

if torch is not None:
    from tvm_convgrad import ConvGradError
    from tvm_convgrad.torch import Conv2d, conv2d, conv2d_input_grad, conv2d_weight_grad, conv_call, convert_conv2d, forward_choices, input_grad_kernel, pads_of, set_forward, weight_grad_kernel
    from tvm_convgrad.torch import forward as forward_module
    from tvm_convgrad.torch.kernels import call_plan, forward_kernel
    from tvm_convgrad.tools.verify import error_bound

#        (N, C, H, W),    O,  kernel, stride, padding, dilation, groups, bias
LAYERS = [
    ((2, 16, 9, 9), 32, 3, 1, 1, 1, 1, True),
    ((2, 16, 9, 11), 24, 3, 2, 1, 1, 1, False),
    ((1, 20, 8, 8), 40, (3, 1), (2, 1), (0, 2), (1, 2), 4, True),
    ((2, 24, 7, 7), 24, 3, 1, "same", 2, 24, False),  # depthwise, dilated
    ((2, 8, 6, 6), 12, 4, 1, "same", 1, 2, True),  # even kernel: 'same' pads 1 before, 2 after
    ((1, 3, 15, 15), 16, 7, 2, 3, 1, 1, False),  # a stem
    ((2, 64, 5, 5), 32, 1, 1, "valid", 1, 1, True),
    ((2, 16, 6, 6), 16, 3, 1, 7, 7, 1, False),  # an atrous rate past the map: only the centre tap is live
    ((1, 8, 5, 9), 8, 3, 1, (5, 4), (5, 4), 2, True),  # live taps cropped in rows, not in columns
    ((2, 64, 12, 12), 64, 3, 1, 1, 1, 1, True),  # float32: the forward and dX by Winograd's F(2x2, 3x3) (72 tiles)
]


def _close(ours: "torch.Tensor", reference: "torch.Tensor", kernel, what: str, pair_sums=None):
    """``ours`` within the bound of ``kernel``'s sums (F(2x2, 3x3) on bf16 pairs: plus PAIR_PRODUCT_ERROR of
    ``pair_sums()``, its products' magnitudes, ``framework_cases.pair_winograd_bound``)."""
    ref = reference.detach().double().numpy()
    error = np.abs(ours.detach().double().numpy() - ref)
    bound = error_bound(kernel.params, ref, kernel.output.dtype)
    if kernel.formulation == "winograd-bf16":
        bound = bound + PAIR_PRODUCT_ERROR * pair_sums()
    ratio = error / bound
    assert ratio.max() <= 1.0, f"{what}: max error {error.max():.3g} = {ratio.max():.3g} x the bound"


def _call(x, layer, channels_last: bool):
    return conv_call(x.shape, layer.weight.shape, layer.stride, pads_of(layer.padding, layer.kernel_size, layer.stride, layer.dilation),
                     layer.dilation, layer.groups, x.dtype, channels_last)  # fmt: skip


def _plan_key(x, layer):
    """The arguments of :func:`call_plan` for ``layer`` on ``x`` (NCHW)."""
    pads = pads_of(layer.padding, layer.kernel_size, layer.stride, layer.dilation)
    return tuple(x.shape), tuple(layer.weight.shape), tuple(layer.stride), pads, tuple(layer.dilation), layer.groups, x.dtype, False


_GRID = [(layer, dtype, cl) for layer in LAYERS for dtype in ("float32", "bfloat16", "float16") for cl in (False, True)]


@pytest.mark.parametrize("layer, dtype, channels_last", tiered(_GRID, lambda i, c: i % 7 == 0, unpack=True,
                         ids=lambda c: f"layer{LAYERS.index(c[0])}-{c[1]}-{'channels_last' if c[2] else 'nchw'}"))  # fmt: skip
def test_conv2d_gradients_match_pytorch_autograd(layer, dtype, channels_last):
    shape, out, kernel, stride, padding, dilation, groups, bias = layer
    torch.manual_seed(0)
    dtype = getattr(torch, dtype)
    ours = Conv2d(shape[1], out, kernel, stride, padding, dilation, groups, bias).to(dtype)
    reference = torch.nn.Conv2d(shape[1], out, kernel, stride, padding, dilation, groups, bias).double()
    reference.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    assert ours.state_dict().keys() == reference.state_dict().keys()
    x = (torch.rand(shape) * 2 - 1).to(dtype)
    memory = torch.channels_last if channels_last else torch.contiguous_format
    x, ours = x.to(memory_format=memory), ours.to(memory_format=memory)
    x64 = x.double().requires_grad_()
    x.requires_grad_()
    y = ours(x)
    g = (torch.rand(y.shape) * 2 - 1).to(dtype).to(memory_format=memory)
    y.backward(g)
    reference(x64).backward(g.double())
    call = _call(x, ours, channels_last)
    w = ours.weight.detach().double().numpy()[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)  # (a stride-1 dX: dy through it, the pads 2 - p)
    dx_sums = lambda: winograd_magnitudes(g.double().numpy(), w, (2 - padding,) * 4)
    dw_sums = lambda: winograd_dw_magnitudes(x64.detach().numpy(), g.double().numpy(), call.pads)
    _close(x.grad, x64.grad, input_grad_kernel(call), "grad_input", dx_sums)
    _close(ours.weight.grad, reference.weight.grad, weight_grad_kernel(call), "grad_weight", dw_sums)
    assert x.grad.dtype == dtype and x.grad.is_contiguous(memory_format=memory)
    if bias:
        torch.testing.assert_close(ours.bias.grad.double(), reference.bias.grad, rtol=2e-2, atol=1e-1)


def test_gradcheck_in_float64():
    """float64 tensors are computed in float32: the analytical gradients (the package's kernels)
    against float64 finite differences of PyTorch's forward."""
    torch.manual_seed(0)
    x = torch.rand(2, 4, 7, 6, dtype=torch.float64, requires_grad=True)
    w = torch.rand(6, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    b = torch.rand(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, c, d: conv2d(a, c, d, (2, 1), (1, 0), (1, 2), 2), (x, w, b), eps=1e-6, atol=1e-4, rtol=1e-3)
    assert torch.autograd.gradcheck(lambda a, c: conv2d(a, c, None, 1, "same", 1, 1), (x[:, :2].detach().requires_grad_(), w), eps=1e-6,
                                    atol=1e-4, rtol=1e-3)  # fmt: skip


def test_the_backward_pass_runs_the_package_kernels():
    input_grad_kernel.cache_clear()
    weight_grad_kernel.cache_clear()
    call_plan.cache_clear()
    layer = Conv2d(32, 32, 3, padding=1)
    x = torch.rand(1, 32, 5, 5, requires_grad=True)
    layer(x).sum().backward()
    assert input_grad_kernel.cache_info().currsize == 1 and weight_grad_kernel.cache_info().currsize == 1
    layer(x).sum().backward()
    assert call_plan.cache_info().misses == 1  # worked out once per signature (the forward and the backward share it)
    assert input_grad_kernel.cache_info().misses == 1 and weight_grad_kernel.cache_info().misses == 1  # built once
    (plan,) = [call_plan(*_plan_key(x, layer))]
    assert plan.input_grad is input_grad_kernel(_call(x, layer, False))
    assert plan.input_grad.call.op == "ConvolutionBackwardData" and plan.input_grad.formulation == "cube"


def test_only_the_gradients_asked_for_are_computed():
    input_grad_kernel.cache_clear()
    call_plan.cache_clear()
    layer = Conv2d(8, 8, 3, padding=1)
    layer(torch.rand(1, 8, 5, 5)).sum().backward()  # the input needs no gradient
    assert input_grad_kernel.cache_info().currsize == 0 and layer.weight.grad is not None


def test_torch_compile_keeps_the_operators_in_its_graph():
    import torch._dynamo

    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(node.target) for node in gm.graph.nodes})
        return gm.forward

    model = torch.nn.Sequential(Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(), Conv2d(8, 4, 3, stride=2))
    x = torch.rand(2, 4, 9, 9, requires_grad=True)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with warnings.catch_warnings():  # nothing for the user to read (an lru_cache Dynamo skips warned once)
        warnings.simplefilter("error", UserWarning)
        compiled(x).sum().backward()
    assert any("tvm_convgrad.conv2d" in target for graph in graphs for target in graph), graphs
    eager = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    aot = torch.compile(model, backend="aot_eager", fullgraph=True)
    aot(x).sum().backward()
    torch.testing.assert_close(x.grad, eager)


@slow
def test_padding_modes_and_same_pads_follow_pytorch():
    assert pads_of("same", (4, 3), (1, 1), (1, 2)) == (1, 2, 2, 2)
    assert pads_of("valid", (3, 3), (2, 2), (1, 1)) == (0, 0, 0, 0)
    torch.manual_seed(0)
    ours = Conv2d(4, 4, 3, padding=1, padding_mode="reflect").double()
    reference = torch.nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect").double()
    reference.load_state_dict(ours.state_dict())
    x = torch.rand(1, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ours(x).sum().backward()
    reference(x2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "call, param",
    [
        (lambda x, w: conv2d(x, w, stride=0), "stride"),
        (lambda x, w: conv2d(x, w, padding=(1, 2, 3)), "padding"),
        (lambda x, w: conv2d(x, w, padding="full"), "padding"),
        (lambda x, w: conv2d(x, w, stride=2, padding="same"), "padding"),
        (lambda x, w: conv2d(x, w, groups=3), "groups"),
        (lambda x, w: conv2d(x[:, :3], w), "input.shape[1]"),
        (lambda x, w: conv2d(x, w[:, :3], groups=2), "input.shape[1]"),
        (lambda x, w: conv2d(x, w, stride=np.int64(0)), "stride"),
        (lambda x, w: conv2d(x, w, stride=True), "stride"),
        (lambda x, w: conv2d(x, w, dilation=(1, 1.0)), "dilation"),
        (lambda x, w: conv2d(x, w, groups=np.int64(3)), "groups"),
        (lambda x, w: conv2d(x, w, torch.rand(3)), "bias.shape"),
        (lambda x, w: conv2d(x, w, torch.rand(4, 1)), "bias.shape"),
        (lambda x, w: conv2d(x[None], w), "input.dim()"),
        (lambda x, w: conv2d(x, w[0]), "weight.dim()"),
        (lambda x, w: conv2d(x, torch.rand(4, 4, 7, 7)), "input.shape"),  # no output: the kernel outgrows the input
        (lambda x, w: conv2d(x, w, padding=(1, 0), dilation=3), "input.shape"),
        # the gradient operators called directly: dy (1, 4, 4, 4) of x (1, 4, 6, 6) through w (4, 4, 3, 3), unpadded
        (lambda x, w: conv2d_input_grad(torch.rand(1, 4, 6, 6), w, [1, 4, 6, 6], [1, 1], [0] * 4, [1, 1], 1, False), "grad_output.shape"),
        (lambda x, w: conv2d_weight_grad(torch.rand(1, 4, 5, 4), x, [4, 4, 3, 3], [1, 1], [0] * 4, [1, 1], 1, False), "grad_output.shape"),
        (lambda x, w: conv2d_weight_grad(torch.rand(1, 4, 4, 4), x, [4, 4, 3, 3], [0, 1], [0] * 4, [1, 1], 1, False), "stride"),
        (lambda x, w: conv2d_input_grad(torch.rand(1, 4, 4, 4), w, [1, 4, 6, 6], [1, 1], [0] * 3, [1, 1], 1, False), "pads"),
        (lambda x, w: conv2d_input_grad(torch.rand(1, 4, 4, 4), w, [1, 4, 6, 6], [1, 1], [0] * 4, [1, 1], 3, False), "groups"),
        (lambda x, w: conv2d_weight_grad(torch.rand(1, 4, 4, 4), x[:, :3], [4, 4, 3, 3], [1, 1], [0] * 4, [1, 1], 1, False), "input channels"),
        (lambda x, w: conv2d_input_grad(torch.rand(1, 4, 1, 1), torch.rand(4, 4, 7, 7), [1, 4, 6, 6], [1, 1], [0] * 4, [1, 1], 1, False),
         "input shape"),
    ],
)
def test_bad_arguments_are_conv_grad_errors(call, param):
    x, w = torch.rand(1, 4, 6, 6), torch.rand(4, 4, 3, 3)
    with pytest.raises(ConvGradError) as err:
        call(x, w)
    assert err.value.param == param


def test_numpy_integers_and_one_value_sequences_are_taken_as_f_conv2d_takes_them():
    """Arguments worked out with numpy (``np.int64``) are integers to ``F.conv2d`` (``__index__``),
    and a sequence of one value is that value for both axes."""
    x, w = torch.rand(2, 4, 9, 7), torch.rand(6, 2, 3, 3)
    args = dict(stride=np.int64(2), padding=(np.int32(1), 0), dilation=(1, np.int64(2)), groups=np.int64(2))
    torch.testing.assert_close(conv2d(x, w, **args), torch.nn.functional.conv2d(x, w, **args))
    args = dict(stride=(2,), padding=[1], dilation=[np.int64(2)])  # one value for both axes
    torch.testing.assert_close(conv2d(x[:, :2], w, **args), torch.nn.functional.conv2d(x[:, :2], w, **args))


def test_a_wrong_rank_names_both_ranks():
    with pytest.raises(ConvGradError, match=r"input.dim\(\) = 2, weight.dim\(\) = 4"):
        conv2d(torch.rand(6, 6), torch.rand(4, 4, 3, 3))


def test_unbatched_input_is_one_image():
    torch.manual_seed(0)
    layer = Conv2d(4, 6, 3, stride=2, padding=1)
    x = torch.rand(4, 9, 7, requires_grad=True)
    y = layer(x)
    assert y.shape == torch.nn.functional.conv2d(x, layer.weight, layer.bias, 2, 1).shape == (6, 5, 4)
    y.backward(torch.ones_like(y))
    batched = x.detach()[None].requires_grad_()
    layer.weight.grad, weight_grad = None, layer.weight.grad.clone()
    layer(batched).sum().backward()
    torch.testing.assert_close(x.grad, batched.grad[0])
    torch.testing.assert_close(weight_grad, layer.weight.grad)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_an_empty_batch_gives_what_nn_conv2d_gives(channels_last):
    """``N = 0`` (a detection head with no boxes, a rank's empty shard): an empty result, an empty dX,
    dW and the bias's gradient zeros, as ``nn.Conv2d``'s, at every order (``padding="same"`` with an
    even kernel: the pads uneven)."""
    torch.manual_seed(0)
    ours, stock = Conv2d(4, 6, 4, padding="same", dilation=2), torch.nn.Conv2d(4, 6, 4, padding="same", dilation=2)
    stock.load_state_dict(ours.state_dict())
    x = torch.rand(0, 4, 9, 7).to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    results = []
    for layer in (ours, stock):
        xi = x.clone().requires_grad_()
        y = layer(xi)
        dx, dw = torch.autograd.grad(y.square().sum() + layer.bias.sum(), (xi, layer.weight), create_graph=True)
        (ddw,) = torch.autograd.grad(dw.sum() + dx.sum(), layer.weight, allow_unused=True, materialize_grads=True)
        results.append((y, dx, dw, ddw))
    for got, want in zip(*results):
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got, want)
    assert results[0][0].shape == (0, 6, 9, 7) and not results[0][2].any()


def test_meta_tensors_give_what_nn_conv2d_gives():
    """A module on the ``"meta"`` device (a model's shapes worked out without memory): its forward
    and backward are PyTorch's, as for any device but the CPU the kernels are built for."""
    ours, stock = Conv2d(4, 6, 3, stride=2, device="meta"), torch.nn.Conv2d(4, 6, 3, stride=2, device="meta")
    grads = []
    for layer in (ours, stock):
        x = torch.empty(2, 4, 9, 7, device="meta", requires_grad=True)
        y = layer(x)
        y.sum().backward()
        grads.append((y.shape, x.grad.shape, layer.weight.grad.shape, layer.bias.grad.device))
    assert grads[0] == grads[1] == ((2, 6, 4, 3), (2, 4, 9, 7), (6, 4, 3, 3), torch.device("meta"))


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_torch_export_records_pytorchs_convolution(strict):
    """An exported program is for other runtimes (ONNX, ExecuTorch, AOTInductor): a drop-in layer
    exports as ``aten``'s convolution, not as the package's operator that only its Python can run."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(Conv2d(4, 6, 3, padding="same"), torch.nn.ReLU(), Conv2d(6, 2, 1, stride=2))
    x = torch.rand(2, 4, 9, 7)
    exported = torch.export.export(model, (x,), strict=strict)
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert not any("tvm_convgrad" in target for target in targets), targets
    assert any("conv" in target for target in targets), targets
    torch.testing.assert_close(exported.module()(x), model(x))


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_the_flop_counter_counts_what_nn_conv2d_counts(channels_last):
    """``FlopCounterMode`` (a model's cost, MFU) sees the drop-in's calls as the package's operators:
    their formulas are PyTorch's, so each module counts what ``nn.Conv2d`` counts, the forward and
    each gradient computed (none for a frozen weight), grouped, strided and dilated layers too."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    stock = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1, groups=2), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, bias=False), torch.nn.Conv2d(8, 6, 1))  # fmt: skip
    stock[2].weight.requires_grad_(False)
    ours = convert_conv2d(copy.deepcopy(stock))
    counts, operators = [], []
    for model in (stock, ours):
        x = torch.rand(3, 4, 11, 9).to(memory_format=torch.channels_last if channels_last else torch.contiguous_format).requires_grad_()
        counter = FlopCounterMode(display=False)
        with counter:
            model(x).sum().backward()
        counts.append({module: sum(by_operator.values()) for module, by_operator in counter.get_flop_counts().items()})
        operators.append({str(op) for op in counter.get_flop_counts().get("Global", {})})
    assert counts[1] == counts[0] and counts[0]["Global"] > 0
    assert {"tvm_convgrad.conv2d_input_grad", "tvm_convgrad.conv2d_weight_grad"} <= operators[1], operators[1]


def test_fx_symbolic_trace_records_the_drop_in_as_one_call():
    """``torch.fx.symbolic_trace`` (feature extractors, FX passes) records a drop-in layer as one call
    of :func:`conv2d`, as a ``nn.Conv2d`` subclass records ``F.conv2d``, not the argument checks a
    trace's proxies cannot pass: the traced module runs the drop-in, results and gradients bit for bit."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(Conv2d(4, 6, 3, padding=1, padding_mode="reflect"), torch.nn.ReLU(), Conv2d(6, 8, 2, padding="same", groups=2),
                                Conv2d(8, 4, 1, stride=2))  # fmt: skip
    traced = torch.fx.symbolic_trace(model)
    assert sum(node.op == "call_function" and node.target is conv2d for node in traced.graph.nodes) == 3
    x, g = torch.rand(2, 4, 9, 7), torch.rand(2, 4, 5, 4)
    results = []
    for module in (model, traced, copy.deepcopy(traced)):
        xi = x.clone().requires_grad_()
        y = module(xi)
        y.backward(g)
        results.append([y, xi.grad, *(p.grad for p in module.parameters())])
        module.zero_grad(set_to_none=True)
    for got in results[1:]:
        assert len(got) == len(results[0]) and all(torch.equal(a, b) for a, b in zip(got, results[0]))


@pytest.mark.parametrize("forward", ["ours", "pytorch"])
@pytest.mark.parametrize(
    "channels, shape, input_cl, weight_cl",
    [(1, (2, 1, 9, 9), True, False), (8, (2, 8, 1, 1), True, False), (8, (2, 8, 9, 9), False, True), (8, (2, 8, 9, 9), True, False)],
    ids=["one-channel-cl", "1x1-planes-cl", "cl-weight-only", "cl"],
)
def test_results_take_the_layout_f_conv2d_gives(channels, shape, input_cl, weight_cl, forward):
    """The result and dX lie as ``nn.Conv2d``'s do, where the layout is PyTorch's tie-break: a
    one-channel input made channels-last is channels-last (it is dense in both orders), and a
    channels-last weight makes the result channels-last whatever the input's layout."""
    torch.manual_seed(0)
    stock = torch.nn.Conv2d(channels, 8, 3 if shape[2] > 1 else 1)
    ours = Conv2d(channels, 8, stock.kernel_size)
    ours.load_state_dict(stock.state_dict())
    for layer in (stock, ours):
        layer.to(memory_format=torch.channels_last if weight_cl else torch.contiguous_format)
    x = torch.rand(shape).to(memory_format=torch.channels_last if input_cl else torch.contiguous_format)
    set_forward(forward)
    try:
        results = []
        for layer in (stock, ours):
            xi = x.clone().requires_grad_()
            y = layer(xi)
            y.backward(torch.ones_like(y))
            results.append((y, xi.grad))
    finally:
        set_forward("auto")
    for got, want in zip(results[1], results[0]):
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want)


def test_double_backward_runs_the_package_operators():
    """``create_graph=True``: the gradients of the gradient operators are the three operators
    again (gradgradcheck, float64 run in float32: finite differences of a bilinear function, exact
    at any step, so a coarse step keeps float32's rounding out of them)."""
    torch.manual_seed(0)
    x = torch.rand(2, 4, 7, 6, dtype=torch.float64, requires_grad=True)
    w = torch.rand(6, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a, c: conv2d(a, c, None, (2, 1), (1, 0), (1, 2), 2), (x, w), eps=1e-3, atol=1e-3, rtol=1e-3)
    y = conv2d(x.float(), w.float(), None, 1, 1, 1, 2)
    (dx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    assert dx.grad_fn is not None
    penalty = dx.square().sum()  # a gradient penalty, as WGAN-GP trains with
    penalty.backward()
    assert w.grad is not None and torch.isfinite(w.grad).all()


def test_torch_func_transforms_take_the_drop_in():
    """``torch.func`` (per-sample gradients, Jacobians, ``vmap``) over the drop-in: PyTorch's
    convolution under the transforms, so the results are ``F.conv2d``'s exactly; outside them the
    same model trains on the package's kernels."""
    torch.manual_seed(0)
    stock = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 4, padding="same"))
    ours = convert_conv2d(copy.deepcopy(stock))
    x = torch.rand(5, 3, 6, 6)
    params = {name: p.detach() for name, p in stock.named_parameters()}

    def per_sample(model):
        def loss(p, xi):
            return torch.func.functional_call(model, p, (xi[None],)).square().sum()

        return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)

    expected, got = per_sample(stock), per_sample(ours)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    w = params["0.weight"]
    jacobian = torch.func.jacrev(lambda w: conv2d(x[:1], w, None, 1, 1).sum((2, 3)))(w)
    torch.testing.assert_close(jacobian, torch.func.jacrev(lambda w: torch.nn.functional.conv2d(x[:1], w, None, 1, 1).sum((2, 3)))(w))
    y = ours(x.requires_grad_())
    assert type(y.grad_fn).__name__ in DROP_IN_NODES


class _NegativeGradient(torch.autograd.Function if torch is not None else object):
    """The identity, whose backward hands on its gradient as a negative view of its negation."""

    @staticmethod
    def forward(ctx, y):
        return y.clone()

    @staticmethod
    def backward(ctx, g):
        return torch._neg_view(-g)


def test_negative_views_and_opaque_layouts_are_taken_as_nn_conv2d_takes_them():
    """A negative view (``z.conj().imag``: the sign a bit beside the memory) as the input or as dy
    gives stock's results (the kernels read memory, so the operators' dispatch resolves the bit
    first); oneDNN's opaque ``to_mkldnn()`` input runs PyTorch's convolution, as ``nn.Conv2d``'s
    does; a sparse input gets PyTorch's error."""
    torch.manual_seed(0)
    stock = torch.nn.Conv2d(4, 8, 3, padding=1)
    ours = convert_conv2d(copy.deepcopy(stock))
    z = torch.complex(torch.rand(2, 4, 9, 9), torch.rand(2, 4, 9, 9))
    results = []
    for layer in (stock, ours):
        zi = z.clone().requires_grad_()
        x = zi.conj().imag
        assert x.is_neg()
        y = layer(x)
        _NegativeGradient.apply(y).square().sum().backward()
        with torch.no_grad():
            opaque = layer(z.imag.to_mkldnn())
        results.append((y, zi.grad, layer.weight.grad, opaque.to_dense()))
        assert opaque.layout == torch._mkldnn
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    errors = []
    for layer in (stock, ours):
        with pytest.raises(RuntimeError) as error:
            layer(z.imag.to_sparse())
        errors.append(str(error.value))
    assert errors[1] == errors[0]


def test_batched_gradients_of_the_legacy_vmap_take_the_drop_in():
    """``torch.autograd.grad(..., is_grads_batched=True)`` and ``autograd.functional.jacobian(...,
    vectorize=True)`` run the backward under the legacy ``vmap``, on batched tensors without storage
    that the kernels cannot read: PyTorch's convolutions there, so the results are stock's."""
    torch.manual_seed(0)
    stock = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 6, 3, stride=2, padding=1))
    ours = convert_conv2d(copy.deepcopy(stock))
    x = torch.rand(2, 4, 9, 9)
    v = torch.rand(3, 2, 6, 5, 5)
    results = []
    for model in (stock, ours):
        xi = x.clone().requires_grad_()
        batched = torch.autograd.grad(model(xi), (xi, model[0].weight), v, is_grads_batched=True)
        jacobian = torch.autograd.functional.jacobian(lambda a: model(a).sum((2, 3)), x[:1], vectorize=True)
        results.append((*batched, jacobian))
    assert results[1][0].shape == (3, 2, 4, 9, 9) and results[1][1].shape == (3, 8, 4, 3, 3)
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tangents", ["x", "w", "b", "xwb"])
def test_forward_mode_ad_matches_f_conv2d(tangents):
    """``torch.autograd.forward_ad`` through the drop-in (``Conv2dFunction.jvp``: the bilinear
    tangent): float64 tangents equal to ``F.conv2d``'s to rounding, on layers with groups, strides,
    dilation and the asymmetric pads of an even ``"same"`` kernel; ``gradcheck`` with forward AD."""
    import torch.autograd.forward_ad as fwad

    torch.manual_seed(0)
    for shape, out, kernel, stride, padding, dilation, groups, _ in (LAYERS[2], LAYERS[3], LAYERS[4]):
        x = torch.rand(shape, dtype=torch.float64)
        w = torch.rand(out, shape[1] // groups, *((kernel, kernel) if isinstance(kernel, int) else kernel), dtype=torch.float64)
        b = torch.rand(out, dtype=torch.float64)
        with fwad.dual_level():
            args = [fwad.make_dual(t, torch.rand_like(t)) if name in tangents else t for name, t in zip("xwb", (x, w, b))]
            ours = fwad.unpack_dual(conv2d(*args, stride, padding, dilation, groups)).tangent
            reference = fwad.unpack_dual(torch.nn.functional.conv2d(*args, stride, padding, dilation, groups)).tangent
        torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    x, w = torch.rand(1, 4, 5, 5, dtype=torch.float64, requires_grad=True), torch.rand(6, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, c: conv2d(a, c, None, 1, 1, 1, 2), (x, w), check_forward_ad=True, eps=1e-3, atol=1e-3, rtol=1e-3)


def test_torchscript_traces_and_scripts_the_drop_in():
    """``torch.jit.trace`` records PyTorch's convolution for a drop-in call (a traced call's sizes
    are tensors: the kernels' signature could not be built from them), ``torch.jit.script`` compiles
    nn.Conv2d's own call (padding modes included), and both save and load; eager calls still
    train on the package's kernels."""
    import io

    torch.manual_seed(0)
    stock = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, stride=2, padding=1, padding_mode="reflect"), torch.nn.Conv2d(4, 4, 2, padding="same"))  # fmt: skip
    ours = convert_conv2d(copy.deepcopy(stock))
    x = torch.rand(2, 3, 8, 8)
    expected = stock(x)
    with warnings.catch_warnings(record=True) as caught:  # a TracerWarning per size compared, before (5 a call)
        warnings.simplefilter("always")
        traced = torch.jit.trace(ours, x)
    assert not [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    for module in (traced, torch.jit.script(ours)):
        assert torch.equal(module(x), expected)
        saved = io.BytesIO()
        torch.jit.save(module, saved)
        saved.seek(0)
        assert torch.equal(torch.jit.load(saved)(x), expected)
    assert type(ours(x.requires_grad_()).grad_fn).__name__ in DROP_IN_NODES


@pytest.mark.parametrize("path", ["eager", "operator"])
def test_autocast_casts_the_inputs_as_it_casts_f_conv2d(path):
    """Both ways in: the eager path's casts and the operator's AutocastCPU kernel."""
    input_grad_kernel.cache_clear()
    weight_grad_kernel.cache_clear()
    call_plan.cache_clear()
    torch.manual_seed(0)
    layer = Conv2d(16, 16, 3, padding=1)
    if path == "operator":
        layer._conv_forward = lambda x, w, b: torch.ops.tvm_convgrad.conv2d(x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 1)
    x = torch.rand(2, 16, 8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        assert y.dtype == torch.nn.functional.conv2d(x, layer.weight, layer.bias, 1, 1).dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == layer.weight.grad.dtype == torch.float32  # as for F.conv2d
    bf16_call = conv_call(x.shape, layer.weight.shape, (1, 1), (1, 1, 1, 1), (1, 1), 1, torch.bfloat16, False)
    assert weight_grad_kernel.cache_info().currsize == 1
    weight_grad_kernel(*((bf16_call, "float32") if path == "eager" else (bf16_call,)))
    assert weight_grad_kernel.cache_info().hits == 1  # the bf16 call's kernel (eager: its float32 sums for the float32 weight)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert layer(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.float16):
        assert layer(x).dtype == torch.float16


_AUTOCAST_LAYERS = [LAYERS[i] for i in (0, 2, 3, 5, 7, 8)]  # strided / grouped / depthwise dilated / stem / live taps cropped


@pytest.mark.parametrize("layer", _AUTOCAST_LAYERS, ids=lambda c: f"layer{LAYERS.index(c)}")
@pytest.mark.parametrize("dtype, channels_last", [("bfloat16", False), ("bfloat16", True), ("float16", False)])
def test_autocast_weight_gradients_are_the_float32_sums(layer, dtype, channels_last):
    """Under autocast the float32 weight is kept: the call runs on its bf16 / f16 cast, and its
    gradient is the dW kernel's float32 sums as they are (no ``ToCopyBackward0`` after the
    backward, no rounding to bf16): within float32's bound of the float64 reference of the same
    rounded tensors (a rounded gradient is ~2**-8 off), the input's gradient as autocast gives it."""
    shape, out, kernel, stride, padding, dilation, groups, bias = layer
    torch.manual_seed(0)
    narrow = getattr(torch, dtype)
    memory = torch.channels_last if channels_last else torch.contiguous_format
    ours = Conv2d(shape[1], out, kernel, stride, padding, dilation, groups, bias).to(memory_format=memory)
    x = (torch.rand(shape) * 2 - 1).to(memory_format=memory).requires_grad_()
    packed = []
    with torch.autocast("cpu", dtype=narrow), torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y = ours(x)
    assert y.dtype == narrow
    assert [t.dtype for t in packed if t.shape == ours.weight.shape] == [torch.float32, narrow]  # the weight's cast saved as a tensor (hooks see it)
    weight_node = [f for f, _ in y.grad_fn.next_functions if f is not None][1]
    assert type(weight_node).__name__ == "AccumulateGrad"  # the weight itself, not autocast's cast of it
    g = (torch.rand(y.shape) * 2 - 1).to(narrow)
    y.backward(g)
    reference = torch.nn.Conv2d(shape[1], out, kernel, stride, padding, dilation, groups, bias).double()
    reference.load_state_dict({k: v.to(narrow).double() for k, v in ours.state_dict().items()})
    x64 = x.detach().to(narrow).double().requires_grad_()
    reference(x64).backward(g.double())
    assert ours.weight.grad.dtype == x.grad.dtype == torch.float32
    sized = [i for i, n in enumerate(ours.weight.shape) if n > 1]  # (strides of size-1 axes do not count: AccumulateGrad's contract)
    assert [ours.weight.grad.stride(i) for i in sized] == [ours.weight.stride(i) for i in sized]
    call = conv_call(x.shape, ours.weight.shape, ours.stride, pads_of(ours.padding, ours.kernel_size, ours.stride, ours.dilation), ours.dilation,
                     groups, narrow, channels_last, channels_last and ours.weight.shape[1] > 1)  # fmt: skip
    dw_sums = lambda: winograd_dw_magnitudes(x64.detach().numpy(), g.double().numpy(), call.pads)
    _close(ours.weight.grad, reference.weight.grad, weight_grad_kernel(call, "float32"), "grad_weight", dw_sums)
    _close(x.grad.to(narrow), x64.grad, input_grad_kernel(call), "grad_input")


@pytest.mark.parametrize("mode", ["pytorch", "ours"])
def test_autocast_float32_weights_train_in_either_backward_mode_and_order(mode):
    """PyTorch's dW where :func:`set_backward` gives it (bf16, widened by autograd), and gradients
    of gradients under autocast (the weight's cast recorded in the backward): as ``F.conv2d``'s."""
    from tvm_convgrad.torch import get_backward, set_backward

    torch.manual_seed(0)
    x = torch.rand(2, 8, 7, 7, requires_grad=True)
    w = torch.rand(16, 8, 3, 3, requires_grad=True)
    grads = {}
    previous = get_backward()
    set_backward(mode)
    try:
        for name, f in (("stock", torch.nn.functional.conv2d), ("ours", conv2d)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = f(x, w, None, 1, 1)
                (dx,) = torch.autograd.grad(y.float().square().sum(), x, create_graph=True)
            (dx.square().sum() + y.float().sum()).backward()
            grads[name] = (w.grad.clone(), x.grad.clone())
            x.grad = w.grad = None
    finally:
        set_backward(previous)
    for stock, ours in zip(grads["stock"], grads["ours"]):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, stock, rtol=3e-2, atol=3e-2 * stock.abs().max().item())


def test_eager_calls_run_the_kernels_without_the_operators_dispatch():
    """Eager: one autograd.Function whose backward calls the kernels (labelled for the profiler
    as the operators are), the same results as the operator; fake tensors: the operator."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    x = torch.rand(2, 8, 9, 9, requires_grad=True)
    w = torch.rand(16, 4, 3, 3, requires_grad=True)
    g = torch.rand(2, 16, 5, 5)
    y = conv2d(x, w, None, 2, 1, 1, 2)
    assert type(y.grad_fn).__name__ in DROP_IN_NODES
    with torch.profiler.profile() as profile:
        y.backward(g)
    names = {event.name for event in profile.events()}
    assert {"tvm_convgrad::conv2d_input_grad", "tvm_convgrad::conv2d_weight_grad"} <= names, names
    eager = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    torch.ops.tvm_convgrad.conv2d(x, w, None, [2, 2], [1, 1, 1, 1], [1, 1], 2).backward(g)
    assert torch.equal(x.grad, eager[0]) and torch.equal(w.grad, eager[1])
    with FakeTensorMode() as mode:
        fake = conv2d(mode.from_tensor(x), mode.from_tensor(w), None, 2, 1, 1, 2)
    assert fake.shape == (2, 16, 5, 5) and "tvm_convgrad" in str(fake.grad_fn)


@pytest.mark.parametrize("forward", ["ours", "pytorch"])
@pytest.mark.parametrize("padding, dilation", [(1, 1), ((5, 4), (5, 4))])  # (5, 4): live taps cropped in rows (LAYERS' last)
def test_a_channels_last_weight_is_used_and_its_gradient_written_in_place(forward, padding, dilation, forward_mode):
    """A channels-last layer's weight lies OHWI in memory: the kernels read it there (OXI, no
    transposing copy) and write its gradient in the parameter's own layout (no copy in
    ``AccumulateGrad``, which copies a gradient whose strides differ from its parameter's) — the
    forward too where it is the package's; the results equal a contiguous layer's."""
    forward_mode(forward)
    torch.manual_seed(0)
    stock = Conv2d(24, 32, 3, padding=padding, dilation=dilation, bias=False)
    layer = copy.deepcopy(stock).to(memory_format=torch.channels_last)
    x = torch.rand(2, 24, 5, 9)
    results = []
    for model, memory in ((stock, torch.contiguous_format), (layer, torch.channels_last)):
        xi = x.clone(memory_format=memory).requires_grad_()
        with torch.profiler.profile(record_shapes=True) as profile:
            y = model(xi)
            y.backward(torch.ones_like(y))
        results.append((y, xi.grad, model.weight.grad))
    weight_copies = [e for e in profile.events() if e.name == "aten::copy_" and list(e.input_shapes[0]) == [32, 24, 3, 3]]
    assert not weight_copies, f"{len(weight_copies)} copies of the weight"
    assert layer.weight.grad.stride() == layer.weight.stride() != stock.weight.stride()
    for ours, contiguous in zip(results[1], results[0]):
        torch.testing.assert_close(ours, contiguous, rtol=1e-6, atol=1e-5)


def test_a_type_the_kernels_do_not_take_is_pytorchs_convolution():
    """complex64 (``F.conv2d`` takes it; the kernels do not): PyTorch's convolution and gradients.
    The gradient operators called directly name the type they cannot take."""
    torch.manual_seed(0)
    x = torch.rand(1, 4, 6, 6, dtype=torch.complex64, requires_grad=True)
    w = torch.rand(4, 4, 3, 3, dtype=torch.complex64, requires_grad=True)
    y = conv2d(x, w, stride=2, padding=1)
    y.abs().sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y2 = torch.nn.functional.conv2d(x2, w2, stride=2, padding=1)
    y2.abs().sum().backward()
    for got, want in ((y, y2), (x.grad, x2.grad), (w.grad, w2.grad)):
        torch.testing.assert_close(got, want)
    with pytest.raises(ConvGradError, match="input.dtype"):
        conv2d_weight_grad(y.detach(), x.detach(), list(w.shape), [2, 2], [1, 1, 1, 1], [1, 1], 1, False)


def test_empty_images_and_channels_are_pytorchs():
    """No input channels (``F.conv2d``'s result is the bias) and an image of no rows (PyTorch's own
    error, not an allocation of a negative size)."""
    x, w, b = torch.rand(2, 0, 9, 7, requires_grad=True), torch.rand(6, 0, 3, 3, requires_grad=True), torch.rand(6)
    torch.testing.assert_close(conv2d(x, w, b), torch.nn.functional.conv2d(x, w, b))
    conv2d(x, w, b).sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    with pytest.raises(RuntimeError, match="input size"):
        conv2d(torch.rand(2, 4, 0, 9), torch.rand(6, 4, 3, 3))


def test_a_64_channel_3x3_layer_runs_winograd_for_its_three_gemms():
    """``ALGORITHM = "auto"``: a float32 3x3 at stride 1 of 64 channels on 2 x 12 x 12 (72 2x2
    tiles) builds its dX, dW and forward as F(2x2, 3x3) (the dW over NCHW tensors on an AVX2 host
    the cube: ``winograd_pays``' ``planar``); 128 channels keep the cube's dW; a bf16 dX takes
    F(2x2, 3x3) where this host runs bf16 on the exact path, on bf16 pairs where ``vdpbf16ps`` pays, else
    the cube's AMX tiles."""
    from tvm_convgrad.compile import resolve_target
    from tvm_convgrad.frontends.winograd import exact_bf16
    from tvm_convgrad.isa import isa_plan

    plan = isa_plan(resolve_target("llvm"))
    narrow = plan.registers_per_row > 1
    for channels_last in (False, True):
        call = conv_call((2, 64, 12, 12), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, torch.float32, channels_last)
        assert input_grad_kernel(call).formulation == "winograd" and forward_kernel(call, True).formulation == "winograd"
        assert weight_grad_kernel(call).formulation == ("cube" if narrow and not channels_last else "winograd")
    call = conv_call((8, 128, 12, 12), (128, 128, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, torch.float32, False)
    assert weight_grad_kernel(call).formulation == "cube"
    call = conv_call((2, 64, 12, 12), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, torch.bfloat16, False)
    formulation = input_grad_kernel(call).formulation
    if exact_bf16(plan, gradient=True):
        assert formulation == "winograd"
    elif plan.bf16_dot_pays and not plan.amx_bf16:  # (Zen 4: F(2x2, 3x3) on bf16 pairs, 72 tiles a block of weights)
        assert formulation == "winograd-bf16"
    else:
        assert formulation.startswith("cube")


@pytest.fixture
def forward_mode():
    """Restores the forward mode ``"auto"`` (and forgets its choices) after the test."""
    yield set_forward
    set_forward("auto")


@pytest.mark.parametrize("layer, dtype, channels_last", tiered(_GRID, lambda i, c: i % 5 == 0, unpack=True,
                         ids=lambda c: f"layer{LAYERS.index(c[0])}-{c[1]}-{'channels_last' if c[2] else 'nchw'}"))  # fmt: skip
def test_the_package_forward_matches_pytorch_in_float64(layer, dtype, channels_last, forward_mode):
    """``set_forward("ours")``: every layer's output from the package's kernel, within the bound of
    fp32 sums rounded once, against PyTorch's float64 forward on the same rounded inputs; and the
    backward on top of it unchanged."""
    forward_mode("ours")
    shape, out, kernel, stride, padding, dilation, groups, bias = layer
    torch.manual_seed(1)
    dtype = getattr(torch, dtype)
    memory = torch.channels_last if channels_last else torch.contiguous_format
    ours = Conv2d(shape[1], out, kernel, stride, padding, dilation, groups, bias).to(dtype).to(memory_format=memory)
    x = (torch.rand(shape) * 2 - 1).to(dtype).to(memory_format=memory).requires_grad_()
    y = ours(x)
    reference = torch.nn.functional.conv2d(torch.nn.functional.pad(x.double(), _torch_pads(ours)), ours.weight.double(),
                                           None if ours.bias is None else ours.bias.double(), stride, 0, dilation, groups)  # fmt: skip
    call = _call(x, ours, channels_last)
    top, bottom, left, right = pads_of(ours.padding, ours.kernel_size, ours.stride, ours.dilation)
    sums = lambda: winograd_magnitudes(x.detach().double().numpy(), ours.weight.detach().double().numpy(), (top, bottom, left, right))
    _close(y, reference, forward_kernel(call, bias), "output", sums)
    assert y.dtype == dtype and y.is_contiguous(memory_format=memory) and y.shape == reference.shape
    y.sum().backward()
    assert x.grad is not None and ours.weight.grad is not None


def _torch_pads(layer) -> tuple[int, int, int, int]:
    top, bottom, left, right = pads_of(layer.padding, layer.kernel_size, layer.stride, layer.dilation)
    return (left, right, top, bottom)


def test_auto_forward_times_each_signature_once_and_keeps_the_faster(forward_mode, monkeypatch):
    forward_mode("auto")
    layer = Conv2d(16, 32, 3, padding=1)
    x = torch.rand(2, 16, 8, 8)
    layer(x)
    ((call, with_bias), choice), = forward_choices().items()
    assert with_bias and call.x_shape == (2, 16, 8, 8) and isinstance(choice, bool)
    layer(x)
    assert len(forward_choices()) == 1  # timed once per signature
    monkeypatch.setattr(forward_module, "MARGIN", 1e9)  # nothing is that much faster: PyTorch's
    forward_mode("auto")
    layer(x)
    assert list(forward_choices().values()) == [False]
    monkeypatch.setattr(forward_module, "MARGIN", 0.0)  # anything is: the package's
    forward_mode("auto")
    torch.testing.assert_close(layer(x), torch.nn.functional.conv2d(x, layer.weight, layer.bias, padding=1), rtol=1e-5, atol=1e-5)
    assert list(forward_choices().values()) == [True]
    times = iter([1.0] * forward_module.ROUNDS + [3.0] * 2 * forward_module.ROUNDS)  # the package's faster in the first timing only: PyTorch's
    monkeypatch.setattr(forward_module, "elapsed_ms", lambda fn: next(times) if getattr(fn, "func", None) is forward_module.ours else 2.0)
    monkeypatch.setattr(forward_module, "MARGIN", 1.05)
    forward_mode("auto")
    layer(x)
    assert list(forward_choices().values()) == [False]


@pytest.mark.parametrize("kind", ["depthwise", "1x1", "1x1-nchw", "3x3"])
def test_auto_takes_a_written_out_forward_over_memory_untimed(kind, forward_mode, monkeypatch):
    """A channels-last fp32 depthwise or 1x1 layer (a forward written out for it) whose input and
    output reach FROM_MEMORY_BYTES: ``"auto"`` takes the package's forward without timing (nothing
    timed, not even PyTorch's BLAS way); under the limit it times them; an NCHW 1x1 and a dense 3x3
    (no written-out forward) are timed at any size. (An ISA of 16 vector registers has no
    written-out 1x1 forward: timed there too.)"""
    from tvm_convgrad.compile import resolve_target
    from tvm_convgrad.isa import isa_plan
    from tvm_convgrad.torch.kernels import tensors_plan, written_forward

    timed = []
    monkeypatch.setattr(forward_module, "wins", lambda candidate, incumbent: timed.append(candidate) or False)
    groups, kernel = (32, 3) if kind == "depthwise" else (1, 3 if kind == "3x3" else 1)
    layer = Conv2d(32, 32, kernel, padding=kernel // 2, groups=groups)
    memory = torch.contiguous_format if kind == "1x1-nchw" else torch.channels_last
    layer, x = layer.to(memory_format=memory), torch.rand(2, 32, 8, 8).contiguous(memory_format=memory)
    written = written_forward(tensors_plan(x, layer.weight, (1, 1), (kernel // 2,) * 4, (1, 1), groups, kind != "1x1-nchw").call)
    assert written == (kind == "depthwise" or (kind == "1x1" and isa_plan(resolve_target("llvm")).registers >= 32))
    for limit, untimed in ((2 * 32 * 8 * 8 * 4 * 2, written), (2 * 32 * 8 * 8 * 4 * 2 + 1, False)):
        monkeypatch.setattr(forward_module, "FROM_MEMORY_BYTES", limit)
        timed.clear()
        forward_mode("auto")
        y = layer(x)
        assert list(forward_choices().values()) == [untimed] and bool(timed) != untimed, (limit, timed)
        expected = torch.nn.functional.conv2d(x, layer.weight, layer.bias, 1, kernel // 2, 1, groups)
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


def test_float64_and_mixed_types_run_pytorchs_forward(forward_mode):
    forward_mode("ours")
    forward_kernel.cache_clear()
    x, w = torch.rand(1, 4, 6, 6, dtype=torch.float64), torch.rand(4, 4, 3, 3, dtype=torch.float64)
    assert torch.equal(conv2d(x, w, None, 1, 1), torch.nn.functional.conv2d(x, w, None, 1, 1))
    assert forward_kernel.cache_info().currsize == 0


def test_set_forward_takes_three_modes():
    with pytest.raises(ConvGradError, match="mode"):
        set_forward("fast")


@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_tensors_at_an_unaligned_offset_are_copied_for_the_kernels(kernel, channels_last, forward_mode):
    """A view that starts 4 bytes past an aligned address (``x[:, 1:]`` of one image whose planes
    are odd, a slice of a shared parameter) as the input, dy, weight or bias: the kernels assume
    64-byte aligned data (a 1x1 read in place faulted), so such a tensor is copied; stock's results."""
    from tvm_convgrad.torch import get_backward, set_backward

    ALIGNMENT = 64  # (TVM's kAllocAlignment)

    def unaligned(shape, cl=False):
        """A random tensor of ``shape`` (channels-last memory where ``cl``) one element past an aligned start."""
        memory = (shape[0], *shape[2:], shape[1]) if cl else shape
        flat = torch.rand(1 + int(np.prod(memory)))[1:]
        t = flat.view(memory)
        return t.permute(0, 3, 1, 2) if cl else t

    torch.manual_seed(0)
    forward_mode("ours")
    previous = get_backward()
    set_backward("ours")
    try:
        stock = torch.nn.Conv2d(16, 32, kernel, padding=kernel // 2)
        ours = convert_conv2d(copy.deepcopy(stock))
        x, g = unaligned((2, 16, 12, 12), channels_last), unaligned((2, 32, 12, 12), channels_last)
        weight, bias = unaligned((32, 16, kernel, kernel)), torch.rand(33)[1:]
        assert x.data_ptr() % ALIGNMENT and g.data_ptr() % ALIGNMENT and weight.data_ptr() % ALIGNMENT and bias.data_ptr() % ALIGNMENT
        results = []
        for layer in (stock, ours):
            with torch.no_grad():
                layer.weight.set_(weight.clone() if layer is stock else weight)
                layer.bias.set_(bias.clone() if layer is stock else bias)
            xi = x.detach().requires_grad_()
            y = layer(xi)
            y.backward(g)
            results.append((y, xi.grad, layer.weight.grad, layer.bias.grad))
        assert ours.weight.data_ptr() % ALIGNMENT  # (the layer's own parameter still the unaligned view)
        for got, expected in zip(results[1], results[0]):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    finally:
        set_backward(previous)
