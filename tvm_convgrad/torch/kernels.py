"""The package's gradient kernels for one PyTorch ``conv2d`` call, built once per signature.

A call's :class:`~tvm_convgrad.frontends.conv2d.Conv2dGradients` is what a kernel depends on: shapes,
stride, the four pads, dilation, groups, type and the activations' layout (NXC when channels-last).
Its two kernels are the oneDNN-frontend operators on the same compute as every other path of the
package:

* dX: ``ConvolutionBackwardData`` (diff_dst, weights) -> diff_src;
* dW: ``ConvolutionBackwardWeights`` (src, diff_dst) -> diff_weights;
* the forward: ``Convolution`` (src, weights[, bias]) -> dst (where it runs: :mod:`.forward`);

with the activations NCX for contiguous tensors and NXC for channels-last ones, and the weights
OIX for contiguous ones and OXI for channels-last ones, so that a tensor's memory is passed as it
lies (DLPack, no copy: a channels-last ``(N, C, H, W)`` tensor is the contiguous NHWC
``t.permute(0, 2, 3, 1)``, a channels-last ``(O, I, KH, KW)`` weight the contiguous OHWI one) and
a weight gradient comes out in its parameter's layout (no copy in ``AccumulateGrad``: PyTorch
copies a gradient whose strides differ from its parameter's). Transposing a 512 x 512 x 3 x 3
weight costs a copy of 1.5 ms, and 10-20 ms at times inside a training step (Zen 4). Kernels are
built for this CPU (``llvm``, every usable core), cached (:data:`CACHED_CALLS` signatures) and kept
on disk, where a later process loads them instead of compiling them again
(:mod:`tvm_convgrad.compile.stored`; ``TVM_CONVGRAD_KERNEL_CACHE=off`` keeps nothing there).

A call's fixed costs are paid once per signature too: :func:`call_plan` works out its
:class:`CallPlan` (the signature, the taps its dX / dW run on, its kernels once built), which the
autograd node keeps, so a backward call is two kernel calls and two allocations.
"""

from __future__ import annotations

import functools

import torch

from ..compile import Kernel, build, build_func, resolve_target
from ..errors import ConvGradError
from ..frontends.conv2d import Conv2dGradients
from ..isa import isa_plan
from ..schedule.common import target_cores
from ..schedule.cpu.depthwise_backward import DepthwiseBackward, depthwise_backward_func
from ..schedule.cpu.depthwise_forward import depthwise_forward_func
from ..schedule.cpu.pointwise_backward import PointwiseBackward, pointwise_backward_func
from ..schedule.cpu.pointwise_forward import forward_fits, pointwise_forward_func
from ..schedule.cpu.weight_stream import StreamedLayer, streamed_forward_func, streamed_input_grad_func

__all__ = ["ALGORITHM", "ALIGNMENT", "CACHED_CALLS", "CallPlan", "DTYPES", "PLANNED", "Written", "aligned", "as_layout",
           "as_weights", "both_grads_kernel", "call_plan", "check_groups", "check_output", "conv_call",
           "depthwise_forward_kernel", "depthwise_layer", "dtype_name", "empty_weights", "forward_kernel", "gradient_plan",
           "input_grad_kernel", "is_channels_last", "memory_format", "one_pass_layer", "plan_for", "pointwise_forward_kernel",
           "pointwise_layer", "streamed_forward_kernel", "streamed_input_grad_kernel", "streamed_layer", "tensors_plan",
           "weight_grad_kernel", "written_forward"]  # fmt: skip

ALIGNMENT = 64
"""Bytes the kernels take every tensor's data to start on (TVM's ``kAllocAlignment``: their loads
assume it; TVM's ``from_dlpack`` refuses less, a call's DLPack arguments are not checked)."""

CACHED_CALLS = 128
"""Signatures whose kernels stay built (least recently used first out)."""

ALGORITHM = "auto"
"""The algorithm of the forward, dX and dW: Winograd's F(2x2, 3x3) where it applies and pays, else
the cube (:mod:`tvm_convgrad.frontends.winograd`)."""

DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
"""The tensor types the kernels take; float64 tensors are computed in float32 (see :mod:`.ops`)."""
PLANNED = (*DTYPES, torch.float64)
"""The input types a call has a :class:`CallPlan` for (float64: computed in float32)."""


def dtype_name(dtype: torch.dtype, op: str = "tvm_convgrad.torch.conv2d") -> str:
    """The kernel type of ``dtype`` (float64: float32), else a :class:`ConvGradError`."""
    if dtype == torch.float64:
        return "float32"
    if dtype not in DTYPES:
        raise ConvGradError(op, "input.dtype", str(dtype), f"must be one of {[str(d) for d in (*DTYPES, torch.float64)]}")
    return DTYPES[dtype]


def conv_call(input_shape, weight_shape, stride, pads, dilation, groups: int, dtype: torch.dtype, channels_last: bool,
              weights_last: bool = False) -> Conv2dGradients:  # fmt: skip
    """The kernels' signature of one call (float64: float32; channels-last activations as NXC,
    channels-last weights as OXI, else OIX)."""
    return Conv2dGradients(tuple(input_shape), tuple(weight_shape), tuple(stride), tuple(pads), tuple(dilation), int(groups),
                           dtype_name(dtype), "NXC" if channels_last else "NCX", "OXI" if weights_last else "OIX")  # fmt: skip


def memory_format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def is_channels_last(t: torch.Tensor) -> bool:
    """Whether a 4-D tensor lies channels-last: dense in that order, and where it is also dense
    in NCHW order (one channel, or 1 x 1 planes), PyTorch's own tie-break on the strides
    (:func:`_strides_like_channels_last`), so that a result takes the layout ``F.conv2d``'s would."""
    if t.dim() != 4 or not t.is_contiguous(memory_format=torch.channels_last):
        return False
    return not t.is_contiguous() or _strides_like_channels_last(t.shape, t.stride())


def _strides_like_channels_last(sizes, strides) -> bool:
    """c10's ``is_channels_last_strides_2d`` (what ``suggest_memory_format`` reads): the strides
    rise along C, W, H, N, a size-1 dimension's stride counting; ambiguous ties are NCHW. A tensor
    of one channel made channels-last has strides ``(HW, 1, W, 1)``, an NCHW one ``(HW, HW, W, 1)``."""
    if strides[1] == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < low or (d == 0 and low == strides[1]):
            return False
        low = strides[d] * sizes[d] if sizes[d] > 1 else strides[d]
    return True


