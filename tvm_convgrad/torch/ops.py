"""``conv2d`` as PyTorch operators (``torch.library``): the backward by the package (or, per GEMM,
PyTorch's where it is faster for the layer: :mod:`.backward`), the forward by PyTorch or the
package (:mod:`.forward`: where the package's is faster for the layer).

Three custom operators, so that ``torch.compile`` keeps each as one node of its graph:

* ``tvm_convgrad::conv2d(input, weight, bias, stride, pads, dilation, groups)``: the forward
  (``pads`` as ``(top, bottom, left, right)``), its autograd formula the two below (and
  ``grad_output.sum`` for the bias);
* ``tvm_convgrad::conv2d_input_grad`` and ``tvm_convgrad::conv2d_weight_grad``: the package's dX
  and dW kernels (:mod:`.kernels`), called on the tensors' memory through DLPack.

In eager mode (:func:`eager`: no compiler tracing, no dispatch mode, plain tensors) the same
computation runs as one ``torch.autograd.Function`` (:class:`Conv2dFunction`) whose backward calls
the kernels directly (a custom operator's dispatch costs 60-130 us a call, more than a small
layer's kernel), and once a signature's gradients are settled as the package's, as a C++ node
(:mod:`.native`: no call into Python). Gradients of gradients (``create_graph=True``) go through
the operators, whose autograd formulas are the three operators again. An eager call whose forward
and gradients the modes all give to PyTorch (:func:`_pytorchs_throughout`) is ``F.conv2d``'s own.

Types: float32, bfloat16 and float16 run in their type (sums in float32, rounded once; on a
``vdpbf16ps`` CPU a bf16 3x3 forward, dX or dW with enough tiles runs F(2x2, 3x3) on bf16 pairs, its
transformed operands rounded to bf16 too: :mod:`tvm_convgrad.dsl.compute.winograd`, and
:data:`.kernels.ALGORITHM` ``"direct"`` before the first call keeps the cube); float64
tensors (``torch.autograd.gradcheck``) are rounded to float32, run there and widened back.
The kernels take CPU tensors only (they are built for this CPU): a call on another device (``"meta"``,
a GPU) is PyTorch's convolution, as is one of another type or of an empty tensor (:func:`conv2d`); the
gradient operators called directly give meta tensors their shapes and raise a ``ConvGradError`` on
another device or type.
"""

import functools
from typing import Optional

import torch

from ..errors import ConvGradError
from ..frontends.conv2d import Conv2dGradients
from . import blas, native
from .casts import autocast_inputs
from .grads import both_grads, input_grad_of, weight_grad_of
from .backward import FUNCTION_MS, gradients, ours_throughout, pytorch_gradients, weight_bound
from .backward import pytorchs as pytorchs_backward
from .forward import forward as choose_forward
from .forward import pytorch as pytorch_forward
from .forward import pytorchs as pytorchs_forward
from .kernels import DTYPES, PLANNED, CallPlan, conv_call, gradient_plan, is_channels_last, memory_format, tensors_plan

__all__ = ["Conv2dFunction", "conv2d", "conv2d_input_grad", "conv2d_op", "conv2d_weight_grad", "conv_call", "eager", "forward", "input_grad", "weight_grad"]

OP = "tvm_convgrad.torch.conv2d"


def forward(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride, pads, dilation, groups: int) -> torch.Tensor:
    """The convolution with ``pads = (top, bottom, left, right)``: PyTorch's, or the package's
    kernel where :mod:`.forward` chooses it (``"auto"``: where it is faster for the layer)."""
    return choose_forward(input, weight, bias, stride, pads, dilation, groups, is_channels_last(input))


def _on_cpu(*tensors: torch.Tensor):
    for t in tensors:
        if not t.is_cpu:
            raise ConvGradError(OP, "tensor device", str(t.device), "must be cpu (the kernels are built for this CPU)")


