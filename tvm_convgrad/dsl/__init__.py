"""TBE's conv-gradient DSL (``tbe.dsl``) on TVM: exact signatures, ``para_dict`` keys and defaults.

Both functions validate their arguments (raising :class:`~tvm_convgrad.ConvGradError`) and
return the result ``te.Tensor``. Build it with :func:`tvm_convgrad.build` (arguments in TBE
order: inputs, then the result) or put it in your own ``te.create_prim_func`` list.

* ``conv2d_backprop_filter(input_x, out_backprop, filter_sizes, para_dict)``: 5HD x and dy
  (float16) -> dW ``(real_g, cin1_g*KH*KW, cout_g, 16)`` in ``res_dtype`` (float32).
* ``conv2d_backprop_input(filters, out_backprop, filter_sizes, input_sizes, para_dict)``: FracZ(_g)
  forward weight and 5HD dy (float16) -> dX ``(N, ceil(Cin,16), H*W, 16)`` in ``res_dtype``
  (float16), the memory of 5HD ``input_sizes``.
* ``conv(data, weight, para_dict, optim_dict=None, dsl_flag=True)``: the forward convolution on a
  5HD fmap and a FracZ(_g) weight (float16) -> ``(N, ceil(Cout,16), Ho*Wo, 16)`` float16.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from tvm import te

from ..params import ConvGradParams, filter_grad_params, input_grad_params
from ..params.framework import FrameworkCall
from ..params.tbe_conv import conv_params
from . import compute
from .compute import conv2d_backprop_filter_compute, conv2d_backprop_input_compute, conv_compute

__all__ = ["attach", "bf16_pairs_form", "conv", "conv2d_backprop_filter", "conv2d_backprop_input", "compute", "framework_call", "result_info"]


def attach(result: te.Tensor, params: ConvGradParams, inputs: Sequence[te.Tensor], call: FrameworkCall | None = None,
           bf16_pairs: Callable[..., te.Tensor] | None = None) -> te.Tensor:  # fmt: skip
    """Remember on the returned tensor what :func:`tvm_convgrad.build` needs (params, arg order),
    for a framework operator its call (:class:`~tvm_convgrad.params.framework.FrameworkCall`),
    and for a bf16 gradient the builder of its bf16-pair form (the same result from the same
    inputs, the mads on :mod:`.compute.pairs`: what a ``vdpbf16ps`` target compiles)."""
    result.convgrad_params = params
    result.convgrad_inputs = tuple(inputs)
    result.convgrad_call = call
    result.convgrad_bf16_pairs = bf16_pairs
    return result


def bf16_pairs_form(result: te.Tensor) -> Callable[..., te.Tensor] | None:
    """The builder of a result's bf16-pair form (see :func:`attach`), None where it has none."""
    return getattr(result, "convgrad_bf16_pairs", None)


def framework_call(result: te.Tensor) -> FrameworkCall | None:
    """The framework operator's call a result tensor was made by (None for the TBE DSL's)."""
    return getattr(result, "convgrad_call", None)


def result_info(result: te.Tensor) -> tuple[ConvGradParams, tuple[te.Tensor, ...]] | None:
    """``(params, inputs in argument order)`` of a tensor returned by this module, else None."""
    params = getattr(result, "convgrad_params", None)
    return None if params is None else (params, result.convgrad_inputs)


def conv2d_backprop_filter(
    input_x: te.Tensor, out_backprop: te.Tensor, filter_sizes: Sequence[int], para_dict: dict[str, Any]
) -> te.Tensor:
    """Weight gradient of a 2-D convolution (TBE ``tbe.dsl.conv2d_backprop_filter``).

    Parameters
    ----------
    input_x : te.Tensor
        Forward feature map x, 5HD ``(N, ceil(Cin,16), H, W, 16)`` float16.
    out_backprop : te.Tensor
        dy, 5HD ``(N, ceil(Cout,16), Ho, Wo, 16)`` float16.
    filter_sizes : list | tuple
        ``[Cout, Cin_g, KH, KW]``: the NCHW weight shape, Cin per group.
    para_dict : dict
        ``strides`` ``[sh, sw]`` (default ``[1, 1]``), ``padding`` ``[top, bottom, left, right]``
        (``[0, 0, 0, 0]``), ``dilations`` ``[1, 1, dh, dw]`` (``[1, 1, 1, 1]``), ``groups`` (1),
        ``res_dtype`` (``"float32"``; ``"float16"`` rounds the fp32 sums), ``kernel_name``
        (``"conv2d_backprop_filter_cce"``, the compiled function's symbol).

    Returns
    -------
    te.Tensor
        ``(real_g, cin1_g*KH*KW, cout_g, 16)``: row ``c1*KH*KW + kh*KW + kw`` of extended group
        ``g``, column ``co`` (Cout of that group, padded to 16), lane ``ci0``. Its memory order
        is FracZ_g; :func:`tvm_convgrad.layout.dw_result_to_oihw` gives OIHW.
    """
    params = filter_grad_params(input_x, out_backprop, filter_sizes, para_dict)
    result = conv2d_backprop_filter_compute(input_x, out_backprop, params)
    return attach(result, params, (input_x, out_backprop))