def aligned(tensor: torch.Tensor, layout: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """``tensor`` contiguous in ``layout``, its data starting on :data:`ALIGNMENT` bytes: itself
    where it is both, else one copy (a view at an offset, ``x[:, 1:]`` of one image: the kernels'
    aligned loads of it would fault)."""
    tensor = tensor.contiguous(memory_format=layout)
    return tensor if tensor.data_ptr() % ALIGNMENT == 0 else tensor.clone(memory_format=layout)


def _in_memory_order(tensor: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A 4-D tensor's dimensions in its memory's order, contiguous and :func:`aligned`: ``(0, 2, 3,
    1)`` of a channels-last one (a view when it is channels-last already, else one copy), as it is
    else. (Results are allocated aligned, by ``torch.empty`` or as whole pages: never copied here.)"""
    if channels_last:
        return aligned(tensor, torch.channels_last).permute(0, 2, 3, 1)
    return aligned(tensor)


def as_weights(weight: torch.Tensor, call: Conv2dGradients) -> torch.Tensor:
    """``weight`` (OIHW logical) as the kernels' layout: OHWI memory for an OXI call (a view when
    the weight is channels-last already, else one copy), OIHW contiguous otherwise."""
    return _in_memory_order(weight, call.weights_format == "OXI")


def empty_weights(shape, dtype: torch.dtype, call: Conv2dGradients, zero: bool = False) -> torch.Tensor:
    """A weight-gradient tensor of OIHW ``shape`` in the call's weight layout (channels-last for OXI)."""
    out = torch.empty(tuple(shape), dtype=dtype, memory_format=memory_format(call.weights_format == "OXI"))
    return out.zero_() if zero else out


def as_layout(tensor: torch.Tensor, call: Conv2dGradients) -> torch.Tensor:
    """``tensor`` (NCHW logical) as the kernels' layout: NHWC memory for a channels-last call (a
    view when the tensor is channels-last already, else one copy), NCHW contiguous otherwise."""
    return _in_memory_order(tensor, call.data_format == "NXC")


@functools.lru_cache(maxsize=CACHED_CALLS)
def input_grad_kernel(call: Conv2dGradients) -> Kernel:
    """dX of ``call``: ``(grad_output, weight) -> grad_input``, in the call's layouts."""
    return build(call.input_grad("torch_conv2d_input_grad", algorithm=ALGORITHM), store=True)


class Written:
    """A kernel whose loops are written out as TIR (:func:`~tvm_convgrad.compile.builder.build_func`),
    as a :class:`CallPlan` holds it beside the rule-built :class:`Kernel`: its compiled ``function``."""

    __slots__ = ("function",)

    def __init__(self, function):
        self.function = function


def streamed_layer(call: Conv2dGradients) -> StreamedLayer | None:
    """``call`` as :mod:`tvm_convgrad.schedule.cpu.weight_stream` takes it (float32, one group,
    a weight-bound layer of more than one tap; this CPU's vectors and cores), or None."""
    if call.dtype != "float32" or call.groups != 1:
        return None
    (n, c, h, w), (o, _, kh, kw) = call.x_shape, call.w_shape
    target = resolve_target("llvm")
    plan = isa_plan(target)
    layouts = (call.data_format == "NXC", call.weights_format == "OXI")
    layer = StreamedLayer(n, c, h, w, o, kh, kw, tuple(call.strides), tuple(call.pads), tuple(call.dilation), *layouts,
                          plan.lanes, plan.registers, target_cores(target))  # fmt: skip
    return layer if layer.fits() else None


@functools.lru_cache(maxsize=CACHED_CALLS)
def streamed_input_grad_kernel(call: Conv2dGradients) -> Written | None:
    """dX of a weight-bound ``call`` (:func:`streamed_layer`) with its weights read where they lie:
    ``(grad_output, weight, grad_input)`` in the call's layouts; None where that kernel does not take it."""
    layer = streamed_layer(call)
    return None if layer is None else Written(build_func(streamed_input_grad_func(layer, "torch_conv2d_streamed_input_grad")))


@functools.lru_cache(maxsize=CACHED_CALLS)
def streamed_forward_kernel(call: Conv2dGradients, bias: bool):
    """The forward of a weight-bound ``call`` (:func:`streamed_layer`) with its weights read where they
    lie: ``(input, weight[, bias], output)`` in the call's layouts; None where that kernel does not take it."""
    layer = streamed_layer(call)
    name = "torch_conv2d_streamed_forward" + ("_bias" if bias else "")
    return None if layer is None else build_func(streamed_forward_func(layer, bias, name))


@functools.lru_cache(maxsize=CACHED_CALLS)
def weight_grad_kernel(call: Conv2dGradients, dw_dtype: str | None = None) -> Kernel:
    """dW of ``call``: ``(input, grad_output) -> grad_weight``, in the call's layouts (``dw_dtype``:
    grad_weight's type, None for the call's; ``"float32"``: a bf16 / f16 call's sums unrounded)."""
    return build(call.weight_grad("torch_conv2d_weight_grad", algorithm=ALGORITHM, dw_dtype=dw_dtype), store=True)


def depthwise_layer(call: Conv2dGradients) -> DepthwiseBackward | None:
    """``call`` as :mod:`tvm_convgrad.schedule.cpu.depthwise_backward` takes it (one channel per
    group, channels-last, float32, for this CPU's lanes and cores), or None where that kernel does not."""
    (n, c, h, w), (o, per_group, kh, kw) = call.x_shape, call.w_shape
    if not (call.dtype == "float32" and call.data_format == "NXC" and call.groups == c == o and per_group == 1):
        return None
    target = resolve_target("llvm")
    layer = DepthwiseBackward(n, c, h, w, kh, kw, call.strides, call.pads, call.dilation, call.weights_format == "OXI",
                              isa_plan(target).lanes, target_cores(target))  # fmt: skip
    return layer if layer.fits() else None


def _pointwise(call: Conv2dGradients) -> PointwiseBackward | None:
    """``call`` as a :class:`PointwiseBackward` layer where it is one (a 1x1 kernel at stride 1
    without padding, one group, channels-last, float32; this CPU's vectors and cores), else None."""
    (n, c, h, w), (o, _, kh, kw) = call.x_shape, call.w_shape
    if not (call.dtype == "float32" and call.data_format == "NXC" and call.groups == 1 and (kh, kw) == (1, 1)
            and tuple(call.strides) == (1, 1) and not any(call.pads)):  # fmt: skip
        return None
    target = resolve_target("llvm")
    plan = isa_plan(target)
    return PointwiseBackward(n, h, w, c, o, call.weights_format == "OXI", plan.lanes, plan.registers, target_cores(target))


def pointwise_layer(call: Conv2dGradients) -> PointwiseBackward | None:
    """``call`` as :mod:`tvm_convgrad.schedule.cpu.pointwise_backward` takes it (:meth:`PointwiseBackward.fits`), else None."""
    layer = _pointwise(call)
    return layer if layer is not None and layer.fits() else None


@functools.lru_cache(maxsize=CACHED_CALLS)
def pointwise_forward_kernel(call: Conv2dGradients, bias: bool):
    """The forward of a 1x1 ``call`` written out (:mod:`tvm_convgrad.schedule.cpu.pointwise_forward`):
    ``(input, weight[, bias], output)`` in the call's layouts; None where that kernel does not take
    the call (the package's forward is then :func:`forward_kernel`'s)."""
    layer = _pointwise(call)
    if layer is None or not forward_fits(layer):
        return None
    return build_func(pointwise_forward_func(layer, bias, "torch_conv2d_pointwise_forward" + ("_bias" if bias else "")))


def written_forward(call: Conv2dGradients) -> bool:
    """Whether the package's forward of ``call`` is written out for it (:func:`pointwise_forward_kernel`,
    :func:`depthwise_forward_kernel`: a channels-last fp32 1x1 or depthwise layer; nothing built)."""
    layer = _pointwise(call)
    return (layer is not None and forward_fits(layer)) or depthwise_layer(call) is not None


@functools.lru_cache(maxsize=CACHED_CALLS)
def depthwise_forward_kernel(call: Conv2dGradients, bias: bool):
    """The forward of a depthwise ``call`` written out (:mod:`tvm_convgrad.schedule.cpu.depthwise_forward`,
    where :func:`depthwise_layer` takes it): ``(input, weight[, bias], output)``; else None."""
    layer, name = depthwise_layer(call), "torch_conv2d_depthwise_forward" + ("_bias" if bias else "")
    return None if layer is None else build_func(depthwise_forward_func(layer, bias, name))


def one_pass_layer(call: Conv2dGradients) -> DepthwiseBackward | PointwiseBackward | None:
    """``call`` as a one-pass kernel of its dX and dW takes it: :func:`depthwise_layer`'s, :func:`pointwise_layer`'s, or None."""
    return depthwise_layer(call) or pointwise_layer(call)


@functools.lru_cache(maxsize=CACHED_CALLS)
def both_grads_kernel(call: Conv2dGradients):
    """dX and dW of ``call`` in one pass over dy (:func:`one_pass_layer`): ``(input, grad_output,
    weight, grad_input, grad_weight)``, in the call's layouts; None where no such kernel applies."""
    layer = one_pass_layer(call)
    if layer is None:
        return None
    if isinstance(layer, DepthwiseBackward):
        return build_func(depthwise_backward_func(layer, "torch_conv2d_depthwise_backward"))
    return build_func(pointwise_backward_func(layer, "torch_conv2d_pointwise_backward"))


@functools.lru_cache(maxsize=CACHED_CALLS)
def forward_kernel(call: Conv2dGradients, bias: bool) -> Kernel:
    """The forward of ``call``: ``(input, weight[, bias]) -> output``, in the call's layouts."""
    return build(call.forward("torch_conv2d_forward", bias, algorithm=ALGORITHM), store=True)


class CallPlan:
    """One signature's backward worked out once: ``call`` (its :class:`Conv2dGradients`), ``live``
    (the call the kernels run: cropped to the taps that read the input, see
    :meth:`Conv2dGradients.cropped`, else ``call``) and ``taps`` (the kernel ``(rows, columns)`` that
    are live, None when all are); its kernels are built on first use and kept. ``native``: its
    registration with the C++ node (:mod:`.native`), None until a call takes it."""

    __slots__ = ("call", "live", "taps", "native", "_input_grad", "_weight_grad", "_weight_grad_f32", "_fuses", "_both")

    def __init__(self, call: Conv2dGradients):
        crop = call.cropped()
        self.call = call
        self.live, self.taps = (call, None) if crop is None else (crop[0], crop[1:])
        self.native = self._input_grad = self._weight_grad = self._weight_grad_f32 = None
        self._fuses = self._both = None

    @property
    def fuses(self) -> bool:
        """Whether a backward needing both gradients runs them in one kernel (:attr:`both`; worked
        out once, without building it)."""
        if self._fuses is None:
            self._fuses = self.taps is None and one_pass_layer(self.call) is not None
        return self._fuses

    @property
    def both(self):
        """dX and dW of the call in one pass (:func:`both_grads_kernel`), built on first use; only
        where :attr:`fuses`."""
        if self._both is None:
            self._both = both_grads_kernel(self.call)
        return self._both

    @property
    def input_grad(self) -> Kernel | Written:
        """dX of ``live``: ``(grad_output, weight[taps]) -> grad_input``; a weight-bound layer's
        streams its weights (:func:`streamed_input_grad_kernel`), any other's is the rule's."""
        if self._input_grad is None:
            self._input_grad = streamed_input_grad_kernel(self.live) or input_grad_kernel(self.live)
        return self._input_grad

    @property
    def weight_grad(self) -> Kernel:
        """dW of ``live``: ``(input, grad_output) -> grad_weight[taps]``."""
        if self._weight_grad is None:
            self._weight_grad = weight_grad_kernel(self.live)
        return self._weight_grad

    @property
    def weight_grad_f32(self) -> Kernel:
        """dW of ``live`` in float32 (a bf16 / f16 call's sums unrounded: autocast's float32
        weights take it as it is): ``(input, grad_output) -> grad_weight[taps]``."""
        if self._weight_grad_f32 is None:
            self._weight_grad_f32 = self.weight_grad if self.live.dtype == "float32" else weight_grad_kernel(self.live, "float32")
        return self._weight_grad_f32


@functools.lru_cache(maxsize=4 * CACHED_CALLS)
def call_plan(input_shape: tuple, weight_shape: tuple, stride: tuple, pads: tuple, dilation: tuple, groups: int, dtype: torch.dtype,
              channels_last: bool, weights_last: bool = False) -> CallPlan:  # fmt: skip
    """The :class:`CallPlan` of a signature (every argument hashable: shapes, tuples, ints), made once."""
    return CallPlan(conv_call(input_shape, weight_shape, stride, pads, dilation, groups, dtype, channels_last, weights_last))


def plan_for(input_shape, weight_shape, stride, pads, dilation, groups: int, dtype: torch.dtype, channels_last: bool,
             weights_last: bool = False) -> CallPlan:  # fmt: skip
    """:func:`call_plan` of a call's arguments as the operators pass them (lists, sizes)."""
    return call_plan(tuple(input_shape), tuple(weight_shape), tuple(stride), tuple(pads), tuple(dilation), int(groups), dtype,
                     bool(channels_last), bool(weights_last))  # fmt: skip


def check_groups(op: str, param: str, channels: int, weight_shape, groups, given=None):
    """A ``ConvGradError`` where ``groups`` (an int, or None where ``given`` is not one) is not >= 1
    dividing the output channels ``weight_shape[0]``, or on ``param`` where the input's ``channels``
    are not ``weight_shape[1] x groups``."""
    outputs, per_group = weight_shape[0], weight_shape[1]
    if groups is None or groups < 1 or outputs % groups:
        raise ConvGradError(op, "groups", groups if given is None else given,
                            f"must be an int >= 1 that divides the output channels weight.shape[0] = {outputs}")  # fmt: skip
    if channels != per_group * groups:
        raise ConvGradError(op, param, channels, f"must be weight.shape[1] x groups = {per_group} x {groups} "
                            f"= {per_group * groups} (the input's channels)")  # fmt: skip


def check_output(op: str, param: str, input_shape, weight_shape, pads, dilation):
    """A ``ConvGradError`` on ``param`` (``input_shape``) where the input, padded by ``pads (top,
    bottom, left, right)``, is smaller than the dilated kernel of ``weight_shape``: the convolution
    would have no output (``F.conv2d``'s rule)."""
    (h, w), (kh, kw), (pt, pb, pl, pr), (dh, dw) = input_shape[2:], weight_shape[2:], pads, dilation
    padded, kernel = (h + pt + pb, w + pl + pr), (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    if padded[0] < kernel[0] or padded[1] < kernel[1]:
        raise ConvGradError(op, param, tuple(input_shape), f"the padded input ({padded[0]} x {padded[1]}) must be at least the "
                            f"dilated kernel ({kernel[0]} x {kernel[1]}): the convolution would have no output")  # fmt: skip


def gradient_plan(op: str, input_shape, weight_shape, grad_output_shape, stride, pads, dilation, groups: int, dtype: torch.dtype,
                  channels_last: bool, weights_last: bool = False) -> CallPlan:  # fmt: skip
    """:func:`plan_for` of a gradient operator's arguments, checked first (a ``ConvGradError`` naming
    the argument): strides and dilations two ints >= 1, ``pads`` four ints >= 0, ``groups`` >= 1
    dividing the output channels, the input's channels ``weight_shape[1] x groups``, an output
    (:func:`check_output`) and ``grad_output_shape`` that output's shape."""
    for name, values, count, low in (("stride", stride, 2, 1), ("dilation", dilation, 2, 1), ("pads", pads, 4, 0)):
        if len(values) != count or any(int(v) < low for v in values):
            axes = "(top, bottom, left, right)" if count == 4 else "(H, W)"
            raise ConvGradError(op, name, list(values), f"must be {count} ints >= {low} {axes}")
    if len(input_shape) != 4 or len(weight_shape) != 4:
        shapes = (tuple(input_shape), tuple(weight_shape))
        raise ConvGradError(op, "input and weight shapes", shapes, "must be 4-D: (N, C, H, W) and (O, C/groups, KH, KW)")
    check_groups(op, "input channels", input_shape[1], weight_shape, groups)
    check_output(op, "input shape", input_shape, weight_shape, pads, dilation)
    plan = plan_for(input_shape, weight_shape, stride, pads, dilation, groups, dtype, channels_last, weights_last)
    if tuple(grad_output_shape) != plan.call.y_shape:
        raise ConvGradError(op, "grad_output.shape", tuple(grad_output_shape), f"must be the output's shape {plan.call.y_shape}")
    return plan


def tensors_plan(input: torch.Tensor, weight: torch.Tensor, stride, pads, dilation, groups: int, channels_last: bool) -> CallPlan:
    """:func:`call_plan` of a call's tensors (``channels_last``: the input's layout, as the caller found
    it): their sizes as they are (a ``torch.Size`` hashes as its tuple), one frame less than
    :func:`plan_for` on the eager path."""
    return call_plan(input.shape, weight.shape, tuple(stride), tuple(pads), tuple(dilation), groups, input.dtype, channels_last, is_channels_last(weight))