def input_grad(grad_output: torch.Tensor, weight: torch.Tensor, input_shape: list[int], stride: list[int], pads: list[int],
               dilation: list[int], groups: int, channels_last: bool) -> torch.Tensor:  # fmt: skip
    """dX ``(N, C, H, W)`` of ``grad_output`` through ``weight`` (the package's dX kernel; taps
    that read only padding left out, see ``Conv2dGradients.cropped``); arguments checked (:func:`.kernels.gradient_plan`)."""
    _on_cpu(grad_output, weight)
    plan = gradient_plan("tvm_convgrad.torch.conv2d_input_grad", input_shape, weight.shape, grad_output.shape, stride, pads,
                         dilation, groups, grad_output.dtype, channels_last, is_channels_last(weight))  # fmt: skip
    return input_grad_of(plan, grad_output, weight)


def weight_grad(grad_output: torch.Tensor, input: torch.Tensor, weight_shape: list[int], stride: list[int], pads: list[int],
                dilation: list[int], groups: int, channels_last: bool) -> torch.Tensor:  # fmt: skip
    """dW ``(O, C/groups, KH, KW)`` of ``grad_output`` and ``input`` (the package's dW kernel;
    0 for taps that read only padding, see ``Conv2dGradients.cropped``); arguments checked (:func:`.kernels.gradient_plan`)."""
    _on_cpu(grad_output, input)
    plan = gradient_plan("tvm_convgrad.torch.conv2d_weight_grad", input.shape, weight_shape, grad_output.shape, stride, pads,
                         dilation, groups, input.dtype, channels_last)  # fmt: skip
    return weight_grad_of(plan, grad_output, input)


conv2d_input_grad = torch.library.custom_op("tvm_convgrad::conv2d_input_grad", mutates_args=())(input_grad)
conv2d_weight_grad = torch.library.custom_op("tvm_convgrad::conv2d_weight_grad", mutates_args=())(weight_grad)


@torch.library.custom_op("tvm_convgrad::conv2d", mutates_args=())
def conv2d_op(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int], pads: list[int],
              dilation: list[int], groups: int) -> torch.Tensor:  # fmt: skip
    """The forward (:func:`forward`); the backward is the package's (see the module docstring)."""
    return forward(input, weight, bias, stride, pads, dilation, groups)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def eager(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether a call on ``tensors`` may skip the operators' dispatch: no compiler tracing, no
    dispatch mode (fake tensors, ``make_fx``), no functorch transform (``torch.func``), plain
    tensors and parameters."""
    return not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active() and _plain(*tensors)


def _plain(*tensors: Optional[torch.Tensor]) -> bool:
    """No dispatch mode on the stack (what ``_get_current_dispatch_mode`` would return) and
    ``tensors`` plain tensors or parameters with storage, not the legacy ``vmap``'s batched tensors
    (``torch.autograd.grad(..., is_grads_batched=True)``, ``autograd.functional.jacobian(...,
    vectorize=True)``), and their values what their memory holds, not a negative view
    (``z.conj().imag``, whose sign is a bit the kernels would not read; the operators' dispatch
    resolves it): :func:`eager`'s test once tracing and transforms are ruled out."""
    if torch._C._len_torch_dispatch_stack():
        return False
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or t.is_neg() or torch._C._functorch.is_legacy_batchedtensor(t)):
            return False
    return True


@conv2d_op.register_fake
def _(input, weight, bias, stride, pads, dilation, groups):
    shape = Conv2dGradients(tuple(input.shape), tuple(weight.shape), tuple(stride), tuple(pads), tuple(dilation), groups, "float32").y_shape
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=memory_format(is_channels_last(input)))


@conv2d_input_grad.register_fake
def _(grad_output, weight, input_shape, stride, pads, dilation, groups, channels_last):
    return torch.empty(tuple(input_shape), dtype=grad_output.dtype, device=grad_output.device, memory_format=memory_format(channels_last))


@conv2d_weight_grad.register_fake
def _(grad_output, input, weight_shape, stride, pads, dilation, groups, channels_last):
    return input.new_empty(tuple(weight_shape))