def conv2d_backprop_input(
    filters: te.Tensor,
    out_backprop: te.Tensor,
    filter_sizes: Sequence[int],
    input_sizes: Sequence[int],
    para_dict: dict[str, Any],
) -> te.Tensor:
    """Input gradient of a 2-D convolution (TBE ``tbe.dsl.conv2d_backprop_input``).

    Parameters
    ----------
    filters : te.Tensor
        The forward weight in FracZ(_g): ``(g_extend*dx_c1_extend*KH*KW, dy_c1_extend, 16, 16)`` float16.
    out_backprop : te.Tensor
        dy, 5HD ``(N, ceil(Cout,16), Ho, Wo, 16)`` float16.
    filter_sizes : list | tuple
        ``[Cout, Cin_g, KH, KW]``.
    input_sizes : list | tuple
        ``[N, Cin, H, W]``: the shape of dX (all groups).
    para_dict : dict
        Required ``strides`` ``[sh, sw]``, ``padding`` ``[up, down, left, right]``, ``dilations``
        ``[1, 1, dh, dw]``; optional ``res_dtype`` (``"float16"``), ``offset_x`` (0), ``offset_w``
        (must be None), ``kernel_name`` (``"conv2d_backprop_input_cce"``), ``group_dict``
        (checked against what the shapes imply; computed from ``input_sizes[1] / filter_sizes[1]``
        when absent, see :func:`cube_util.calculate_group`), ``tensor_bias`` (a ``(Cin,)`` tensor
        added before the final cast).

    Returns
    -------
    te.Tensor
        ``(N, ceil(Cin,16), H*W, 16)`` in ``res_dtype``: the memory of 5HD ``(N, C1, H, W, 16)``.
    """
    params = input_grad_params(filters, out_backprop, filter_sizes, input_sizes, para_dict)
    bias = para_dict.get("tensor_bias")
    result = conv2d_backprop_input_compute(filters, out_backprop, params, bias)
    return attach(result, params, (filters, out_backprop) + ((bias,) if bias is not None else ()))


def conv(data: te.Tensor, weight: te.Tensor, para_dict: dict[str, Any], optim_dict: dict[str, Any] | None = None,
         dsl_flag: bool = True) -> te.Tensor:  # fmt: skip
    """The forward convolution (TBE ``tbe.dsl.compute.conv_compute.conv``).

    Parameters
    ----------
    data : te.Tensor
        The fmap x, 5HD ``(N, ceil(Cin,16), H, W, 16)`` float16.
    weight : te.Tensor
        FracZ(_g) ``(group_opt*c1_opt*KH*KW, cout1_opt, 16 (Cout0), 16 (Cin0))`` float16 (group 1:
        ``(C1*KH*KW, ceil(Cout,16), 16, 16)``).
    para_dict : dict
        ``pad_h`` / ``pad_w`` (int or ``[begin, end]``), ``stride_h`` / ``stride_w``, ``filter_h`` /
        ``filter_w`` required; ``dilate_h`` / ``dilate_w`` (1), ``mad_dtype`` (``"float32"``),
        ``offset_x`` (0), ``kernel_name`` (``"conv2d"``), ``bias_tensor`` (``(Cout,)`` or
        ``(align(Cout,16),)``, added to the fp32 sums), the group fields ``group``,
        ``weight_ori_shape_nchw``, ``group_opt``, ``c1_opt``, ``cout1_opt``, ``a_shape``; TBE's
        older spellings (``padh``, ``strideh``, ``dilateh``, ``filterh``, ...) too. Every key and its
        rule: :mod:`tvm_convgrad.params.tbe_conv`.
    optim_dict : dict, optional
        ``{"c0_optim_flg": False}`` (the C0 = 4 optimization is not implemented).
    dsl_flag : bool
        TBE's fusion flag; the result is the same either way.

    Returns
    -------
    te.Tensor
        ``C``: ``(N, ceil(Cout,16), Ho*Wo, 16)`` float16 (tag ``convolution_C``, attribute
        ``width_out``), the memory of 5HD ``(N, C1, Ho, Wo, 16)``.
    """
    params = conv_params(data, weight, para_dict, optim_dict, dsl_flag)
    bias = para_dict.get("bias_tensor")
    result = conv_compute(data, weight, params, bias)
    return attach(result, params, (data, weight) + ((bias,) if bias is not None else ()))
