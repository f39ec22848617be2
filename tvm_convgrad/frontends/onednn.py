"""oneDNN Graph's gradient operators on the package's dW and dX computes.

* :func:`convolution_backprop_filters` (``ConvolutionBackpropFilters-1``) and its later name
  :func:`convolution_backward_weights` (``ConvolutionBackwardWeights``);
* :func:`conv_transpose_backward_weights` (``ConvTransposeBackwardWeights``);
* :func:`convolution_backward_data` (``ConvolutionBackwardData``) and its older name
  :func:`convolution_backprop_data` (``ConvolutionBackpropData``): the input gradient;
* :func:`convolution` (``Convolution``): the forward convolution itself, the step's third GEMM.

Each takes ``te.placeholder`` tensors in the framework layout (``data_format`` NXC ``(N, *X, C)``
or NCX ``(N, C, *X)``, X = 1-3 spatial axes) and returns the weight-gradient ``te.Tensor`` in
``filter_format`` / ``weights_format``, ready for :func:`tvm_convgrad.build`; the kernel takes and
returns numpy arrays in those layouts (``ml_dtypes.bfloat16`` arrays for bf16). Semantics,
attribute defaults, auto_pad formulas and error rules: ``framework_ops/*.md``. Besides oneDNN's
XIO and OIX, the convolution's operators take the package's OXI weights ``(O, *K, I)``
(:data:`~tvm_convgrad.params.framework.WEIGHTS_FORMATS`): PyTorch's channels-last weights and
TVM's OHWI kernels, read and written in place.

How: layout stages (:mod:`.layouts`) around the TBE dW compute (:mod:`tvm_convgrad.dsl.compute`):
x and dy become 5HD (rank 1: H = 1) or NDC1HWC0 (rank 3: the compute's depth axis), the compute's
FracZ_g result becomes the framework layout. dX the same way around the dX compute: dy 5HD /
NDC1HWC0, the weights FracZ_g (FracZ_3D), the ``(N*D, C1, H*W, 16)`` result NCX / NXC; the forward
the same around the forward compute (src and weights in, dst out). So every operator runs on the cube schedules of
both CPU ISAs and the CUDA rule. Types: f16 and bf16 inputs widen exactly to fp32, f32 inputs are
used as they are (the products are fp32 products, not rounded to fp16 first); every sum runs in
fp32 and the result is rounded once to the operator's type T.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

from tvm import te

from ..dsl import attach
from ..dsl.compute import conv2d_backprop_filter_compute, conv2d_backprop_input_compute, conv_compute
from ..dsl.compute.stages import DIFF_SRC, DIFF_WEIGHTS, DST, DY_5HD, FMAP_5HD, SRC_5HD, WEIGHTS_FRACZ
from ..params import FORWARD_OP, INPUT_OP
from ..params.framework import ConvView, FrameworkCall, split_weights
from ..params.onednn import algorithm_choice, backward_data_view, deconv_view, diff_weights_choice, forward_view, onednn_view
from ..params.post_ops import PostOp
from .layouts import as_5hd, as_fracz, data_stage, weight_stage
from .winograd import use_winograd, winograd_data_grad, winograd_filter_grad_result, winograd_forward

__all__ = [
    "PostOp", "conv_transpose_backward_weights", "convolution", "convolution_backprop_data", "convolution_backprop_filters", "convolution_backward_data",
    "convolution_backward_weights",
]  # fmt: skip

_COUT_INNERMOST = ("XIO", "XOI")  # (*K, I, O) / (*K, O, I): the conv view's (k, i, o) in that order
_AS_CONVOLUTION = {"IOX": "OIX", "XOI": "XIO"}  # a deconvolution's weights: the conv view's own, roles swapped


def _conv_view_weight(weights_format: str, *index) -> tuple:
    """``(o, i, taps)`` of the conv view at an index of a weight in ``weights_format``."""
    return split_weights(index, _AS_CONVOLUTION.get(weights_format, weights_format))


def _filter_grad(op: str, x: te.Tensor, dy: te.Tensor, view: ConvView, data_format: str, weights_format: str, shape, kernel_name: str,
                 inputs, bf16_pairs: bool = False, amx: bool = False, algorithm: str = "direct", dw_dtype: str | None = None) -> te.Tensor:  # fmt: skip
    """The dW compute between layout stages: ``x`` / ``dy`` are the conv view's tensors, the
    result has ``shape`` in ``weights_format`` (channels first: ``(o, i, *k)``, else ``(*k, i, o)``
    of the conv view), in ``dw_dtype`` (None: the inputs' type). A bf16 computation carries the
    builder of its bf16-pair form (``bf16_pairs``; ``amx``: in the AMX tile plan's layout), which
    a ``vdpbf16ps`` (AMX) target builds instead."""
    params = view.params(kernel_name)
    if use_winograd(op, algorithm, view, filter_grad=True, planar=data_format == "NCX", pairs=bf16_pairs) and not amx:
        attrs = {"kernel_name": kernel_name, "flops": params.flops, "weights_format": weights_format}
        result = winograd_filter_grad_result(x, dy, view, data_format, weights_format, shape, DIFF_WEIGHTS, attrs, dw_dtype, bf16_pairs)
        return attach(result, params, inputs, FrameworkCall(op, view, data_format, weights_format))
    cout_innermost = weights_format in _COUT_INNERMOST  # the pair tile turned to write rows of it
    dw = conv2d_backprop_filter_compute(as_5hd(x, data_format, FMAP_5HD), as_5hd(dy, data_format, DY_5HD), params, bf16_pairs, cout_innermost, amx,
                                        planar=data_format == "NCX")
    to_oix = partial(_conv_view_weight, weights_format)
    attrs = {"kernel_name": kernel_name, "flops": params.flops, "weights_format": weights_format}
    result = weight_stage(dw, view, shape, to_oix, dw_dtype or view.dtype, DIFF_WEIGHTS, attrs)
    paired = partial(_filter_grad, op, x, dy, view, data_format, weights_format, shape, kernel_name, inputs, True, algorithm=algorithm, dw_dtype=dw_dtype) \
        if _pairs_apply(view, bf16_pairs) else None  # fmt: skip
    return attach(result, params, inputs, FrameworkCall(op, view, data_format, weights_format), paired)


def convolution_backprop_filters(
    input_forward: te.Tensor,
    output_delta: te.Tensor,
    filter_shape: Sequence[int] | None = None,
    *,
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str = "none",
    groups: int = 1,
    data_format: str = "NXC",
    filter_format: str = "XIO",
    filter_shape_attr: Sequence[int] | None = None,
    kernel_name: str = "convolution_backprop_filters",
) -> te.Tensor:
    """``ConvolutionBackpropFilters-1``: the weight gradient of ``output_delta = conv(input_forward, W)``.

    Parameters
    ----------
    input_forward, output_delta : te.Tensor
        x ``[N, *S_in, C_in]`` and dy ``[N, *S_out, C_out]`` (NXC; NCX: channels second),
        1-3 spatial axes, both float32, float16 or bfloat16.
    filter_shape : list | 1-D int array, optional
        The operator's optional input 2: the weight shape in ``filter_format`` (XIO
        ``[*K, C_in/G, C_out]``, OIX ``[C_out, C_in/G, *K]``, OXI ``[C_out, *K, C_in/G]``). It wins over ``filter_shape_attr``,
        the attribute (all zeros = unset); one of them is required.
    strides, dilations : one int >= 1 per spatial axis (dilation 1 = dense).
    pads_begin, pads_end : one int >= 0 per spatial axis; ignored unless ``auto_pad`` is ``none``.
    auto_pad : ``none`` | ``same_upper`` | ``same_lower`` | ``valid`` (any case), from S_in.
    groups : divides C_in and C_out; group g owns output channels ``[g*C_out/G, (g+1)*C_out/G)``.

    Returns
    -------
    te.Tensor
        ``filter_delta`` of the filter shape, in ``filter_format``, the inputs' type.
    """
    view, data_format, filter_format, shape = onednn_view(
        "ConvolutionBackpropFilters",
        {"x": "input_forward", "dy": "output_delta", "shape": "filter_shape", "shape_attr": "filter_shape_attr", "format": "filter_format"},
        input_forward, output_delta, filter_shape, filter_shape_attr, strides, pads_begin, pads_end, dilations,
        auto_pad, groups, data_format, filter_format,
    )  # fmt: skip
    return _filter_grad("ConvolutionBackpropFilters", input_forward, output_delta, view, data_format, filter_format, shape, kernel_name, (input_forward, output_delta))


def convolution_backward_weights(
    src: te.Tensor,
    diff_dst: te.Tensor,
    weights_shape: Sequence[int] | None = None,
    *,
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str = "none",
    groups: int = 1,
    data_format: str = "NXC",
    weights_format: str = "XIO",
    weights_shape_attr: Sequence[int] | None = None,
    kernel_name: str = "convolution_backward_weights",
    algorithm: str = "direct",
    diff_weights_dtype: str | None = None,
) -> te.Tensor:
    """``ConvolutionBackwardWeights``, oneDNN's later name of :func:`convolution_backprop_filters`
    (``src`` = input_forward, ``diff_dst`` = output_delta, ``weights_*`` = ``filter_*``); same
    semantics, returns ``diff_weights``. ``algorithm``: ``"direct"`` (default), ``"winograd"`` or
    ``"auto"`` as for :func:`convolution`: a float32 3x3 dW at stride 1 by F(2x2, 3x3) transposed
    (:mod:`.winograd`). ``diff_weights_dtype``: the result's type, the inputs' T by default, or
    ``"float32"`` for bf16 / f16 inputs (the fp32 sums unrounded: oneDNN's primitive API takes an
    f32 ``diff_weights`` for a bf16 backward, TBE's dW has ``res_dtype`` float32; PyTorch's
    autocast keeps float32 weights)."""
    view, data_format, weights_format, shape = onednn_view(
        "ConvolutionBackwardWeights",
        {"x": "src", "dy": "diff_dst", "shape": "weights_shape", "shape_attr": "weights_shape_attr", "format": "weights_format"},
        src, diff_dst, weights_shape, weights_shape_attr, strides, pads_begin, pads_end, dilations,
        auto_pad, groups, data_format, weights_format,
    )  # fmt: skip
    dw_dtype = diff_weights_choice("ConvolutionBackwardWeights", view.dtype, diff_weights_dtype)
    return _filter_grad("ConvolutionBackwardWeights", src, diff_dst, view, data_format, weights_format, shape, kernel_name, (src, diff_dst),
                        algorithm=algorithm, dw_dtype=dw_dtype)  # fmt: skip


def conv_transpose_backward_weights(
    src: te.Tensor,
    diff_dst: te.Tensor,
    weights_shape: Sequence[int] | None = None,
    *,
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str = "none",
    output_padding: Sequence[int] | None = None,
    groups: int = 1,
    data_format: str = "NXC",
    weights_format: str = "XOI",
    weights_shape_attr: Sequence[int] | None = None,
    kernel_name: str = "conv_transpose_backward_weights",
) -> te.Tensor:
    """``ConvTransposeBackwardWeights``: the weight gradient of ``diff_dst``'s forward
    ``dst = ConvTranspose(src, W)``.

    ``src [N, *S_src, IC]`` and ``diff_dst [N, *S_dst, OC]`` (NXC; NCX channels second);
    weights IOX ``[IC, OC/G, *K]`` (= PyTorch's ``ConvTranspose.weight``) or XOI ``[*K, OC/G, IC]``
    (default); groups fold on I, group outermost. ``S_dst = s*(S_src-1) + (K-1)*d+1 - pb - pe +
    op`` with ``0 <= op < s``; ``output_padding`` (optional, shape check only: it never enters
    the sum) fixes op. auto_pad: the regular-convolution rule on the diff_dst size (oneDNN's
    code). ``dW[g*IC/G + i, o, k] = sum_n sum_h src[n, g*IC/G + i, h] * diff_dst[n, g*OC/G + o,
    h*s - pb + k*d]``: the regular convolution's weight gradient with x = diff_dst, dy = src.

    Returns
    -------
    te.Tensor
        ``diff_weights`` of the weights shape, in ``weights_format``, the inputs' type.
    """
    view, data_format, weights_format, shape = deconv_view(
        "ConvTransposeBackwardWeights", src, diff_dst, weights_shape, weights_shape_attr, strides, pads_begin,
        pads_end, dilations, auto_pad, output_padding, groups, data_format, weights_format,
    )  # fmt: skip
    return _filter_grad("ConvTransposeBackwardWeights", diff_dst, src, view, data_format, weights_format, shape, kernel_name, (src, diff_dst))



def _data_grad(op: str, dy: te.Tensor, weights: te.Tensor, view: ConvView, data_format: str, weights_format: str, shape, kernel_name: str,
               bf16_pairs: bool = False, amx: bool = False, algorithm: str = "direct") -> te.Tensor:  # fmt: skip
    """The dX compute between layout stages: ``dy`` and ``weights`` in the framework layouts, the
    result of ``shape`` in ``data_format``; a bf16 result carries its bf16-pair form (``amx``: a
    2-D cube dX's phases on AMX tiles), which a ``vdpbf16ps`` (AMX) target builds instead."""
    params = view.params(kernel_name, INPUT_OP)
    attrs = {"kernel_name": kernel_name, "flops": params.flops, "data_format": data_format}
    call = FrameworkCall(op, view, data_format, weights_format)
    paired = partial(_data_grad, op, dy, weights, view, data_format, weights_format, shape, kernel_name, True, algorithm=algorithm)
    if use_winograd(op, algorithm, view, input_grad=True, pairs=bf16_pairs) and not amx:  # (an AMX target's dX: its tiles)
        result = winograd_data_grad(dy, weights, view, data_format, weights_format, shape, DIFF_SRC, attrs, pairs=bf16_pairs)
        return attach(result, params, (dy, weights), call, _auto_pairs(op, algorithm, view, bf16_pairs, paired))
    fracz = as_fracz(weights, view, weights_format, WEIGHTS_FRACZ)
    dx = conv2d_backprop_input_compute(fracz, as_5hd(dy, data_format, DY_5HD), params, bf16_pairs=bf16_pairs, planar=data_format == "NCX", amx=amx)
    result = data_stage(dx, view, shape, data_format, view.dtype, DIFF_SRC, attrs)
    return attach(result, params, (dy, weights), call, paired if _pairs_apply(view, bf16_pairs) else None)


def _auto_pairs(op: str, algorithm: str, view: ConvView, built_in_pairs: bool, paired):
    """The bf16-pair form of a bf16 result built by F(2x2, 3x3) on the exact path: ``paired`` for
    ``"auto"`` (a ``vdpbf16ps`` target builds its own choice, :func:`.winograd.paired_winograd`),
    none for ``"winograd"`` (asked for by name: the exact F(2x2, 3x3) on every target)."""
    return paired if _pairs_apply(view, built_in_pairs) and algorithm_choice(op, algorithm) == "auto" else None


def _pairs_apply(view: ConvView, built_in_pairs: bool) -> bool:
    """Whether a result built as fp32 sums has a bf16-pair form to offer (bf16 operators only)."""
    return view.dtype == "bfloat16" and not built_in_pairs


def convolution_backward_data(
    diff_dst: te.Tensor,
    weights: te.Tensor,
    dst_shape: Sequence[int] | None = None,
    *,
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str = "none",
    output_padding: Sequence[int] | None = None,
    groups: int = 1,
    data_format: str = "NXC",
    weights_format: str = "XIO",
    dst_shape_attr: Sequence[int] | None = None,
    kernel_name: str = "convolution_backward_data",
    algorithm: str = "direct",
) -> te.Tensor:
    """``ConvolutionBackwardData``: the input gradient ``diff_src`` of ``dst = conv(src, W)``.

    ``dX[n, g*ICg + i, p*s - pb + k*d] += diff_dst[n, g*OCg + o, p] * W[g*OCg + o, i, k]`` over every
    output position ``p`` and tap ``k`` (positions outside diff_src dropped).

    Parameters
    ----------
    diff_dst : te.Tensor
        ``[N, *S_out, C_out]`` (NXC; NCX: channels second), 1-3 spatial axes, float32, float16
        or bfloat16.
    weights : te.Tensor
        The forward weight, XIO ``[*K, C_in/G, C_out]``, OIX ``[C_out, C_in/G, *K]`` or OXI
        ``[C_out, *K, C_in/G]``, the same type.
    dst_shape : list | 1-D int array, optional
        The operator's optional input 2: the diff_src shape in ``data_format`` (oneDNN names it
        ``dst_shape``: the op's output). It wins over ``dst_shape_attr`` (all zeros = unset);
        without both, ``S_in = s*(S_out-1) + (K-1)*d+1 - pb - pe + output_padding`` (explicit pads).
    strides, dilations, pads_begin, pads_end, auto_pad, groups : as :func:`convolution_backprop_filters`;
        auto_pad derives the pads from the diff_src size (oneDNN's forward rule), so it needs the shape.
    output_padding : one int per spatial axis, each ``< stride`` (default 0): the extra rows the
        formula above adds; with a given shape, checked against it.
    algorithm : ``"direct"`` (default), ``"winograd"`` or ``"auto"`` (oneDNN's algorithm kinds): a
        float32 3x3 dX at stride 1 by Winograd's F(2x2, 3x3), where it applies (``"auto"``: and
        pays), see :mod:`.winograd`.

    Returns
    -------
    te.Tensor
        ``diff_src`` in ``data_format``, the inputs' type (sums in float32, rounded once).
    """
    view, data_format, weights_format, shape = backward_data_view(
        "ConvolutionBackwardData",
        {"dy": "diff_dst", "w": "weights", "shape": "dst_shape", "shape_attr": "dst_shape_attr", "format": "weights_format"},
        diff_dst, weights, dst_shape, dst_shape_attr, strides, pads_begin, pads_end, dilations, auto_pad, output_padding,
        groups, data_format, weights_format,
    )  # fmt: skip
    return _data_grad("ConvolutionBackwardData", diff_dst, weights, view, data_format, weights_format, shape, kernel_name, algorithm=algorithm)


def convolution_backprop_data(
    output_delta: te.Tensor,
    filter: te.Tensor,  # noqa: A002 - the operator's own name
    output_shape: Sequence[int] | None = None,
    *,
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str = "none",
    output_padding: Sequence[int] | None = None,
    groups: int = 1,
    data_format: str = "NXC",
    filter_format: str = "XIO",
    output_shape_attr: Sequence[int] | None = None,
    kernel_name: str = "convolution_backprop_data",
) -> te.Tensor:
    """``ConvolutionBackpropData``, the older name of :func:`convolution_backward_data`
    (``output_delta`` = diff_dst, ``filter`` = weights, ``output_shape`` = dst_shape,
    ``filter_format`` = weights_format); same semantics, returns ``input_delta``."""
    view, data_format, filter_format, shape = backward_data_view(
        "ConvolutionBackpropData",
        {"dy": "output_delta", "w": "filter", "shape": "output_shape", "shape_attr": "output_shape_attr", "format": "filter_format"},
        output_delta, filter, output_shape, output_shape_attr, strides, pads_begin, pads_end, dilations, auto_pad,
        output_padding, groups, data_format, filter_format,
    )  # fmt: skip
    return _data_grad("ConvolutionBackpropData", output_delta, filter, view, data_format, filter_format, shape, kernel_name)


def convolution(
    src: te.Tensor,
    weights: te.Tensor,
    bias: te.Tensor | None = None,
    *,
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str = "none",
    groups: int = 1,
    data_format: str = "NXC",
    weights_format: str = "XIO",
    post_ops: Sequence[PostOp] | None = None,
    kernel_name: str = "convolution",
    algorithm: str = "direct",
) -> te.Tensor:
    """``Convolution``: ``dst[n, g*OCg + o, p] = sum_{i, k} src[n, g*ICg + i, p*s - pb + k*d] *
    W[g*OCg + o, i, k] (+ bias[g*OCg + o])``, src read as 0 outside its extent.

    Parameters
    ----------
    src : te.Tensor
        ``[N, *S_in, IC]`` (NXC; NCX: channels second), 1-3 spatial axes, float32, float16 or
        bfloat16.
    weights : te.Tensor
        XIO ``[*K, IC/G, OC]``, OIX ``[OC, IC/G, *K]`` or OXI ``[OC, *K, IC/G]``, the same type.
    bias : te.Tensor, optional
        ``[OC]``, the same type.
    strides, dilations, pads_begin, pads_end, auto_pad, groups : as
        :func:`convolution_backprop_filters`; auto_pad derives the pads from ``S_in``.
    post_ops : list of PostOp, optional
        oneDNN's post-ops (:mod:`tvm_convgrad.params.post_ops`), applied in order to each dst
        value's fp32 sums (after the bias) as it is written out: ``PostOp.eltwise("relu")``,
        ``PostOp.binary("add", residual)`` (a ``te.Tensor`` broadcast to dst's shape), ... A binary
        one's ``src1`` is an input of the kernel, after ``bias``.
    algorithm : ``"direct"`` (default), ``"winograd"`` or ``"auto"`` (oneDNN's algorithm kinds): a
        float32 3x3 at stride 1 without post-ops by Winograd's F(2x2, 3x3), where it applies
        (``"auto"``: and pays), see :mod:`.winograd`.

    Returns
    -------
    te.Tensor
        ``dst`` ``[N, *S_out, OC]`` (NCX: channels second), ``S_out = floor((S_in + pb + pe -
        (K-1)*d - 1) / s) + 1``, the inputs' type (sums in float32, the bias added to them, the
        post-ops applied, rounded once).
    """
    view, data_format, weights_format, shape, post_ops = forward_view(
        "Convolution", src, weights, bias, strides, pads_begin, pads_end, dilations, auto_pad, groups, data_format, weights_format, post_ops
    )
    return _forward("Convolution", src, weights, bias, view, data_format, weights_format, shape, kernel_name, post_ops, algorithm=algorithm)


def _forward(op: str, src: te.Tensor, weights: te.Tensor, bias: te.Tensor | None, view: ConvView, data_format: str, weights_format: str,
             shape, kernel_name: str, post_ops: tuple[PostOp, ...], bf16_pairs: bool = False, amx: bool = False,
             algorithm: str = "direct") -> te.Tensor:  # fmt: skip
    """The forward compute between layout stages: src 5HD (NDC1HWC0), the weights FracZ_g
    (FracZ_3D), the ``(N*Do, C1, Ho, Wo, 16)`` result as ``dst`` of ``shape`` in ``data_format``,
    each value through ``post_ops`` as it is written; a bf16 result carries its bf16-pair form
    (no tile plan: ``amx`` is ignored; an AMX target, an Intel core, runs its forward on the exact
    path, see :meth:`tvm_convgrad.compile.Workload.for_target`)."""
    params = view.params(kernel_name, FORWARD_OP)
    attrs = {"kernel_name": kernel_name, "flops": params.flops, "data_format": data_format}
    inputs = (src, weights) + ((bias,) if bias is not None else ()) + tuple(p.src1 for p in post_ops if p.is_binary)
    call = FrameworkCall(op, view, data_format, weights_format, bias=bias is not None, post_ops=post_ops)
    paired = partial(_forward, op, src, weights, bias, view, data_format, weights_format, shape, kernel_name, post_ops, True, algorithm=algorithm)
    if use_winograd(op, algorithm, view, post_ops=post_ops, pairs=bf16_pairs):
        y = winograd_forward(src, weights, bias, view, data_format, weights_format, shape, DST, attrs, pairs=bf16_pairs)
        return attach(y, params, inputs, call, _auto_pairs(op, algorithm, view, bf16_pairs, paired))
    fracz = as_fracz(weights, view, weights_format, WEIGHTS_FRACZ)
    y = conv_compute(as_5hd(src, data_format, SRC_5HD), fracz, params, bias, rows_and_columns=True, bf16_pairs=bf16_pairs, planar=data_format == "NCX")
    result = data_stage(y, view, shape, data_format, view.dtype, DST, attrs, post_ops)
    return attach(result, params, inputs, call, paired if _pairs_apply(view, bf16_pairs) else None)