def _save(ctx, input, weight, bias, stride, pads, dilation, groups: int, channels_last: bool, plan: Optional[CallPlan] = None,
          narrow_weight: Optional[torch.Tensor] = None):  # fmt: skip
    """What the backward reads: the tensors, the call's attributes, its plan (None: looked up
    there) and, for autocast's float32 ``weight``, the ``narrow_weight`` the call ran on (None else)."""
    ctx.save_for_backward(input, weight, *(() if narrow_weight is None else (narrow_weight,)))
    ctx.attrs = (stride, pads, dilation, groups, channels_last)
    ctx.has_bias, ctx.plan = bias is not None, plan


def _setup_context(ctx, inputs, output):
    input, weight, bias, stride, pads, dilation, groups = inputs
    _save(ctx, input, weight, bias, stride, pads, dilation, groups, is_channels_last(input))


def _profiled(function, name: str):
    """``function`` under a profiler label of ``name`` (the backward's, while PyTorch's profiler records)."""

    def labelled(*args):
        with torch.profiler.record_function(name):
            return function(*args)

    return labelled


def _blas_way(call: Conv2dGradients, dy, input, narrow, theirs):
    """``theirs_blas`` of :func:`.backward.gradients` for the call (made only where it is timed or
    runs): a 1x1's BLAS GEMMs, or a weight-bound layer's dW over im2col columns (:mod:`.blas`); None else."""
    if theirs is None:
        return None
    stride, pads, dilation, groups = call.strides, call.pads, call.dilation, call.groups
    if blas.applies(input, narrow, stride, pads, groups):
        return functools.partial(blas.gradients, dy, input, narrow, call.data_format == "NXC")
    if weight_bound(call) and blas.columns_apply(input, narrow, groups):
        return functools.partial(blas.column_gradients, dy, input, narrow, stride, pads, dilation, theirs)
    return None


def _backward(ctx, grad_output):
    input, weight, *weight_cast = ctx.saved_tensors
    stride, pads, dilation, groups, channels_last = ctx.attrs
    wide = bool(weight_cast)  # autocast's float32 weight (its cast saved beside it): its gradient float32
    grad_input = grad_weight = grad_bias = None
    if not torch.is_grad_enabled() and eager(grad_output, input, weight):  # first order, eager: the kernels directly
        _on_cpu(grad_output, input, weight)
        narrow = weight_cast[0] if wide else weight
        plan = ctx.plan or tensors_plan(input, narrow, stride, pads, dilation, groups, channels_last)
        dx, dw, both = (input_grad_of, weight_grad_of, both_grads) if not torch.autograd._profiler_enabled() else \
            (_profiled(input_grad_of, "tvm_convgrad::conv2d_input_grad"),
             _profiled(weight_grad_of, "tvm_convgrad::conv2d_weight_grad"),
             _profiled(both_grads, "tvm_convgrad::conv2d_both_grads"))  # fmt: skip
        dy = grad_output if grad_output.dtype == input.dtype else grad_output.to(input.dtype)
        needs = ctx.needs_input_grad[:2]
        ours_both = functools.partial(both, plan, dy, input, narrow) if all(needs) and not wide and plan.fuses else None
        if ours_throughout(plan.call, needs):  # the package's kernels, settled: no PyTorch way to make
            if ours_both is not None:  # (a depthwise or 1x1 layer's two in one pass over dy)
                grad_input, grad_weight = ours_both()
            else:
                grad_weight = dw(plan, dy, input, wide) if needs[1] else None  # dW first: dX, read next, is left in cache
                grad_input = dx(plan, dy, narrow) if needs[0] else None
        else:
            theirs = pytorch_gradients(dy, input, narrow, stride, pads, dilation, groups)  # where :mod:`.backward` chooses it
            theirs_blas = _blas_way(plan.call, dy, input, narrow, theirs)
            as_f_conv2d = input.dtype == torch.float32 and pytorchs_forward(plan.call, ctx.has_bias)  # PyTorch's forward chosen
            credit = FUNCTION_MS if as_f_conv2d else 0.0
            grad_input, grad_weight = gradients(plan.call, needs, lambda: dx(plan, dy, narrow), lambda: dw(plan, dy, input, wide),
                                                theirs, theirs_blas, credit, ours_both)  # fmt: skip
    else:  # traced, or create_graph=True: the operators, differentiable again
        if wide:  # the float32 weight's cast, recorded this time
            weight = weight.to(input.dtype)
        if ctx.needs_input_grad[0]:
            grad_input = conv2d_input_grad(grad_output, weight, list(input.shape), stride, pads, dilation, groups, channels_last)
        if ctx.needs_input_grad[1]:
            grad_weight = conv2d_weight_grad(grad_output, input, list(weight.shape), stride, pads, dilation, groups, channels_last)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad_output.sum((0, 2, 3))
    return grad_input, grad_weight, grad_bias, None, None, None, None


def _function_backward(ctx, grad_output):
    """:func:`_backward`, with ``None`` for :class:`Conv2dFunction`'s ``wide_weight`` and ``plan``."""
    return (*_backward(ctx, grad_output), None, None)


conv2d_op.register_autograd(_backward, setup_context=_setup_context)


# The gradient operators are linear in each of their two tensors, and their gradients are the
# convolution's three GEMMs again: for dX = input_grad(dy, w) and an incoming gradient g of dX's
# shape, <g, dX> = <conv2d(g, w), dy> = <weight_grad(dy, g), w>; for dW = weight_grad(dy, x) and g
# of dW's shape, <g, dW> = <conv2d(x, g), dy> = <input_grad(dy, g), x>. So every order of
# gradient (``create_graph=True``) runs on the same three operators.


def _save_grad_op_inputs(ctx, inputs, output):
    tensor_a, tensor_b, _, stride, pads, dilation, groups, channels_last = inputs
    ctx.save_for_backward(tensor_a, tensor_b)
    ctx.attrs = (list(stride), list(pads), list(dilation), int(groups), bool(channels_last))


def _input_grad_backward(ctx, grad):
    grad_output, weight = ctx.saved_tensors
    stride, pads, dilation, groups, channels_last = ctx.attrs
    grad = grad.contiguous(memory_format=memory_format(channels_last))  # conv2d_op reads the layout off its input
    d_grad_output = d_weight = None
    if ctx.needs_input_grad[0]:
        d_grad_output = conv2d_op(grad, weight, None, stride, pads, dilation, groups)
    if ctx.needs_input_grad[1]:
        d_weight = conv2d_weight_grad(grad_output, grad, list(weight.shape), stride, pads, dilation, groups, channels_last)
    return d_grad_output, d_weight, None, None, None, None, None, None


def _weight_grad_backward(ctx, grad):
    grad_output, input = ctx.saved_tensors
    stride, pads, dilation, groups, channels_last = ctx.attrs
    d_grad_output = d_input = None
    if ctx.needs_input_grad[0]:
        d_grad_output = conv2d_op(input, grad, None, stride, pads, dilation, groups)
    if ctx.needs_input_grad[1]:
        d_input = conv2d_input_grad(grad_output, grad, list(input.shape), stride, pads, dilation, groups, channels_last)
    return d_grad_output, d_input, None, None, None, None, None, None


conv2d_input_grad.register_autograd(_input_grad_backward, setup_context=_save_grad_op_inputs)
conv2d_weight_grad.register_autograd(_weight_grad_backward, setup_context=_save_grad_op_inputs)


class Conv2dFunction(torch.autograd.Function):
    """``tvm_convgrad::conv2d`` in eager mode without the operators' dispatch: the same forward
    (PyTorch's), context and backward (the kernels called directly, see :func:`_backward`).

    ``wide_weight`` (autocast): ``weight`` is float32 and ``input`` bf16 / f16; the call runs on
    ``weight`` cast to ``input``'s type, and the weight's gradient is the dW kernel's float32
    sums, unrounded: no cast of it back to float32 after the backward, as autocast's own cast
    of the weight would add (``ToCopyBackward0``)."""

    @staticmethod
    def forward(ctx, input, weight, bias, stride, pads, dilation, groups, wide_weight=False, plan=None):
        # the context saved here, not in a ``setup_context``: with one, every ``apply`` binds its
        # arguments through ``inspect.signature`` (~70 us); under functorch transforms :func:`conv2d`
        # runs PyTorch's convolution. The call's plan is looked up once, for the forward's choice
        # and the backward's kernels (``plan``: the caller's, where it has looked it up).
        narrow = weight.to(input.dtype) if wide_weight else weight
        channels_last = is_channels_last(input)
        if plan is None and input.dtype in PLANNED:
            plan = tensors_plan(input, narrow, stride, pads, dilation, groups, channels_last)
        output = choose_forward(input, narrow, bias, stride, pads, dilation, groups, channels_last, plan)
        _save(ctx, input, weight, bias, stride, pads, dilation, groups, channels_last, plan, narrow if wide_weight else None)
        ctx.save_for_forward(input, narrow)
        return output

    backward = staticmethod(_function_backward)

    @staticmethod
    def jvp(ctx, input_t, weight_t, bias_t, *_):
        """Forward-mode AD (``torch.autograd.forward_ad``): the convolution is bilinear, so the
        output's tangent is ``conv(input_t, w) + conv(x, weight_t) + bias_t`` (PyTorch's
        convolutions; a float32 weight's tangent cast as the weight was)."""
        input, weight = ctx.saved_tensors
        stride, pads, dilation, groups, _ = ctx.attrs
        if input_t is None and weight_t is None:  # only the bias moves: conv(x, 0) + bias_t
            weight_t = torch.zeros_like(weight)
        tangent = None if input_t is None else pytorch_forward(input_t, weight, bias_t, stride, pads, dilation, groups)
        if weight_t is not None:
            term = pytorch_forward(input, weight_t.to(weight.dtype), bias_t if tangent is None else None, stride, pads, dilation, groups)
            tangent = term if tangent is None else tangent + term
        return tangent


_apply_function = super(torch.autograd.Function, Conv2dFunction).apply
"""``Conv2dFunction.apply`` less ``Function.apply``'s Python prologue, for eager calls (:func:`eager`:
no functorch transform active, so the prologue only unwraps dead functorch wrappers: done per
tensor by :func:`_apply`). ~10 us a call less inside a network's step."""
_unwrap = torch._C._functorch.unwrap_if_dead


def _apply(input, weight, bias, stride, pads, dilation, groups: int, wide: bool = False, plan: Optional[CallPlan] = None) -> torch.Tensor:
    return _apply_function(_unwrap(input), _unwrap(weight), None if bias is None else _unwrap(bias), stride, pads, dilation, groups, wide, plan)


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int], pads: list[int],
           dilation: list[int], groups: int) -> torch.Tensor:  # fmt: skip
    """The convolution with the package's gradients (arguments checked by the caller):
    :class:`Conv2dFunction` in eager mode, else the ``tvm_convgrad::conv2d`` operator; under a
    ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``, ...) or ``torch.jit.trace``, PyTorch's
    convolution: every transform composes with it (an operator's autograd formula does not: torch
    2.13's ``register_autograd`` asks functorch for a ``setup_context`` it does not define, and the
    kernels take no batched tensors), and a TorchScript graph records it (a traced call's sizes are
    tensors, and the graph could not call the kernels). PyTorch's too, as ``nn.Conv2d`` takes them: an
    empty tensor (a batch of ``N = 0``: nothing to compute, its gradients empty or zeros; an empty
    image: PyTorch's error), a type the kernels do not take (complex, integers), a layout they do not
    read (oneDNN's opaque ``to_mkldnn()`` tensors, which ``F.conv2d`` takes; sparse ones), tensors on another
    device than the CPU the kernels are built for (``"meta"``, a GPU), and a call ``torch.export``
    traces (an exported program is for other runtimes, ONNX, ExecuTorch, AOTInductor: it records
    ``aten``'s convolution, not the package's operator, which only this package's Python can run)."""
    compiling = torch.compiler.is_compiling()
    not_for_the_kernels = (input.numel() == 0 or weight.numel() == 0 or not input.is_cpu or input.dtype not in PLANNED
                           or input.layout != torch.strided or weight.layout != torch.strided or torch.compiler.is_exporting())  # fmt: skip
    if not_for_the_kernels or (not compiling and (torch._C._are_functorch_transforms_active() or torch.jit.is_tracing())):
        return pytorch_forward(input, weight, bias, stride, pads, dilation, groups)
    if compiling or not _plain(input, weight, bias):  # (:func:`eager`'s test, its first two parts done above)
        return conv2d_op(input, weight, bias, list(stride), list(pads), list(dilation), groups)
    if torch.is_autocast_enabled("cpu"):
        input, weight, bias, wide = autocast_inputs(input, weight, bias, keep_f32_weight=True)
        with torch.autocast("cpu", enabled=False):
            return _eager(input, weight, bias, stride, pads, dilation, groups, wide, autocast=True)
    return _eager(input, weight, bias, stride, pads, dilation, groups)


def _eager(input, weight, bias, stride, pads, dilation, groups: int, wide: bool = False, autocast: bool = False) -> torch.Tensor:
    """:func:`conv2d` of plain tensors (autocast's casts made: ``wide``, its float32 weight kept, see
    :class:`Conv2dFunction`): ``F.conv2d``'s own call, the C++ node, or :class:`Conv2dFunction`."""
    plan = tensors_plan(input, weight, stride, pads, dilation, groups, is_channels_last(input))  # (a PLANNED type: see above)
    if _pytorchs_throughout(plan.call, input, weight, bias):
        native.settle_pytorchs(plan, input, weight, bias, autocast)  # (its later calls: at::conv2d from C++)
        return pytorch_forward(input, weight, bias, stride, pads, dilation, groups)
    forward = functools.partial(choose_forward, input, bias=bias, stride=stride, pads=pads, dilation=dilation, groups=groups,
                                channels_last=plan.call.data_format == "NXC", plan=plan)  # fmt: skip  (its weight: the node's)
    output = native.node(plan, input, weight, bias, forward, _backward, wide, autocast)  # (the C++ node, the gradients settled)
    return _apply(input, weight, bias, stride, pads, dilation, groups, wide, plan) if output is None else output


def _pytorchs_throughout(call: Conv2dGradients, input, weight, bias) -> bool:
    """Whether the modes run PyTorch's convolution for an eager call's forward and for each
    gradient its backward will compute (:func:`.forward.pytorchs`, :func:`.backward.pytorchs`; in
    ``"auto"``, once its signature has been timed): the call is then ``F.conv2d``'s own, PyTorch's
    autograd node in C++ with every order of gradient PyTorch's, ~60-90 us less a call than
    :class:`Conv2dFunction` (a Python ``autograd.Function``) running the same convolutions."""
    if input.dtype not in DTYPES or weight.dtype != input.dtype:
        return False
    grad = torch.is_grad_enabled()
    needs = (grad and input.requires_grad, grad and weight.requires_grad)
    return pytorchs_forward(call, bias is not None) and pytorchs_backward(call, needs)


def _autocast_cpu(keyset, input, weight, bias, stride, pads, dilation, groups):
    """``torch.autocast("cpu")`` for the operator: the tensors cast as for ``F.conv2d``, then the
    operator run below autocast."""
    input, weight, bias, _ = autocast_inputs(input, weight, bias)
    with torch.autocast("cpu", enabled=False):
        return conv2d_op(input, weight, bias, stride, pads, dilation, groups)


_AUTOCAST = torch.library.Library("tvm_convgrad", "IMPL")
_AUTOCAST.impl("conv2d", _autocast_cpu, "AutocastCPU", with_keyset=True)
